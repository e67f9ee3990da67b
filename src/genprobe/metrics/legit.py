"""Repetition a text genre needs, measured so that a loop fix can be charged for destroying it: Tang reduplication
(疊字) and stutter, couplet parallels and copied couplets (rates per 100 Han characters with bootstrap intervals),
and the repeated n-gram share of other genres. The rules: docs/which-fix.md, "Legitimate repetition".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import groupby
from typing import Sequence

import numpy as np

from .ngrams import ngrams

LINE_ENDS = "，。？！；"
NGRAM_N = 4
BOOTSTRAP = 1000


def is_han(ch: str) -> bool:
    """True for a CJK ideograph (unified, extension A, compatibility, supplementary planes)."""
    o = ord(ch)
    return 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0xF900 <= o <= 0xFAFF or 0x20000 <= o <= 0x3134F


def reduplications(text: str) -> tuple[int, int]:
    """(reduplications, stutter runs): maximal runs of one Han character of length exactly 2, and of length >= 3."""
    runs = [len(list(run)) for ch, run in groupby(text) if is_han(ch)]
    return sum(n == 2 for n in runs), sum(n >= 3 for n in runs)


def poem_lines(text: str) -> list[str]:
    """Complete lines: the text between line-ending marks, each followed by one (a trailing fragment is dropped)."""
    return re.findall(f"([^{LINE_ENDS}]+)[{LINE_ENDS}]", text)


def couplet_parallels(text: str) -> tuple[int, int, int]:
    """(parallel repeats, copied couplets, couplets) over couplets (line 2k, line 2k+1) of ``text``.

    A parallel repeat is a Han character at offset j of both lines of a couplet; a couplet whose lines
    are equal or share more than half of their positions is copied, and its repeats are not parallels.
    """
    lines = poem_lines(text)
    parallel = copied = 0
    couplets = len(lines) // 2
    for k in range(couplets):
        a, b = lines[2 * k], lines[2 * k + 1]
        same = sum(1 for x, y in zip(a, b, strict=False) if x == y and is_han(x))
        if a == b or 2 * same > min(len(a), len(b)):
            copied += 1
        else:
            parallel += same
    return parallel, copied, couplets


def is_cjk(texts: Sequence[str]) -> bool:
    """Whether the texts are Chinese: half or more of their non-space characters are Han."""
    chars = [c for t in texts for c in t if not c.isspace()]
    return bool(chars) and 2 * sum(is_han(c) for c in chars) >= len(chars)


def ngram_units(text: str) -> list[str]:
    """Characters (spaces dropped) for Chinese text (:func:`is_cjk`), else whitespace-separated words."""
    return [c for c in text if not c.isspace()] if is_cjk([text]) else text.split()


@dataclass(frozen=True)
class LegitCounts:
    """Event counts of one text (see the module doc)."""

    han: int
    reduplicated: int
    stutter: int
    parallel: int
    copied_couplets: int
    couplets: int
    ngrams: int
    repeated_ngrams: int


def legit_counts(poem: str, continuation: str | None = None, n: int = NGRAM_N) -> LegitCounts:
    """Counts of ``poem`` (the whole text, prompt included, so couplets line up); n-grams of ``continuation``
    (default: the whole text)."""
    grams = ngrams(ngram_units(poem if continuation is None else continuation), n)
    han = sum(1 for c in poem if is_han(c))
    return LegitCounts(han, *reduplications(poem), *couplet_parallels(poem), len(grams), len(grams) - len(set(grams)))


@dataclass
class LegitRates:
    """Pooled genre-repetition rates of a set of texts (per 100 Han characters; shares in [0, 1])."""

    n_texts: int
    han_chars: int
    reduplication_per100: float | None
    reduplication_ci95: list[float] | None
    stutter_per100: float | None
    parallel_per100: float | None
    parallel_ci95: list[float] | None
    copied_couplet_share: float | None
    repeated_ngram_rate: float | None
    repeated_ngram_ci95: list[float] | None
    ngram_n: int = NGRAM_N


def _pooled(events: np.ndarray, totals: np.ndarray, scale: float, seed: int) -> tuple[float | None, list[float] | None]:
    """Pooled ratio sum(events)/sum(totals)·scale and a percentile bootstrap 95% interval over texts."""
    if totals.sum() == 0:
        return None, None
    rate = float(events.sum() / totals.sum() * scale)
    idx = np.random.default_rng(seed).integers(0, len(events), size=(BOOTSTRAP, len(events)))
    tot = totals[idx].sum(1)
    boot = events[idx].sum(1)[tot > 0] / tot[tot > 0] * scale
    return rate, [float(v) for v in np.percentile(boot, [2.5, 97.5])]


def legit_rates(counts: Sequence[LegitCounts], seed: int = 0) -> LegitRates:
    """Pool per-text counts into rates with bootstrap intervals (None where nothing could be counted)."""
    col = {k: np.array([getattr(c, k) for c in counts], dtype=np.float64) for k in LegitCounts.__dataclass_fields__}
    han = col["han"]
    redup, redup_ci = _pooled(col["reduplicated"], han, 100.0, seed)
    stutter, _ = _pooled(col["stutter"], han, 100.0, seed)
    parallel, parallel_ci = _pooled(col["parallel"], han, 100.0, seed)
    copied = float(col["copied_couplets"].sum() / col["couplets"].sum()) if col["couplets"].sum() else None
    rep, rep_ci = _pooled(col["repeated_ngrams"], col["ngrams"], 1.0, seed)
    return LegitRates(len(counts), int(han.sum()), redup, redup_ci, stutter, parallel, parallel_ci, copied, rep, rep_ci)
