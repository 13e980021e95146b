"""``python -m audiobuffer`` is the ``audiobuffer`` command."""

import sys

from .cli.main import main

sys.exit(main())
