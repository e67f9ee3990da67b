"""Old import path of :mod:`genprobe.engine.fast.aot` (moved there, issue #29): this name is that module.

Aliased in ``sys.modules``, not re-exported: ``genprobe.engine.aot`` and ``genprobe.engine.fast.aot`` are one
module object, so module state (caches, flags) and monkeypatching are shared.
"""

import sys
from typing import TYPE_CHECKING

from .fast import aot as _moved

if TYPE_CHECKING:  # what a type checker sees of this name (it does not follow the alias below)
    from .fast.aot import *  # noqa: F403

sys.modules[__name__] = _moved
