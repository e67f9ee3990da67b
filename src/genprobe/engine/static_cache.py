"""Old import path of :mod:`genprobe.engine.fast.static_cache` (moved there, issue #29): this name is that module.

Aliased in ``sys.modules``, not re-exported: both names are one module object, so module state and
monkeypatching are shared.
"""

import sys
from typing import TYPE_CHECKING

from .fast import static_cache as _moved

if TYPE_CHECKING:  # what a type checker sees of this name (it does not follow the alias below)
    from .fast.static_cache import *  # noqa: F403

sys.modules[__name__] = _moved
