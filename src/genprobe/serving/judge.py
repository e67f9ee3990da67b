"""How a served response is judged against float32 recomputation: one rule for every engine and precision.

Every id a backend returned at a position (its top-k and the actual token; the whole vocabulary where it returns
every row) is compared with ``log_softmax`` of one uncached float32 forward over prompt + generated ids
(:func:`reference_logprobs`; row t predicts token t + 1). **Float32 arithmetic** is judged on verify-cache's absolute
scale over max |Δ log p| (:meth:`Judge.phase`; a differing top-1 token at least "suspicious"). **Reduced
precision is not a bug**: it is judged on the **gap ratio**, the mean |Δ log p| over the ids returned (the reference's
top :data:`TOP_GAP` where every row was) over the same gap of an honest computation in that precision (the model
recomputed in the dtype, llama.cpp's own prefill, or a live server's lone requests), the worst request deciding
(docs/live-serving.md, docs/llamacpp.md: why, with measurements).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from ..engine.backend import Response, full_logprobs
from ..engine.runner import runner_for
from ..verify.compare import VERDICTS, Thresholds

if TYPE_CHECKING:  # pragma: no cover
    from ..model.load import Model

NOT_CHECKED = "not checked"
GAP_PASS, GAP_BUG = 2.0, 5.0  # a phase's gap over its precision's floor: up to 2 floors pass, over 5 is a bug
TOP_GAP = 5  # where the whole vocabulary is returned, the gap reads the reference's 5 most likely ids per position
Rows = Callable[[Sequence[int]], torch.Tensor]  # ids -> (len(ids), V) log-probabilities, row t predicts token t + 1


def worst_verdict(verdicts: list[str]) -> str:
    """The most severe of ``verdicts`` ("pass" for none)."""
    return max(verdicts, key=VERDICTS.index, default="pass")


def gap_verdict(gap: float, floor: float, noise: float) -> tuple[str, float]:
    """(verdict, ratio) of a reduced-precision phase: ``gap`` over ``floor`` (at least ``noise``, so that a precision
    that happens to be exact on these tokens does not turn float noise into a bug)."""
    ratio = gap / max(floor, noise)
    return ("pass" if ratio <= GAP_PASS else "suspicious" if ratio <= GAP_BUG else "bug"), ratio


@dataclass
class LogprobStats:
    """Accumulated differences over the positions of one or more requests."""

    positions: int = 0
    compared: int = 0  # (position, id) pairs
    max_abs_dlogp: float = 0.0
    sum_abs_dlogp: float = 0.0
    top1_disagreements: int = 0
    # the first position beyond float noise (or with another top-1): its request's index in the phase, "prompt"
    # (predicting prompt token ``index``) or "step" (generation step ``index``), its |Δ log p| and top-1 mismatch
    first: dict | None = None

    @property
    def top1_agreement(self) -> float | None:
        """Fraction of positions whose top-1 token agrees (None when nothing was compared)."""
        return None if not self.positions else 1.0 - self.top1_disagreements / self.positions

    @property
    def mean_abs_dlogp(self) -> float | None:
        """Mean |Δ log p| over all compared ids."""
        return None if not self.compared else self.sum_abs_dlogp / self.compared

    def add(self, served: Served, ref_row: torch.Tensor, request: int, noise: float) -> None:
        """One served position against its reference row: |Δ log p| over the ids returned (both -inf equal, NaN
        infinite); its top-1 token disagrees when the reference puts it more than ``noise`` below its maximum."""
        _, where, index, ids, lps, top = served
        diff = abs_diff(lps, ref_row if ids is None else ref_row[ids])
        mx = float(diff.max())
        mismatch = bool(ref_row[top] < ref_row.max() - noise)
        self.positions += 1
        self.compared += diff.numel()
        self.sum_abs_dlogp += float(diff.sum()) if mx != float("inf") else float("inf")
        self.max_abs_dlogp = max(self.max_abs_dlogp, mx)
        self.top1_disagreements += int(mismatch)
        if self.first is None and (mx >= noise or mismatch):
            self.first = dict(request=request, where=where, index=index, abs_dlogp=mx, top1_mismatch=mismatch)


def abs_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in float64, where both -inf counts as equal and NaN as infinitely far."""
    a, b = a.double(), b.double()
    diff = torch.where(torch.isneginf(a) & torch.isneginf(b), torch.zeros_like(a), (a - b).abs())
    return torch.nan_to_num(diff, nan=float("inf"))


