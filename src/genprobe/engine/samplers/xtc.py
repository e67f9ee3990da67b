"""XTC ("exclude top choices") as llama.cpp implements it (src/llama-sampling.cpp, llama_sample_xtc_apply).

With probability ``probability`` per step and row, every candidate whose probability (softmax of
the current candidates) is ``>= threshold`` is removed — except the least likely of them, so at
least one "top choice" survives. Nothing happens when fewer than two candidates remain, when
``threshold > 0.5`` (two tokens cannot both exceed it), or when fewer than two tokens reach the
threshold. The per-row draw comes from the generation's seeded ``torch.Generator``: same seed,
same removals. Among tokens of equal probability the higher id counts as the less likely (a
stable descending sort), where llama.cpp leaves the order to ``std::partial_sort``.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def xtc_draws(batch: int, generator: torch.Generator | None) -> torch.Tensor:
    """One uniform [0, 1) draw per row (raises without a generator: XTC must be reproducible)."""
    if generator is None:
        raise ValueError("XTC draws a random number per step: pass the generation's torch.Generator")
    return torch.rand(batch, generator=generator, device=generator.device)


def xtc(logits: torch.Tensor, probability: float, threshold: float, draws: torch.Tensor) -> torch.Tensor:
    """Remove the above-threshold candidates but the least likely, in rows whose draw is <= ``probability``."""
    if probability <= 0 or threshold > 0.5:
        return logits
    probs = torch.softmax(logits, dim=-1)
    sp, idx = torch.sort(probs, dim=-1, descending=True, stable=True)
    above = sp >= threshold  # a prefix of the sorted row
    n_above = above.sum(-1, keepdim=True)
    rank = torch.arange(logits.shape[-1], device=logits.device)
    remove_sorted = rank < (n_above - 1)  # all above-threshold ranks except the last of them
    active = (draws.to(logits.device) <= probability) & (torch.isfinite(logits).sum(-1) >= 2)
    remove_sorted &= active[:, None]
    remove = torch.zeros_like(remove_sorted).scatter_(-1, idx, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)
