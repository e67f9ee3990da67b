"""Compare what a backend returned (top-k log-probabilities, or every row) with float32 recomputation.

For a request with prompt ids ``p`` (length P) and generated ids ``g``, the reference computes ``log_softmax`` of
one uncached forward over ``p + g`` in float32 (:class:`ReferenceLogprobs`); row t predicts token t + 1. Every id
returned at a position (its top-k plus the actual token) is compared. Top-1 agreement tolerates float-noise ties:
the served top token agrees when the reference gives it a log-probability within ``tie`` of the reference's maximum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..engine.runner import runner_for


@dataclass
class Divergence:
    """The first position where the backend and the reference differ beyond float noise (or in their top-1 token)."""

    request: int  # index of the request within its phase
    where: str  # "prompt" (predicting prompt token ``index``) | "step" (generation step ``index``)
    index: int
    abs_dlogp: float
    top1_mismatch: bool


@dataclass
class LogprobStats:
    """Accumulated differences over the positions of one or more requests."""

    positions: int = 0
    compared: int = 0  # (position, id) pairs
    max_abs_dlogp: float = 0.0
    sum_abs_dlogp: float = 0.0
    top1_disagreements: int = 0
    first: Divergence | None = None

    @property
    def top1_agreement(self) -> float | None:
        """Fraction of positions whose top-1 token agrees (None when nothing was compared)."""
        return None if not self.positions else 1.0 - self.top1_disagreements / self.positions

    @property
    def mean_abs_dlogp(self) -> float | None:
        """Mean |Δ log p| over all compared ids."""
        return None if not self.compared else self.sum_abs_dlogp / self.compared


def compare_values(
    stats: LogprobStats,
    ids: list[int] | None,
    lps: torch.Tensor,
    top: int,
    ref_row: torch.Tensor,
    req: int,
    where: str,
    index: int,
    noise: float,
    tie: float,
) -> float:
    """Add one position to ``stats``: the served log-probabilities ``lps`` of ``ids`` (None: the whole vocabulary;
    ``top``: the served top-1 id) against the reference row; the position's max |Δ log p| (both -inf counts as
    equal, NaN as infinite)."""
    ref = (ref_row if ids is None else ref_row[ids]).double()
    served = lps.double()
    diff = torch.where(torch.isneginf(ref) & torch.isneginf(served), torch.zeros_like(ref), (served - ref).abs())
    diff = torch.nan_to_num(diff, nan=float("inf"))
    mx = float(diff.max())
    mismatch = bool(ref_row[top] < ref_row.max() - tie)
    stats.positions += 1
    stats.compared += diff.numel()
    stats.sum_abs_dlogp += float(diff.sum()) if mx != float("inf") else float("inf")
    stats.max_abs_dlogp = max(stats.max_abs_dlogp, mx)
    stats.top1_disagreements += int(mismatch)
    if stats.first is None and (mx >= noise or mismatch):
        stats.first = Divergence(req, where, index, mx, mismatch)
    return mx


class ReferenceLogprobs:
    """``log_softmax`` (in float32) of one uncached forward of a loaded ``Model`` in its own dtype — float32, or the
    deployment's reduced precision for the floor (:mod:`genprobe.serving.precision`) — memoised per sequence."""

    def __init__(self, model: Any):
        self.model = model
        self.runner = runner_for(model)
        self.vocab_size = int(model.vocab_size)
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, ids: Sequence[int]) -> torch.Tensor:
        """(len(ids), V) log-probabilities (float32 tensor); row t predicts token t + 1."""
        key = tuple(int(i) for i in ids)
        if key not in self._cache:
            x = torch.tensor([key], dtype=torch.long)
            with torch.inference_mode():
                logits = self.runner.full(x, torch.ones_like(x, dtype=torch.bool))[0]
            self._cache[key] = torch.log_softmax(logits.float(), dim=-1)
        return self._cache[key]
