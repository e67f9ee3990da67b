"""Uncached logits of whatever the loop tools are handed (:func:`forward_logits`); where the MLPs are is the model's
(:mod:`genprobe.model.arch`)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from ..model.gpt import GPT

__all__ = ["forward_logits"]


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
