"""Compare what vLLM returned (top-k log-probabilities per position) with float32 recomputation.

For a request with prompt ids ``p`` (length P) and generated ids ``g``, the reference computes
``log_softmax`` of one uncached forward over ``p + g`` in float32. vLLM's ``prompt_logprobs[i]``
(i ≥ 1) is the distribution that predicts prompt token i, i.e. reference row ``i - 1``; its
``logprobs[s]`` is the distribution of generation step s, reference row ``P - 1 + s``. Every id vLLM
returned at a position (its top-k plus the actual token) is compared.

Top-1 agreement tolerates float-noise ties: vLLM's top token agrees when the reference gives it a
log-probability within ``tie`` of the reference's maximum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..engine.runner import runner_for


@dataclass
class Divergence:
    """The first position where vLLM and the reference differ beyond float noise (or in their top-1 token)."""

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
    per_request_max: list[float] = field(default_factory=list)

    @property
    def top1_agreement(self) -> float | None:
        """Fraction of positions whose top-1 token agrees (None when nothing was compared)."""
        return None if not self.positions else 1.0 - self.top1_disagreements / self.positions

    @property
    def mean_abs_dlogp(self) -> float | None:
        """Mean |Δ log p| over all compared ids."""
        return None if not self.compared else self.sum_abs_dlogp / self.compared


def _entries(d: dict) -> tuple[list[int], list[float], int]:
    """(ids, vLLM logprobs, vLLM's rank-1 id) of one position's ``{id: Logprob}`` dict."""
    ids = [int(t) for t in d]
    lps = [float(v.logprob) for v in d.values()]
    ranks = [getattr(v, "rank", None) for v in d.values()]
    known = [(r, i) for r, i in zip(ranks, ids, strict=True) if r is not None]
    top = min(known)[1] if known else ids[max(range(len(ids)), key=lps.__getitem__)]
    return ids, lps, top


def _compare_position(
    stats: LogprobStats, d: dict, ref_row: torch.Tensor, req: int, where: str, index: int, noise: float, tie: float
) -> float:
    ids, lps, top = _entries(d)
    return compare_values(stats, ids, lps, top, ref_row, req, where, index, noise, tie)


def compare_values(
    stats: LogprobStats,
    ids: list[int],
    lps: list[float],
    top: int,
    ref_row: torch.Tensor,
    req: int,
    where: str,
    index: int,
    noise: float,
    tie: float,
) -> float:
    """Add one position to ``stats``: the served log-probabilities ``lps`` of ``ids`` (``top``: the served top-1
    id) against the reference row; the position's max |Δ log p| (both -inf counts as equal, NaN as infinite)."""
    ref = ref_row[ids].double()
    diff = (torch.tensor(lps, dtype=torch.float64) - ref).abs()
    both_neg_inf = torch.isneginf(ref) & torch.isneginf(torch.tensor(lps, dtype=torch.float64))
    diff = torch.where(both_neg_inf, torch.zeros_like(diff), diff)
    diff = torch.nan_to_num(diff, nan=float("inf"))
    mx = float(diff.max())
    mismatch = bool(ref_row[top] < ref_row.max() - tie)
    stats.positions += 1
    stats.compared += len(ids)
    stats.sum_abs_dlogp += float(diff.sum()) if mx != float("inf") else float("inf")
    stats.max_abs_dlogp = max(stats.max_abs_dlogp, mx)
    stats.top1_disagreements += int(mismatch)
    if stats.first is None and (mx >= noise or mismatch):
        stats.first = Divergence(req, where, index, mx, mismatch)
    return mx


def returned_positions(output: Any) -> list[tuple[str, int, int, dict]]:
    """Every position of a vLLM ``RequestOutput`` that carries log-probabilities: (where, index, reference row, the
    ``{id: Logprob}`` dict). ``prompt_logprobs[i]`` (i ≥ 1) predicts prompt token i (reference row ``i - 1``),
    ``logprobs[s]`` generation step s (row ``P - 1 + s``)."""
    P = len(output.prompt_token_ids)
    prompt = [("prompt", i, i - 1, d) for i, d in enumerate(output.prompt_logprobs or []) if d]
    steps = [("step", s, P - 1 + s, d) for s, d in enumerate(output.outputs[0].logprobs or [])]
    return prompt + steps


def compare_request(
    stats: LogprobStats, output: Any, ref_logprobs: torch.Tensor, req: int, noise: float, tie: float
) -> None:
    """Add one vLLM ``RequestOutput`` (greedy, with prompt_logprobs and logprobs) to ``stats``."""
    worst = 0.0
    for where, index, row, d in returned_positions(output):
        worst = max(worst, _compare_position(stats, d, ref_logprobs[row], req, where, index, noise, tie))
    stats.per_request_max.append(worst)


def request_gap(output: Any, reference: torch.Tensor, honest: torch.Tensor | None = None) -> float:
    """Mean |Δ log p| to ``reference`` (float32 log-probabilities of the request's prompt + generated ids) over the
    ids vLLM returned at every position of one request — of vLLM's own values, or, given ``honest``, of those
    log-probabilities on the same ids (an honest computation at the deployment's precision: the floor of
    :mod:`genprobe.serving.precision`). Where both are -inf they count as equal; 0.0 when nothing was returned."""
    total, count = 0.0, 0
    for _, _, row, d in returned_positions(output):
        ids = [int(t) for t in d]
        if honest is None:
            served = torch.tensor([float(v.logprob) for v in d.values()], dtype=torch.float64)
        else:
            served = honest[row][ids].double()
        ref = reference[row][ids].double()
        diff = torch.where(torch.isneginf(served) & torch.isneginf(ref), torch.zeros_like(ref), (served - ref).abs())
        total += float(torch.nan_to_num(diff, nan=float("inf")).sum())
        count += len(ids)
    return total / count if count else 0.0


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


def compare_outputs(
    outputs: Sequence[Any], reference: Callable[[Sequence[int]], torch.Tensor], noise: float, tie: float | None = None
) -> LogprobStats:
    """Compare every request of one phase with recomputation of its own prompt + generated tokens."""
    stats = LogprobStats()
    for r, out in enumerate(outputs):
        ids = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
        compare_request(stats, out, reference(ids), r, noise, noise if tie is None else tie)
    return stats
