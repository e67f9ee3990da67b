"""Uncached logits of whatever the loop tools are handed (:func:`forward_logits`) and the right-padded batches they
read (:func:`pad_right`); where the MLPs are is the model's (:mod:`genprobe.model.arch`)."""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn as nn

from ..model.gpt import GPT


def forward_logits(model: Any, ids: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Uncached logits (B, T, V) for our GPT, a runner (``.full``), or a ``transformers`` causal LM."""
    if isinstance(model, GPT):
        return model(ids, attention_mask=valid)
    if hasattr(model, "full") and not isinstance(model, nn.Module):
        v = valid if valid is not None else torch.ones_like(ids, dtype=torch.bool)
        return model.full(ids, v)
    # no cache: one full forward (and the layers below an edit may be skipped, see regress.FrozenPrefix)
    out = model(input_ids=ids, attention_mask=None if valid is None else valid.long(), use_cache=False)
    return out.logits if hasattr(out, "logits") else out[0]


def pad_right(seqs: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows right-padded to one width, and the mask of real tokens: a causal model's logits at real positions
    never see the padding after them, so positions stay 0, 1, … as in training."""
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        valid[i, : len(s)] = True
    return ids, valid
