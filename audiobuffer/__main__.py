"""``python -m audiobuffer`` is the ``audiobuffer`` command."""

import sys

from .cli import main

sys.exit(main())
