"""Judging the difference between an implementation's logits and the reference's on two scales (imports no torch).

The chapter's absolute scale (§3.4.3) and Δ in standard deviations of the reference logits, which only ever raises a
verdict; the pass line is raised by the reference's own noise floor, capped at ``floor_cap`` × ``bug``. Why both, and
the floors measured: docs/verify-cache.md (section 2, "Two scales").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

VERDICTS = ("pass", "small", "suspicious", "bug")  # ordered by severity


def worst(verdicts: Iterable[str]) -> str:
    """The most severe of ``verdicts`` (``"pass"`` when there are none)."""
    return max(verdicts, key=VERDICTS.index, default="pass")


def at_least(verdict: str, lowest: str) -> bool:
    """``verdict`` is ``lowest`` (one of :data:`VERDICTS` but pass) or more severe: ``--fail-on``'s test."""
    if lowest not in VERDICTS[1:]:
        raise ValueError(f"fail_on must be one of {list(VERDICTS[1:])}, got {lowest!r}")
    return verdict in VERDICTS and VERDICTS.index(verdict) >= VERDICTS.index(lowest)


@dataclass(frozen=True)
class Thresholds:
    """Verdict scales: absolute max |Δlogit| (the chapter's) and Δ in standard deviations of the reference logits.

    Absolute: < ``noise`` pass, < ``suspicious`` small, ≤ ``bug`` suspicious, > ``bug`` bug.
    Relative (only for Δ ≥ ``noise``): ≥ ``rel_suspicious`` σ suspicious, > ``rel_bug`` σ bug.
    The verdict of a phase is the more severe of the two.
    """

    noise: float = 1e-4
    bug: float = 1.0
    suspicious: float = 1e-3
    rel_bug: float = 1.0
    rel_suspicious: float = 0.01
    exact_prefill: bool = False  # when True a prefill that is not bit-identical is at least "small"
    floor_multiple: float = 4.0  # a difference below this many times the reference's own noise floor passes
    floor_cap: float = 0.1  # the floor can raise the pass line to at most this fraction of ``bug``

    def __post_init__(self) -> None:
        rules = (
            (0.0 <= self.noise <= self.suspicious <= self.bug, "0 <= noise <= suspicious <= bug"),
            (0.0 < self.rel_suspicious <= self.rel_bug, "0 < rel_suspicious <= rel_bug"),
            (self.floor_multiple >= 0.0 and 0.0 <= self.floor_cap < 1.0, "floor_multiple >= 0, 0 <= floor_cap < 1"),
        )
        for ok, rule in rules:
            if not ok:
                raise ValueError(f"thresholds must satisfy {rule}, got {self}")

    def pass_line(self, floor: float | None = None) -> float:
        """The largest max |Δlogit| that passes: ``noise``, raised to ``floor_multiple`` × a measured floor."""
        if floor is None or not (floor == floor) or floor <= 0:  # no floor, NaN or an exactly reproducible model
            return self.noise
        return max(self.noise, min(self.floor_multiple * float(floor), self.floor_cap * self.bug))

    def absolute_verdict(self, max_abs_dlogit: float, floor: float | None = None) -> str:
        """Classify one max |Δlogit| on the chapter's absolute scale (NaN counts as a bug)."""
        d, line = float(max_abs_dlogit), self.pass_line(floor)
        if d != d or d > self.bug:
            return "bug"
        if d >= max(self.suspicious, line):
            return "suspicious"
        if d >= line:
            return "small"
        return "pass"

    def verdict(self, max_abs_dlogit: float, ref_std: float | None = None, floor: float | None = None) -> str:
        """The more severe of the absolute verdict and Δ in standard deviations of the reference logits (judged only
        from the pass line up, which ``floor`` raises)."""
        absolute, d = self.absolute_verdict(max_abs_dlogit, floor), float(max_abs_dlogit)
        if ref_std is None or not (d >= self.pass_line(floor)):  # also False for NaN (the absolute scale's case)
            return absolute
        sigmas = d / ref_std if ref_std > 0 else math.inf
        relative = "bug" if sigmas > self.rel_bug else "suspicious" if sigmas >= self.rel_suspicious else "pass"
        return worst([absolute, relative])

    def bug_margin(self, max_abs_dlogit: float, ref_std: float | None = None) -> float:
        """How far past the bug line a difference is: the larger of |Δ| / ``bug`` and (|Δ|/σ) / ``rel_bug``.

        ≥ 1 is a bug; the project's own mutants must reach 3 (a decisive catch, not a hair's breadth).
        """
        d = float(max_abs_dlogit)
        if d != d:
            return math.inf
        rel = 0.0 if ref_std is None else (d / ref_std if ref_std > 0 else (math.inf if d > 0 else 0.0))
        absolute = d / self.bug if self.bug > 0 else (math.inf if d > 0 else 0.0)
        return max(absolute, rel / self.rel_bug)
