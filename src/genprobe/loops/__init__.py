"""Loop observatory and directional repair: scan, contrast, direction, locate, edit, patch.

The repair follows the article 《大模型推理死循环的定点修复机制》 ("A targeted fix for inference loops
in large models"): find a loop direction, edit a few MLP down-projection columns, check the cost.
"""

from ..model.arch import MLPSite, get_columns, mlp_sites, set_columns, state_sha256
from .arch import forward_logits
from .edit import FORMS, EditSpec, column_scores, edit_columns, make_patch, select_columns
from .hooks import ablate, capture, remove_direction
from .patch import Patch, PatchError, PatchTarget, apply_patch, finalise, load_patch, revert_patch, save_patch

__all__ = [
    "FORMS",
    "EditSpec",
    "MLPSite",
    "Patch",
    "PatchError",
    "PatchTarget",
    "ablate",
    "apply_patch",
    "capture",
    "column_scores",
    "edit_columns",
    "finalise",
    "forward_logits",
    "get_columns",
    "load_patch",
    "make_patch",
    "mlp_sites",
    "remove_direction",
    "revert_patch",
    "save_patch",
    "select_columns",
    "set_columns",
    "state_sha256",
]
