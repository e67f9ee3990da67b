"""The quantization study's pure measures: numbers from logits and token lists alone.

KL(F32 ‖ type), top-1 agreement (first index on a tie, as llama.cpp's greedy sampler) and perplexity; the first
step where greedy text leaves F32's; calibrated loop rates paired with F32's on the same prompts (sign test).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ...metrics.stats import sign_test_p
from ..verify import first_difference

DIVERGENCE_BIN = 8


# ---- logits ------------------------------------------------------------------------------------------------
def log_softmax64(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (``-inf`` logits stay ``-inf``; a row needs one finite logit)."""
    x = np.asarray(logits, dtype=np.float64)
    top = np.max(x, axis=-1, keepdims=True)
    shifted = x - top
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def kl_per_position(ref_logits: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """KL(ref ‖ other) in nats per row. A token impossible under ``ref`` (``-inf``) adds nothing; one impossible
    under ``other`` but not ``ref`` makes the row ``inf``."""
    lp, lq = log_softmax64(ref_logits), log_softmax64(logits)
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (lp - lq), 0.0)
    return np.sum(terms, axis=-1)


@dataclass
class LogitAgreement:
    """A model's logits beside the reference's on the same text positions."""

    positions: int
    kl_mean: float  # KL(reference ‖ this), nats
    kl_p99: float
    kl_max: float
    top1_agreement: float  # share of positions whose argmax (first index on a tie) is the reference's
    perplexity: float  # this model's, on the text's next tokens
    reference_perplexity: float


@dataclass
class AgreementAccumulator:
    """Window by window (the reference's logits of one window are dropped after use): KL, top-1, perplexity."""

    kl: list[np.ndarray] = field(default_factory=list)
    same_top1: int = 0
    nll: float = 0.0
    ref_nll: float = 0.0
    positions: int = 0

    def add(self, ref_logits: np.ndarray, logits: np.ndarray, ids: Sequence[int]) -> None:
        """One window: ``ids`` (n tokens), both models' logits at its n positions; positions 0..n-2 predict ids
        1..n-1 and are the ones counted."""
        n = len(ids) - 1
        if n < 1 or ref_logits.shape[0] < n or logits.shape[0] < n:
            raise ValueError(f"a window needs >= 2 tokens and logits for each; got {len(ids)} tokens")
        if ref_logits.shape[1] != logits.shape[1]:
            raise ValueError(f"vocabularies differ: reference {ref_logits.shape[1]}, other {logits.shape[1]}")
        r, q = ref_logits[:n], logits[:n]
        self.kl.append(kl_per_position(r, q))
        self.same_top1 += int(np.sum(np.argmax(r, axis=-1) == np.argmax(q, axis=-1)))
        nxt = np.asarray(ids[1:], dtype=np.int64)
        rows = np.arange(n)
        self.nll -= float(np.sum(log_softmax64(q)[rows, nxt]))
        self.ref_nll -= float(np.sum(log_softmax64(r)[rows, nxt]))
        self.positions += n

    def result(self) -> LogitAgreement:
        """The aggregate over every window added."""
        if not self.positions:
            raise ValueError("no text positions were compared")
        kl = np.concatenate(self.kl)
        return LogitAgreement(
            positions=self.positions,
            kl_mean=float(np.mean(kl)),
            kl_p99=float(np.quantile(kl, 0.99)),
            kl_max=float(np.max(kl)),
            top1_agreement=self.same_top1 / self.positions,
            perplexity=math.exp(self.nll / self.positions),
            reference_perplexity=math.exp(self.ref_nll / self.positions),
        )


# ---- greedy text ---------------------------------------------------------------------------------------------
@dataclass
class Divergence:
    """Where each prompt's greedy continuation under a type first leaves F32's."""

    prompts: int
    diverged: int
    # the median over all prompts, a never-diverging one counted as beyond the budget (None: over half never do)
    median_step: float | None
    histogram: dict[str, int]  # "0-7", "8-15", ..., "never"
    steps: list[int | None]


def divergence_summary(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> Divergence:
    """Per-prompt first divergence steps of ``other`` from ``reference`` (same prompts, same order)."""
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference generations but {len(other)} to compare")
    steps = [first_difference(a, b) for a, b in zip(reference, other, strict=True)]
    hist: dict[str, int] = {}
    for s in steps:
        low = None if s is None else s // DIVERGENCE_BIN * DIVERGENCE_BIN
        key = "never" if low is None else f"{low}-{low + DIVERGENCE_BIN - 1}"
        hist[key] = hist.get(key, 0) + 1
    ordered = sorted(steps, key=lambda s: math.inf if s is None else s)
    mid = ordered[(len(ordered) - 1) // 2] if ordered else None
    order = sorted(hist, key=lambda k: math.inf if k == "never" else int(k.split("-")[0]))
    return Divergence(
        prompts=len(steps),
        diverged=sum(s is not None for s in steps),
        median_step=None if mid is None else float(mid),
        histogram={k: hist[k] for k in order},
        steps=steps,
    )


# ---- loops ---------------------------------------------------------------------------------------------------
@dataclass
class LoopOutcome:
    """Calibrated loop verdicts of one type's greedy generations, paired with F32's on the same prompts."""

    n: int
    loop_rate: float
    loop_rate_ci95: list[float]
    degenerate_rate: float
    degenerate_rate_ci95: list[float]
    human_fpr: dict[str, dict] | None  # the detectors' held-out human false-positive rates
    became_degenerate: int = 0  # prompts degenerate under this type but not under F32
    stopped_degenerate: int = 0
    sign_test_p: float = 1.0
    degenerate: list[bool] = field(default_factory=list)


def loop_outcome(scan: Any, reference: Any | None = None) -> LoopOutcome:
    """:class:`LoopOutcome` of a :class:`~genprobe.loops.scan.ScanResult`, paired with the F32 scan ``reference``."""
    s = scan.summary
    verdicts = [bool(r.degenerate) for r in scan.records]
    out = LoopOutcome(
        n=s.n,
        loop_rate=s.loop_rate,
        loop_rate_ci95=list(s.loop_rate_ci95),
        degenerate_rate=s.degenerate_rate,
        degenerate_rate_ci95=list(s.degenerate_rate_ci95),
        human_fpr=s.human_fpr,
        degenerate=verdicts,
    )
    if reference is not None:
        ref = [bool(r.degenerate) for r in reference.records]
        out.became_degenerate = sum(v and not r for v, r in zip(verdicts, ref, strict=True))
        out.stopped_degenerate = sum(r and not v for v, r in zip(verdicts, ref, strict=True))
        out.sign_test_p = sign_test_p(out.became_degenerate, out.stopped_degenerate)
    return out


def intervals_overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two closed intervals share a point."""
    return a[0] <= b[1] and b[0] <= a[1]
