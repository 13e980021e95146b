"""``python -m audiobuffer`` is the ``audiobuffer`` command."""

import sys

from .tools.cli import main

sys.exit(main())
