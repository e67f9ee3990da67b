"""Old import path of :mod:`genprobe.engine.fast.compiled` (moved there, issue #29): this name is that module.

Aliased in ``sys.modules``, not re-exported: ``genprobe.engine.compiled`` and ``genprobe.engine.fast.compiled`` are one
module object, so module state (caches, flags) and monkeypatching are shared.
"""

import sys
from typing import TYPE_CHECKING

from .fast import compiled as _moved

if TYPE_CHECKING:  # what a type checker sees of this name (it does not follow the alias below)
    from .fast.compiled import *  # noqa: F403

sys.modules[__name__] = _moved
