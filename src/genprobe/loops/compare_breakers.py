"""Does DRY miss loops whose period spans a sequence breaker? Classify loops by their unit, measure per class.

Every prompt gets a class by the loop greedy produced on it (:data:`CLASSES`: its unit holds a breaker, lies
within a line, or there is no periodic tail); each method's degenerate rate is reported per class, and its own
remaining loops split the same way (docs/which-fix.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..metrics.degeneracy import LoopMeasures
from ..metrics.stats import wilson_interval

SPANS, WITHIN, NO_LOOP = "spans a breaker", "within a line", "no baseline loop"
CLASSES = (SPANS, WITHIN, NO_LOOP)


def loop_unit(text: str, measures: LoopMeasures) -> str | None:
    """One period of a periodic tail (characters; exact period first, else the near period), or None."""
    p = measures.any_period
    return text[-p:] if p else None


def unit_class(text: str, measures: LoopMeasures, breakers: str) -> str:
    """:data:`SPANS`, :data:`WITHIN` or :data:`NO_LOOP` for one generation measured on its characters."""
    unit = loop_unit(text, measures)
    if unit is None:
        return NO_LOOP
    return SPANS if any(ch in breakers for ch in unit) else WITHIN


@dataclass
class ClassRate:
    """A method's degenerate rate on the prompts of one baseline-loop class."""

    cls: str
    n: int
    degenerate: int
    rate: float | None
    ci95: list[float]


def class_rates(classes: Sequence[str], degenerate: Sequence[bool]) -> list[ClassRate]:
    """Degenerate counts and rates per class (every class listed, empty ones with rate None)."""
    out = []
    for c in CLASSES:
        flags = [d for k, d in zip(classes, degenerate, strict=True) if k == c]
        k = sum(flags)
        out.append(ClassRate(c, len(flags), k, k / len(flags) if flags else None, list(wilson_interval(k, len(flags)))))
    return out


@dataclass
class OwnLoops:
    """A method's own periodic tails (characters), and how many of them have a unit that spans a breaker."""

    JSON_PROPERTIES = ("spanning_share",)  # computed from the fields, kept in the JSON form

    loops: int
    spanning: int

    @property
    def spanning_share(self) -> float | None:
        """Share of the loops whose unit holds a breaker."""
        return self.spanning / self.loops if self.loops else None


def own_loops(texts: Sequence[str], measures: Sequence[LoopMeasures], breakers: str) -> OwnLoops:
    """Count periodic tails and those whose unit holds a breaker."""
    classes = [unit_class(t, m, breakers) for t, m in zip(texts, measures, strict=True)]
    return OwnLoops(sum(c != NO_LOOP for c in classes), sum(c == SPANS for c in classes))
