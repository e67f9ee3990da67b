"""Does the deployed model loop as often as our engine measured? (a repaired model served by vLLM)

:func:`compare_loop_rates` puts two scans of the same prompts side by side: both rates with Wilson 95% intervals,
whether the served rate lies inside ours, and — because a rate alone can agree by accident — the per-prompt
agreement of loop verdicts and of tokens (which greedy decoding should reproduce exactly).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..loops.scan import ScanResult


@dataclass
class RateComparison:
    """Our engine's scan vs the served model's scan of the same prompts."""

    JSON_PROPERTIES = ("consistent",)  # computed from the fields, kept in the JSON form

    n: int
    ours_rate: float
    ours_ci95: tuple[float, float]
    served_rate: float
    served_ci95: tuple[float, float]
    served_within_ours_ci: bool
    ours_degenerate_rate: float  # exact loop, near loop or repetitive tail (the repair objective)
    served_degenerate_rate: float
    verdict_agreement: float  # fraction of prompts with the same looping yes/no
    token_agreement: float  # fraction of prompts with identical generated tokens

    @property
    def consistent(self) -> bool:
        """The served loop rate lies inside our engine's 95% interval."""
        return self.served_within_ours_ci


def compare_loop_rates(ours: ScanResult, served: ScanResult) -> RateComparison:
    """Compare two scans of the same prompts (refuses scans of different prompt sets)."""
    a, b = ours.records, served.records
    if len(a) != len(b) or any(x.prompt_ids != y.prompt_ids for x, y in zip(a, b, strict=True)):
        raise ValueError("the two scans are not over the same prompts in the same order")
    if not a:
        raise ValueError("the scans hold no records")
    sa, sb = ours.summary, served.summary
    lo, hi = sa.loop_rate_ci95
    return RateComparison(
        n=len(a),
        ours_rate=sa.loop_rate,
        ours_ci95=(lo, hi),
        served_rate=sb.loop_rate,
        served_ci95=(sb.loop_rate_ci95[0], sb.loop_rate_ci95[1]),
        served_within_ours_ci=lo <= sb.loop_rate <= hi,
        ours_degenerate_rate=sa.degenerate_rate,
        served_degenerate_rate=sb.degenerate_rate,
        verdict_agreement=sum(x.looping == y.looping for x, y in zip(a, b, strict=True)) / len(a),
        token_agreement=sum(x.tokens == y.tokens for x, y in zip(a, b, strict=True)) / len(a),
    )
