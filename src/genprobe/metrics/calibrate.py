"""Calibrate the loop detectors on human text, so that a loop scan does not flag ordinary prose.

The defaults of :class:`~genprobe.metrics.degeneracy.LoopSettings` were tuned on Tang poems of a character model;
English subword text repeats differently (" of the", "," recur every few tokens), so a threshold means something only
beside its false-positive rate on human text of the same tokenizer and length. :func:`calibrate_loop_settings` sets
the thresholds on half the sequences and reports Wilson 95% rates on the other half; docs/calibration.md describes
the search step by step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Hashable, Sequence

from .degeneracy import _EPS, LoopSettings, detect_near_loop, periodic_tail_length, tail_compression
from .stats import wilson_interval

DEFAULT_TARGET = 0.01
MIN_SEQUENCES = 20  # fewer human sequences (per half: 10) cannot estimate a percent-level rate
RATE_NAMES = ("exact", "near", "any_loop", "repetitive", "degenerate")


# Added to a human score to make a threshold (tokens, share, tokens/piece): > 0, since a sequence is flagged when its
# score reaches the threshold, and the quantile's own sequence must not be.
MARGINS = {"min_tail": 1, "min_match": 0.02, "min_compression": 0.1}


@dataclass(frozen=True)
class HumanScores:
    """The three detector scores of one sequence (see the module doc)."""

    exact: int  # longest periodic tail covering >= 2 periods (0: none)
    near: float  # best near-loop match share
    compression: float  # tail tokens per LZ piece


def human_scores(tokens: Sequence[Hashable], settings: LoopSettings) -> HumanScores:
    """Scores such that ``measure_loops(tokens, s)`` flags a detector iff its score reaches its threshold in ``s``
    (for any thresholds; ``window`` and ``max_period`` are taken from ``settings``)."""
    seq = tuple(tokens)
    tails = [(p, periodic_tail_length(seq, p)) for p in range(1, len(seq) // 2 + 1)]
    exact = max((tail for p, tail in tails if tail >= 2 * p), default=0)
    near = detect_near_loop(seq, window=settings.window, max_period=settings.max_period, min_match=1.0)
    return HumanScores(exact, near.match_share, tail_compression(seq, settings.window))


def flags(score: HumanScores, s: LoopSettings) -> dict[str, bool]:
    """Which detectors flag a sequence with these scores under ``s`` (plus the derived any-loop and degenerate)."""
    exact = score.exact >= s.min_tail
    near = score.near >= s.min_match - _EPS
    rep = score.compression >= s.min_compression
    return dict(exact=exact, near=near, any_loop=exact or near, repetitive=rep, degenerate=exact or near or rep)


@dataclass(frozen=True)
class HumanRate:
    """How many human sequences a detector flags: count, rate and Wilson 95% interval."""

    flagged: int
    n: int
    rate: float
    ci95: list[float]


def human_rates(scores: Sequence[HumanScores], s: LoopSettings) -> dict[str, HumanRate]:
    """The false-positive rate of each detector (and of any-loop, degenerate) over ``scores`` under ``s``."""
    n = len(scores)
    out = {}
    for name in RATE_NAMES:
        k = sum(flags(sc, s)[name] for sc in scores)
        out[name] = HumanRate(k, n, k / n if n else 0.0, list(wilson_interval(k, n)))
    return out


@dataclass
class LoopCalibration:
    """Detector settings calibrated on human text, and the human false-positive rates they have."""

    settings: LoopSettings
    defaults: LoopSettings
    source: str  # where the human text came from
    length: int  # tokens per human sequence: the scan's max_new_tokens
    chars_unit: bool  # the tokens are characters (char tokenizer): a per-character view is a verdict too
    target: float
    n: int
    n_calibrate: int
    n_heldout: int
    calibration_fpr: dict[str, HumanRate]  # on the half that set the thresholds (<= target when meets_target)
    heldout_fpr: dict[str, HumanRate]  # on the other half: the honest figure
    defaults_heldout_fpr: dict[str, HumanRate]  # the raw defaults on the held-out half, for comparison
    changed: list[str]  # settings that moved away from the defaults
    meets_target: bool
    capped: list[str] = field(default_factory=list)  # thresholds held at their cap (a loop must stay visible)

    def describe(self) -> str:
        """One line: source, thresholds, held-out human rate."""
        s, h = self.settings, self.heldout_fpr["degenerate"]
        moved = ", ".join(self.changed) if self.changed else "defaults kept"
        return (
            f"calibrated on {self.n} human sequences of {self.length} tokens ({self.source}; {moved}): min_tail "
            f"{s.min_tail}, min_match {s.min_match:.3f}, min_compression {s.min_compression:.2f}; human text flagged "
            f"degenerate {100 * h.rate:.1f}% [{100 * h.ci95[0]:.1f}–{100 * h.ci95[1]:.1f}] of {h.n} held out "
            f"(target {100 * self.target:.1f}%{'' if self.meets_target else ', NOT met: ' + ', '.join(self.capped)})"
        )


def _caps(s: LoopSettings) -> dict[str, float]:
    return {"min_tail": s.window, "min_match": 1.0, "min_compression": s.window / 2}


_SCORE_OF = {"min_tail": "exact", "min_match": "near", "min_compression": "compression"}


def _settings(ks: dict[str, int], scores: Sequence[HumanScores], base: LoopSettings) -> LoopSettings:
    """Thresholds: for each, the (k+1)-th highest human score plus the margin, never below the default nor above
    the cap."""
    t = {}
    for name, k in ks.items():
        values, default = sorted((getattr(sc, _SCORE_OF[name]) for sc in scores), reverse=True), getattr(base, name)
        top = values[k] + MARGINS[name] if k < len(values) else default
        t[name] = min(max(default, top), max(_caps(base)[name], default))
    return replace(base, min_tail=int(t["min_tail"]), min_match=t["min_match"], min_compression=t["min_compression"])


def _degenerate(scores: Sequence[HumanScores], s: LoopSettings) -> int:
    return sum(flags(sc, s)["degenerate"] for sc in scores)


def _search(scores: Sequence[HumanScores], base: LoopSettings, allowed: int) -> LoopSettings:
    """The loosest thresholds of the form quantile + margin whose union flags at most ``allowed`` sequences."""
    n = len(scores)
    common = 0
    for k in range(min(allowed, n), -1, -1):  # a common k first: the detectors treated alike
        if _degenerate(scores, _settings(dict.fromkeys(_SCORE_OF, k), scores, base)) <= allowed:
            common = k
            break
    ks = dict.fromkeys(_SCORE_OF, common)
    for name in ("min_compression", "min_match", "min_tail"):  # then loosen each as far as the union allows
        while ks[name] < n and _degenerate(scores, _settings({**ks, name: ks[name] + 1}, scores, base)) <= allowed:
            ks[name] += 1
    return _settings(ks, scores, base)


def calibrate_loop_settings(
    sequences: Sequence[Sequence[Hashable]],
    *,
    source: str,
    chars_unit: bool,
    base: LoopSettings | None = None,
    target: float = DEFAULT_TARGET,
) -> LoopCalibration:
    """Thresholds under which at most ``target`` of the human ``sequences`` are flagged degenerate (module doc).

    Every sequence must have the same length (the scan's number of new tokens).
    """
    base = base or LoopSettings()
    if not 0.0 <= target < 1.0:
        raise ValueError(f"target must be in [0, 1), got {target}")
    if len(sequences) < MIN_SEQUENCES:
        raise ValueError(f"calibration needs at least {MIN_SEQUENCES} human sequences, got {len(sequences)}")
    lengths = {len(s) for s in sequences}
    if len(lengths) != 1:
        raise ValueError(f"human sequences must all have the scan's length, got lengths {sorted(lengths)}")
    scores = [human_scores(s, base) for s in sequences]
    half = len(scores) // 2
    cal, held = scores[:half], scores[half:]
    allowed = int(target * len(cal) + _EPS)
    settings = base if _degenerate(cal, base) <= allowed else _search(cal, base, allowed)
    changed = [k for k in _SCORE_OF if getattr(settings, k) != getattr(base, k)]
    caps = _caps(base)
    return LoopCalibration(
        settings=settings,
        defaults=base,
        source=source,
        length=lengths.pop(),
        chars_unit=chars_unit,
        target=target,
        n=len(scores),
        n_calibrate=len(cal),
        n_heldout=len(held),
        calibration_fpr=human_rates(cal, settings),
        heldout_fpr=human_rates(held, settings),
        defaults_heldout_fpr=human_rates(held, base),
        changed=changed,
        meets_target=_degenerate(cal, settings) <= allowed,
        capped=[k for k in changed if getattr(settings, k) >= caps[k]],
    )
