"""``python -m genprobe`` = the ``genprobe`` command."""

import sys

from .cli import main

sys.exit(main())
