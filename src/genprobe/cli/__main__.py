"""``python -m genprobe`` = the ``genprobe`` command."""

import sys

from . import main

sys.exit(main())