def reference_logprobs(model: Model) -> Rows:
    """:func:`~genprobe.engine.backend.full_logprobs` of a loaded ``Model`` in its own dtype — float32, or a
    deployment's reduced precision for its floor — memoised per sequence: ``(len(ids), V)``, row t predicts t + 1."""
    rows = functools.cache(functools.partial(full_logprobs, runner_for(model)))
    return lambda ids: rows(tuple(int(i) for i in ids))


@dataclass
class PhaseReport:
    """One phase on one deployment: its figures and verdict ("not checked" with ``note`` saying why)."""

    phase: str
    dtype: str = ""  # the deployment's precision label (``Capabilities.label``)
    verdict: str = "pass"
    judged_on: str = ""  # "reference" (float32, absolute) | "gap" (over a floor) | "tokens" | "template"
    note: str = ""
    requests: int = 0
    positions: int = 0
    max_abs_dlogp: float | None = None
    mean_abs_dlogp: float | None = None
    top1_agreement: float | None = None
    top1_disagreements: int = 0
    topk_agreement: float | None = None  # mean |served top-k ∩ reference top-k| / k
    first_divergence: dict | None = None  # the first position beyond float noise (or with another top-1)
    self_max_abs_dlogp: float | None = None  # the same positions against the floor computation, where there is one
    self_top1_agreement: float | None = None
    gap: float | None = None  # the worst request's mean |Δ log p| to float32
    floor: float | None = None  # the same statistic of the honest computation (or of the lone requests)
    gap_ratio: float | None = None  # gap / floor, what a phase judged on "gap" reads
    divergence_rate: float | None = None  # batch: requests whose greedy tokens differ from their lone run
    token_divergence: dict | None = None  # {"request": r, "token": t}: the first such difference
    cached_tokens: int | None = None  # prompt tokens served from a prefix cache
    shared_tokens: int | None = None  # leading tokens the request shares with the cached one
    prefill_chunks: int | None = None  # chunked_prefill: most chunks any prompt was prefilled in


Served = tuple[int, str, int, list[int] | None, torch.Tensor, int]  # row, where, index, ids (None: all), log p, top-1


def served_positions(resp: Response, prompt: bool = False) -> list[Served]:
    """Every position ``resp`` returned log-probabilities for: (reference row, "prompt" | "step", index, the ids
    returned (None: the whole vocabulary), their log-probabilities, the served top-1 id); ``prompt``: the prompt's
    positions only. ``prompt_positions[i]`` (i ≥ 1) predicts prompt token i (row ``i - 1``), ``positions[s]`` step
    s (row ``P - 1 + s``)."""
    P = len(resp.prompt_ids)
    if resp.rows is not None:
        rows = [(resp.rows_from + t, row) for t, row in enumerate(resp.rows)]
        return [
            (r, *(("prompt", r + 1) if r + 1 < P else ("step", r + 1 - P)), None, row, int(row.argmax()))
            for r, row in rows
            if not prompt or r + 1 < P
        ]
    placed = (
        [(i - 1, "prompt", i, p) for i, p in enumerate(resp.prompt_positions or []) if p is not None]
        if prompt
        else [(P - 1 + s, "step", s, p) for s, p in enumerate(resp.positions)]
    )
    out: list[Served] = []
    for row, where, index, pos in placed:
        entries = dict(pos.top)  # its top-k and the token itself
        if pos.logprob is not None:
            entries.setdefault(pos.token, pos.logprob)
        if entries:
            top = max(pos.top, key=pos.top.__getitem__) if pos.top else pos.token
            out.append((row, where, index, list(entries), torch.tensor(list(entries.values())), top))
    return out


def request_gap(served: Sequence[Served], reference: torch.Tensor, honest: torch.Tensor | None = None) -> float:
    """Mean |Δ log p| to ``reference`` (float32 rows of the request's ids) over the ids returned at every position
    (the reference's top :data:`TOP_GAP` where the whole vocabulary was: what sampling reads, not the far tail,
    where quantization moves log p the most) — of the served values, or, given ``honest``, of those rows' values
    (an honest computation at the deployment's precision: the floor). Both -inf counts as equal; 0.0 for nothing."""
    total, count = 0.0, 0
    for row, _, _, ids, lps, _ in served:
        ref = reference[row].double()
        pick = torch.topk(ref, min(TOP_GAP, ref.numel())).indices if ids is None else torch.tensor(ids)
        value = (lps[pick] if ids is None else lps) if honest is None else honest[row][pick]
        total += float(abs_diff(value, ref[pick]).sum())
        count += len(pick)
    return total / count if count else 0.0


