"""Typed results of the cache verifier (:class:`PhaseResult` per comparison, :class:`VerifyReport` per implementation)
and the tensor measures they are read from (:func:`max_abs_diff`, :func:`row_std`).

An implementation's verdict is one of :data:`~genprobe.verify.compare.VERDICTS`, ``error`` when it raised (phase,
exception type and message kept; the other phases still ran) or ``unavailable`` when it could not be built here.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch

from .compare import Thresholds, worst

TOPK = 10  # tokens of the reference's top-k over which |Δ log p| is measured


@dataclass
class PhaseError:
    """An exception raised by the implementation under test (``call``: 0 = prefill, k = k-th step/chunk)."""

    phase: str
    type: str
    message: str
    call: int | None = None

    @classmethod
    def from_exception(cls, phase: str, exc: BaseException, call: int | None = None) -> "PhaseError":
        """Record ``exc`` (type name and message, no traceback objects)."""
        return cls(phase, type(exc).__name__, str(exc) or repr(exc), call)


@dataclass
class PhaseResult:
    """One comparison. ``first_*_step`` index the calls (0 = prefill call, k = k-th step/chunk).

    ``ref_logit_std`` is the reference logits' standard deviation over the vocabulary (median over the
    compared positions); ``rel_dlogit`` = max |Δlogit| / ``ref_logit_std``; ``bug_margin`` how far past the
    bug line the difference is (:meth:`Thresholds.bug_margin`: ≥ 1 is a bug). ``cases``: what the
    prefix-reuse phases ran, one entry per sequence; ``per_row``: the padded batch's rows, each compared
    with the same prompt run alone (max |Δ| and the share of its positions whose top-1 token differs).
    """

    phase: str
    verdict: str = "pass"  # one of VERDICTS, "error" (the implementation raised in it) or "skipped"
    max_abs_dlogit: float = 0.0
    rel_dlogit: float | None = None
    ref_logit_std: float | None = None
    max_abs_dlogprob_topk: float | None = None
    top1_agreement: float | None = None
    bit_identical: bool = True
    nonfinite_logits: bool = False
    first_any_diff_step: int | None = None
    first_diff_step: int | None = None
    calls: int = 0
    rows: int = 0
    bug_margin: float | None = None
    skipped: str | None = None
    error: PhaseError | None = None
    cases: list[dict[str, Any]] | None = None
    per_row: list[dict[str, Any]] | None = None

    @property
    def judged(self) -> bool:
        """True when the phase compared something (not skipped); a crashed phase keeps what it compared."""
        return self.skipped is None and self.calls > 0


class PhaseTracker:
    """Accumulates one phase call by call (each call's max |Δ| at once: it dates the first difference), then judges
    it: the measures over the whole phase are computed once at the end, over all compared rows."""

    def __init__(self, phase: str, noise: float):
        self.r = PhaseResult(phase)
        self.noise = noise
        self._got: list[torch.Tensor] = []
        self._ref: list[torch.Tensor] = []

    def add(self, call: int, got: torch.Tensor, ref: torch.Tensor) -> None:
        """Compare one call's logits (rows, V) — or (V,) — with the reference's."""
        r = self.r
        d = max_abs_diff(got, ref)
        r.calls += 1
        r.max_abs_dlogit = max(r.max_abs_dlogit, d)
        # a copy: the implementation may write its next logits into the same buffer
        self._got.append(got.detach().float().reshape(-1, got.shape[-1]).clone())
        self._ref.append(ref.float().reshape(-1, ref.shape[-1]))
        if d > 0:  # exact: equal entries count 0, so any bit difference is > 0
            r.bit_identical = False
            if r.first_any_diff_step is None:
                r.first_any_diff_step = call
        if d >= self.noise and r.first_diff_step is None:
            r.first_diff_step = call

    def skip(self, reason: str) -> None:
        self.r.skipped, self.r.verdict = reason, "skipped"

    def fail(self, exc: BaseException, call: int | None) -> None:
        """Record the implementation's exception at ``call`` (the phase's verdict becomes ``error``)."""
        self.r.error = PhaseError.from_exception(self.r.phase, exc, call)

    def finish(self, th: Thresholds, floor: float | None = None) -> PhaseResult:
        """Summary measures and the phase verdict (the pass line raised by the reference's noise ``floor``)."""
        r = self.r
        if self._got:
            got, ref = torch.cat(self._got), torch.cat(self._ref)
            top = ref.topk(min(TOPK, ref.shape[-1]), dim=-1).indices  # log p of the top-k: z_i - logsumexp(z)
            got_lp, ref_lp = (x.gather(-1, top) - torch.logsumexp(x, dim=-1, keepdim=True) for x in (got, ref))
            finite = torch.isfinite(ref)
            r.rows = ref.shape[0]
            r.ref_logit_std = statistics.median(row_std(ref, finite).tolist())
            r.rel_dlogit = r.max_abs_dlogit / r.ref_logit_std if r.ref_logit_std > 0 else float("inf")
            r.max_abs_dlogprob_topk = max_abs_diff(got_lp, ref_lp)
            r.top1_agreement = int((got.argmax(-1) == ref.argmax(-1)).sum()) / r.rows
            r.nonfinite_logits = bool((~torch.isfinite(got) & finite).any())
            r.bug_margin = th.bug_margin(r.max_abs_dlogit, r.ref_logit_std)
            self._got, self._ref = [], []
        if r.error is not None:
            r.verdict = "error"
        elif r.skipped is None:
            r.verdict = th.verdict(r.max_abs_dlogit, r.ref_logit_std, floor)
        return r


@dataclass
class VerifyReport:
    """Everything the harness measured for one implementation (``verdict``: see the module docstring).

    A report without phases is that of an implementation that never ran: its factory raised (``errors``) or it is
    unavailable here (``unavailable``). The summaries after the fields one gives are read off ``phases`` and
    ``texts`` when the report is made.
    """

    impl: str
    verdict: str
    thresholds: Thresholds
    steps: int = 0
    prompt_lengths: list[int] = field(default_factory=list)
    phases: list[PhaseResult] = field(default_factory=list)
    reference: str = "full recomputation"
    errors: list[PhaseError] = field(default_factory=list)
    unavailable: str | None = None  # why the implementation could not be built here
    texts: list[dict[str, Any]] = field(default_factory=list)  # per prompt: reference vs implementation greedy ids
    # the reference's own float noise on this model: {"value", "sources": {how: max |Δ|}} (None: not measured)
    noise_floor: dict[str, Any] | None = None
    pass_line: float | None = None  # the max |Δlogit| below which a phase passes (thresholds.pass_line(floor))
    reuse: list[str] = field(default_factory=list)  # the cross-sequence reuse situations the run exercised
    # ---- summaries (prefill/decode: the chapter's §3.9.1 phases; judged: the phases that compared something)
    prefill_bit_identical: bool = field(init=False)  # the prefill call's logits equal the reference's bit for bit
    max_abs_dlogit: float = field(init=False)  # over the judged phases
    greedy_max_abs_dlogit: float = field(init=False)  # over prefill + decode: the chapter's §3.9.1 table's
    max_rel_dlogit: float | None = field(init=False)  # |Δ| in standard deviations of the reference logits
    min_top1_agreement: float | None = field(init=False)  # lowest share of positions whose argmax agrees
    bug_margin: float | None = field(init=False)  # largest over the judged phases (≥ 1: a bug)
    worst_phase: str | None = field(init=False)  # the judged phase of the largest max |Δlogit|
    first_any_diff_step: int | None = field(init=False)  # first prefill/decode call that differs at all
    first_diff_step: int | None = field(init=False)  # … by the noise threshold or more
    max_abs_dlogit_by_phase: dict[str, float | None] = field(init=False)  # None: the phase was skipped
    first_diff_step_by_phase: dict[str, int | None] = field(init=False)
    text_divergences: int = field(init=False)  # greedy positions where the implementation's own tokens differ
    text_tokens: int = field(init=False)  # the implementation's greedy tokens compared
    first_text_divergence: int | None = field(init=False)
    text_only_would_catch: bool = field(init=False)  # comparing greedy text alone would have seen a difference
    passed: bool = field(init=False)  # the verdict is float noise

    def __post_init__(self) -> None:
        judged = [p for p in self.phases if p.judged]
        greedy = [p for p in self.phases if p.phase in ("prefill", "incremental")]

        def over(pick: Any, attr: str, phases: list[PhaseResult]) -> Any:
            return pick((getattr(p, attr) for p in phases if getattr(p, attr) is not None), default=None)

        self.prefill_bit_identical = any(p.phase == "prefill" and p.bit_identical for p in judged)
        self.max_abs_dlogit = float(over(max, "max_abs_dlogit", judged) or 0.0)
        self.greedy_max_abs_dlogit = float(over(max, "max_abs_dlogit", greedy) or 0.0)
        self.max_rel_dlogit = over(max, "rel_dlogit", judged)
        self.min_top1_agreement = over(min, "top1_agreement", judged)
        self.bug_margin = over(max, "bug_margin", judged)
        self.worst_phase = max(judged, key=lambda p: p.max_abs_dlogit).phase if judged else None
        self.first_any_diff_step = over(min, "first_any_diff_step", greedy)
        self.first_diff_step = over(min, "first_diff_step", greedy)
        self.max_abs_dlogit_by_phase = {p.phase: (p.max_abs_dlogit if p.judged else None) for p in self.phases}
        self.first_diff_step_by_phase = {p.phase: p.first_diff_step for p in self.phases}
        zipped = (zip(t["implementation"], t["reference"], strict=False) for t in self.texts)
        diffs = [[i for i, (a, b) in enumerate(pairs) if a != b] for pairs in zipped]
        self.text_divergences = sum(map(len, diffs))
        self.text_tokens = sum(len(t["implementation"]) for t in self.texts)
        self.first_text_divergence = min((d[0] for d in diffs if d), default=None)
        self.text_only_would_catch = self.text_divergences > 0
        self.passed = self.verdict == "pass"

    def phase(self, name: str) -> PhaseResult:
        """The result of phase ``name`` (KeyError if it was not run)."""
        for p in self.phases:
            if p.phase == name:
                return p
        raise KeyError(f"no phase {name!r}; have {[p.phase for p in self.phases]}")


def overall_verdict(phases: list[PhaseResult], exact_prefill: bool) -> str:
    """``error`` when any phase raised, else the most severe phase verdict (see :class:`Thresholds`)."""
    if any(p.error is not None for p in phases):
        return "error"
    v = worst(p.verdict for p in phases if p.skipped is None)
    prefill = [p for p in phases if p.phase == "prefill"]
    if exact_prefill and prefill and not prefill[0].bit_identical and v == "pass":
        v = "small"
    return v


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| where equal entries (including equal infinities) count 0 and NaN counts +inf."""
    a, b = a.float(), b.float()
    if a.shape != b.shape:
        raise ValueError(f"cannot compare logits of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    d = torch.nan_to_num(torch.where(a == b, torch.zeros_like(a), (a - b).abs()), nan=math.inf, posinf=math.inf)
    return float(d.max()) if a.numel() else 0.0


def row_std(ref: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """Standard deviation of each row of reference logits over its ``finite`` entries (a masked vocabulary is -inf)."""
    if bool(finite.all()):
        return ref.std(dim=-1)
    n = finite.sum(-1).clamp(min=2)
    x = torch.where(finite, ref, torch.zeros_like(ref))
    mean = x.sum(-1, keepdim=True) / n[:, None]
    var = torch.where(finite, (x - mean) ** 2, torch.zeros_like(ref)).sum(-1) / (n - 1)
    return var.sqrt()
