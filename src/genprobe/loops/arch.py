"""Uncached logits of whatever the loop tools are handed (:func:`forward_logits`).

Where the MLPs are moved to :mod:`genprobe.model.arch` (a model's layout belongs to the model layer); this
module re-exports it so ``genprobe.loops.arch`` imports keep working.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from ..model.arch import (
    DOWN_NAMES,
    LAYER_PATHS,
    MLPSite,
    UnsupportedArchitectureError,
    all_columns,
    count_parameters,
    get_columns,
    mlp_sites,
    set_columns,
    state_sha256,
    unwrap,
)
from ..model.gpt import GPT

__all__ = [
    "DOWN_NAMES",
    "LAYER_PATHS",
    "MLPSite",
    "UnsupportedArchitectureError",
    "all_columns",
    "count_parameters",
    "forward_logits",
    "get_columns",
    "mlp_sites",
    "set_columns",
    "state_sha256",
    "unwrap",
]


def forward_logits(model: Any, ids: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Uncached logits (B, T, V) for our GPT, a runner (``.full``), or a ``transformers`` causal LM."""
    if isinstance(model, GPT):
        return model(ids, attention_mask=valid)
    if hasattr(model, "full") and not isinstance(model, nn.Module):
        v = valid if valid is not None else torch.ones_like(ids, dtype=torch.bool)
        return model.full(ids, v)
    # no cache: one full forward (and the layers below an edit may be skipped, see loops/prefix.py)
    out = model(input_ids=ids, attention_mask=None if valid is None else valid.long(), use_cache=False)
    return out.logits if hasattr(out, "logits") else out[0]
