"""The verdict of a served model against recomputation, on verify-cache's scale.

The scale is verify-cache's :class:`genprobe.verify.compare.Thresholds` (seed §3.4.3: < 1e-4 float
noise → pass, < 1e-3 small, ≤ 1 suspicious, > 1 bug), applied to max |Δ log p| over the top-k
log-probabilities. Only the absolute scale: verify-cache's relative scale (Δ in standard deviations of
the reference *logits*) does not apply to log-probabilities, which are normalised already. One rule
is added for serving: a position where the served model's top-1 token is not the reference's (beyond
a float-noise tie) is at least "suspicious" — a greedy deployment would emit different text there,
whatever the size of the log-probability difference.
"""

from __future__ import annotations

from ..verify.compare import VERDICTS, Thresholds

__all__ = ["Thresholds", "VERDICTS", "serving_verdict", "worst_verdict"]


def worst_verdict(verdicts: list[str]) -> str:
    """The most severe of ``verdicts`` ("pass" for none)."""
    return max(verdicts, key=VERDICTS.index, default="pass")


def serving_verdict(max_abs_dlogp: float, top1_disagreements: int, thresholds: Thresholds | None = None) -> str:
    """Verdict for one phase: the Δ log p scale, raised to "suspicious" when any top-1 token differs."""
    th = thresholds or Thresholds()
    v = th.verdict(max_abs_dlogp)
    if top1_disagreements > 0:
        v = worst_verdict([v, "suspicious"])
    return v
