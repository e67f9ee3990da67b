"""Sliding-window attention (with optional attention sinks) as full recomputation: the windowed reference.

Definition (Mistral's sliding window, transformers ``masking_utils.sliding_window_overlay``; sinks as
in StreamingLLM, Xiao et al. 2023): a query at position q sees a key at position k iff k ≤ q and
(q − k < W or k < S) — the W most recent positions including itself, plus the first S positions.
Positions count real tokens, so under left padding the sinks are a row's first S *real* tokens.

The mask applies in every layer, so a key's hidden state is the one computed with *its own* window —
exactly what a cache holds. Recomputing the visible tokens alone would be a different (wrong)
reference for a model of more than one layer.
"""

from __future__ import annotations

import torch

from ..model.gpt import GPT
from ..model.position_lm import default_positions


def window_visibility(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int, sinks: int = 0) -> torch.Tensor:
    """(B, Tq, Tk) bool: causal, within the last ``window`` positions, or one of the first ``sinks``."""
    dist = q_pos[:, :, None] - k_pos[:, None, :]
    return (dist >= 0) & ((dist < window) | (k_pos[:, None, :] < sinks))


@torch.no_grad()
def windowed_forward(
    model: GPT, ids: torch.Tensor, window: int, sinks: int = 0, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Logits (B, T, V) of ``model`` with a sliding-window(+sinks) mask in every layer, no cache."""
    B, T = ids.shape
    valid = None if attention_mask is None else attention_mask.to(torch.bool)
    positions = default_positions(B, T, None, attention_mask, ids.device)
    model.check_positions(positions)
    model.check_ids(ids)
    vis = window_visibility(positions, positions, window, sinks)
    if valid is not None:
        vis = vis & valid[:, None, :]
        vis = vis | ~vis.any(-1, keepdim=True)  # a padding query that sees nothing: any output, never compared
    mask = vis[:, None]
    if model.alibi_slopes is not None:
        dist = (positions[:, None, :, None] - positions[:, None, None, :]).to(torch.float32)
        bias = -model.alibi_slopes.view(1, -1, 1, 1) * dist.clamp(min=0)
        dtype = model.wte.weight.dtype
        blocked = torch.zeros(mask.shape, dtype=dtype, device=ids.device).masked_fill(~mask, float("-inf"))
        mask = blocked + bias.to(dtype)
    x = model.wte(ids)
    if model.wpe is not None:
        x = x + model.wpe(positions)
    for block in model.h:
        x = block(x, positions, mask, None, None)
    logits: torch.Tensor = model.lm_head(model.ln_f(x))
    return logits