class Judge:
    """Compares responses with float32 recomputation (``reference``) and, where given, with an honest computation at
    the deployment's precision (``floor``: the same model recomputed in that dtype, or the engine's own one-call
    prefill), and gives each phase its verdict: the absolute scale when ``exact``, else each request's gap over its
    floor (the worst request deciding); without a floor, the lone greedy requests' gap (``lone_gap``) once measured."""

    def __init__(
        self, reference: Rows, thresholds: Thresholds, k: int, floor: Rows | None = None, exact: bool | None = None
    ):
        self.reference, self.th, self.k, self.floor, self.exact = reference, thresholds, k, floor, exact
        self.lone_gap: float | None = None

    def phase(
        self,
        name: str,
        responses: Sequence[Response],
        prompt: bool = False,
        reference: Rows | None = None,
        judge_self: bool = True,
        **extra: Any,
    ) -> PhaseReport:
        """The figures and verdict of ``responses`` (``prompt``: their prompt positions only; ``reference``: another
        float32 reference for this phase, the floor's gap still read against recomputation; ``judge_self``: the
        floor comparison may decide)."""
        st, own, noise = LogprobStats(), LogprobStats(), self.th.noise
        overlap, overlaps, worst = 0.0, 0, (0.0, 0.0, -1.0)  # top-k overlap; the worst request's (gap, floor, ratio)
        for r, resp in enumerate(responses):
            ids = list(resp.prompt_ids) + list(resp.token_ids)
            recomputed = self.reference(ids)
            rows = recomputed if reference is None else reference(ids)
            honest = self.floor(ids) if self.floor is not None else None
            served = served_positions(resp, prompt)
            for position in served:
                row, _, _, pick, lps, _ = position
                st.add(position, rows[row], r, noise)
                if honest is not None:
                    own.add(position, honest[row], r, noise)
                if pick is not None and len(pick) > 1:
                    k = min(self.k, len(pick))  # vLLM adds the sampled / prompt token beside its top k
                    served_top = [pick[i] for i in torch.argsort(lps, descending=True)[:k].tolist()]
                    overlap += len(set(torch.topk(rows[row], k).indices.tolist()) & set(served_top)) / k
                    overlaps += 1
            if served:
                gap = request_gap(served, rows)
                floor = request_gap(served, recomputed, honest) if honest is not None else self.lone_gap or 0.0
                worst = max(worst, (gap, floor, gap / max(floor, noise)), key=lambda w: w[2])
        if not st.positions:
            return PhaseReport(name, note="the backend returned no log-probabilities to compare", verdict=NOT_CHECKED)
        cached = max((c for c in (x.cached_tokens for x in responses) if c is not None), default=None)
        rep = PhaseReport(name, requests=len(responses), positions=st.positions, cached_tokens=cached, **extra)
        rep.max_abs_dlogp, rep.mean_abs_dlogp, rep.gap = st.max_abs_dlogp, st.mean_abs_dlogp, worst[0]
        rep.top1_agreement, rep.top1_disagreements = st.top1_agreement, st.top1_disagreements
        rep.topk_agreement = overlap / overlaps if overlaps else None
        rep.first_divergence = st.first
        rep.self_max_abs_dlogp = own.max_abs_dlogp if own.positions else None
        rep.self_top1_agreement = own.top1_agreement
        if self.exact or (self.floor is None and self.lone_gap is None):
            judged = [st, own] if judge_self and own.positions else [st]
            # the Δ log p scale, raised to "suspicious" where any top-1 token differs
            verdicts = [self.th.verdict(s.max_abs_dlogp) for s in judged]
            verdicts += ["suspicious" for s in judged if s.top1_disagreements > 0]
            rep.verdict, rep.judged_on = worst_verdict(verdicts), "reference"
        else:
            rep.verdict, rep.gap_ratio = gap_verdict(worst[0], worst[1], self.th.noise)
            rep.judged_on, rep.floor = "gap", worst[1]
        return rep
