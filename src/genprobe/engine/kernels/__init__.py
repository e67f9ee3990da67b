"""Old import path of :mod:`genprobe.engine.fast.kernels` (moved there, issue #29): this name is that package.

Aliased in ``sys.modules`` with its submodules, not re-exported: ``genprobe.engine.kernels.build`` and
``genprobe.engine.fast.kernels.build`` are one module object (one load status, one set of registered ops).
"""

import sys
from typing import TYPE_CHECKING

from ..fast import kernels as _moved
from ..fast.kernels import build as _build
from ..fast.kernels import inductor_pass as _inductor_pass

if TYPE_CHECKING:  # what a type checker sees of this name (it does not follow the aliases below)
    from ..fast.kernels import *  # noqa: F403

sys.modules[__name__ + ".build"] = _build
sys.modules[__name__ + ".inductor_pass"] = _inductor_pass
sys.modules[__name__] = _moved
