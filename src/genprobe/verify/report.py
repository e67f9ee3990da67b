"""Typed results of the cache verifier: :class:`PhaseResult` per comparison, :class:`VerifyReport` per implementation.

Outcomes of an implementation: a verdict on the scale of :mod:`genprobe.verify.compare`
(``pass`` < ``small`` < ``suspicious`` < ``bug``), or ``error`` when the implementation raised (the
phase, exception type and message are kept; the other phases still ran), or ``unavailable`` when
it could not be built here (e.g. a ``transformers`` cache class this version lacks).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .._io import json_safe_dict
from .compare import Thresholds, compare_rows, max_abs_diff, worst

OUTCOMES = ("pass", "small", "suspicious", "bug", "error", "unavailable")
# a phase's verdict is one of VERDICTS, "error" (the implementation raised in it) or "skipped"


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
    verdict: str = "pass"
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
    """Accumulates one phase call by call, then judges it.

    Each call's max |Δ| is taken at once (it dates the first difference); the measures over the
    whole phase (reference spread, top-k |Δ log p|, top-1 agreement) are computed once at the end
    over all compared rows — one batch of tensor ops instead of one per call.
    """

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

    def skip(self, reason: str) -> PhaseResult:
        """Mark the phase as not run."""
        self.r.skipped = reason
        self.r.verdict = "skipped"
        return self.r

    def fail(self, error: PhaseError) -> None:
        """Record the implementation's exception (the phase's verdict becomes ``error``)."""
        self.r.error = error

    def finish(self, th: Thresholds, floor: float | None = None) -> PhaseResult:
        """Summary measures and the phase verdict (the pass line raised by the reference's noise ``floor``)."""
        r = self.r
        if self._got:
            s = compare_rows(torch.cat(self._got), torch.cat(self._ref))
            r.rows = s.rows
            r.ref_logit_std = statistics.median(s.ref_std.tolist())
            r.rel_dlogit = r.max_abs_dlogit / r.ref_logit_std if r.ref_logit_std > 0 else float("inf")
            r.max_abs_dlogprob_topk = s.max_dlogp_topk
            r.top1_agreement = s.top1_agree / s.rows
            r.nonfinite_logits = s.nonfinite
            r.bug_margin = th.bug_margin(r.max_abs_dlogit, r.ref_logit_std)
            self._got, self._ref = [], []
        if r.error is not None:
            r.verdict = "error"
        elif r.skipped is None:
            r.verdict = th.verdict(r.max_abs_dlogit, r.ref_logit_std, floor)
        return r


@dataclass
class VerifyReport:
    """Everything the harness measured for one implementation (``verdict`` is one of :data:`OUTCOMES`)."""

    impl: str
    steps: int
    prompt_lengths: list[int]
    phases: list[PhaseResult]
    prefill_bit_identical: bool
    max_abs_dlogit: float
    first_any_diff_step: int | None
    first_diff_step: int | None
    text_divergences: int
    text_tokens: int
    first_text_divergence: int | None
    text_only_would_catch: bool
    verdict: str
    thresholds: Thresholds
    reference: str = "full recomputation"
    errors: list[PhaseError] = field(default_factory=list)
    unavailable: str | None = None  # why the implementation could not be built here
    texts: list[dict[str, Any]] = field(default_factory=list)  # per prompt: reference vs implementation greedy ids
    # the reference's own float noise on this model: {"value", "sources": {how: max |Δ|}} (None: not measured)
    noise_floor: dict[str, Any] | None = None
    pass_line: float | None = None  # the max |Δlogit| below which a phase passes (thresholds.pass_line(floor))
    reuse: list[str] = field(default_factory=list)  # the cross-sequence reuse situations the run exercised

    @classmethod
    def not_run(
        cls,
        impl: str,
        thresholds: Thresholds,
        *,
        error: PhaseError | None = None,
        unavailable: str | None = None,
        steps: int = 0,
        reference: str = "full recomputation",
    ) -> "VerifyReport":
        """A report for an implementation that never ran: its factory raised, or it is unavailable here."""
        return cls(
            impl=impl,
            steps=steps,
            prompt_lengths=[],
            phases=[],
            prefill_bit_identical=False,
            max_abs_dlogit=0.0,
            first_any_diff_step=None,
            first_diff_step=None,
            text_divergences=0,
            text_tokens=0,
            first_text_divergence=None,
            text_only_would_catch=False,
            verdict="error" if error is not None else "unavailable",
            thresholds=thresholds,
            reference=reference,
            errors=[error] if error is not None else [],
            unavailable=unavailable,
        )

    def phase(self, name: str) -> PhaseResult:
        """The result of phase ``name`` (KeyError if it was not run)."""
        for p in self.phases:
            if p.phase == name:
                return p
        raise KeyError(f"no phase {name!r}; have {[p.phase for p in self.phases]}")

    def max_by_phase(self) -> dict[str, float | None]:
        """max |Δlogit| per phase (None for skipped phases)."""
        return {p.phase: (p.max_abs_dlogit if p.judged else None) for p in self.phases}

    def first_diff_by_phase(self) -> dict[str, int | None]:
        """First call above the noise threshold, per phase (None: none, or the phase was skipped)."""
        return {p.phase: p.first_diff_step for p in self.phases}

    @property
    def worst_phase(self) -> str | None:
        """The phase with the largest max |Δlogit| (None when no phase compared anything)."""
        run = [p for p in self.phases if p.judged]
        return max(run, key=lambda p: p.max_abs_dlogit).phase if run else None

    @property
    def greedy_max_abs_dlogit(self) -> float:
        """max |Δ| over prefill + incremental only: the quantity of the chapter's §3.9.1 table."""
        return max((p.max_abs_dlogit for p in self.phases if p.phase in ("prefill", "incremental")), default=0.0)

    @property
    def bug_margin(self) -> float | None:
        """The largest bug margin over the judged phases (≥ 1: a bug; None when nothing was compared)."""
        margins = [p.bug_margin for p in self.phases if p.judged and p.bug_margin is not None]
        return max(margins) if margins else None

    @property
    def passed(self) -> bool:
        """True when the verdict is float noise."""
        return self.verdict == "pass"

    def to_dict(self) -> dict[str, Any]:
        """JSON form (non-finite numbers spelled out: strict JSON)."""
        d: dict[str, Any] = asdict(self)
        d["max_abs_dlogit_by_phase"] = self.max_by_phase()
        d["first_diff_step_by_phase"] = self.first_diff_by_phase()
        d["passed"] = self.passed
        d["worst_phase"] = self.worst_phase
        d["greedy_max_abs_dlogit"] = self.greedy_max_abs_dlogit
        d["bug_margin"] = self.bug_margin
        return json_safe_dict(d)


def overall_verdict(phases: list[PhaseResult], exact_prefill: bool) -> str:
    """``error`` when any phase raised, else the most severe phase verdict (see :class:`Thresholds`)."""
    if any(p.error is not None for p in phases):
        return "error"
    v = worst(p.verdict for p in phases if p.skipped is None)
    prefill = [p for p in phases if p.phase == "prefill"]
    if exact_prefill and prefill and not prefill[0].bit_identical and v == "pass":
        v = "small"
    return v
