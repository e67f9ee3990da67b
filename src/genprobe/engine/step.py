"""``forward_step``: the single entry point for prefill, decode, chunked prefill and verification."""

from __future__ import annotations

import torch

from ..model.cache_protocol import CacheLike
from ..model.gpt import GPT


def forward_step(
    model: GPT,
    ids: torch.Tensor,
    cache: CacheLike | None = None,
    positions: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run ``ids`` (B, T) through the model's one forward; returns logits (B, T, V).

    Positions default to the cache's per-row count + ``arange(T)``. ``attention_mask`` may cover just
    the new tokens (B, T) or, HF style, the whole sequence so far (B, past + T); only the last T
    columns are new information. Overflowing the position table raises ``ValueError`` before any
    embedding lookup.
    """
    if ids.dim() == 1:
        ids = ids[None, :]
    T = ids.shape[1]
    if attention_mask is not None:
        if attention_mask.dim() != 2 or attention_mask.shape[0] != ids.shape[0] or attention_mask.shape[1] < T:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} incompatible with ids {tuple(ids.shape)}"
            )
        attention_mask = attention_mask[:, -T:]
    logits: torch.Tensor = model(ids, positions=positions, cache=cache, attention_mask=attention_mask)
    return logits
