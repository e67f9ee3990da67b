"""A judge that did not write the text and cannot be flattered by repetition: a character n-gram model of human text.

``loops compare --judge ngram:FILE`` (or ``ngram:english``) when no second model of the language ships: it has no
memory beyond ``order - 1`` characters, so a repeating continuation earns no credit. Interpolated Witten–Bell
smoothing (Chen & Goodman 1998, §2.4) down to a uniform distribution over the alphabet plus one unseen slot.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Sequence

from .._io import read_text
from .compare_human import TextScore

DEFAULT_ORDER = 5


class CharNgramJudge:
    """Character n-gram model of human text; scores continuations given their prompts."""

    def __init__(self, documents: Sequence[str], order: int = DEFAULT_ORDER, source: str = "ngram"):
        if order < 1:
            raise ValueError(f"n-gram order must be >= 1, got {order}")
        text = "\n".join(d for d in documents if d)
        if len(text) < 1000:
            raise ValueError(f"the n-gram judge needs at least 1,000 characters of human text, got {len(text)}")
        self.order, self.source = order, f"{source} (char {order}-gram, Witten-Bell)"
        self.alphabet = set(text)
        self.counts: dict[str, Counter[str]] = defaultdict(Counter)  # history (0..order-1 chars) -> next char
        for i, ch in enumerate(text):
            for n in range(order):
                if i - n < 0:
                    break
                self.counts[text[i - n : i]][ch] += 1
        self.totals = {h: sum(c.values()) for h, c in self.counts.items()}

    def prob(self, history: str, ch: str) -> float:
        """P(ch | the last order-1 characters of history), interpolated down to the uniform distribution."""
        p = 1.0 / (len(self.alphabet) + 1)
        for n in range(min(len(history), self.order - 1) + 1):
            h = history[len(history) - n :] if n else ""
            seen = self.counts.get(h)
            if not seen:
                break  # a longer history was never seen either
            types, total = len(seen), self.totals[h]
            p = (seen.get(ch, 0) + types * p) / (total + types)
        return p

    def nll(self, prompt: str, continuation: str) -> float:
        """Summed NLL (nats) of ``continuation`` given ``prompt``."""
        text = prompt + continuation
        start = len(prompt)
        return -sum(math.log(self.prob(text[max(0, i - self.order + 1) : i], text[i])) for i in range(start, len(text)))

    def score(self, prompts: Sequence[str], continuations: Sequence[str | None]) -> list[TextScore | None]:
        """One :class:`TextScore` per continuation (None where there is none), as a model judge gives."""
        return [
            TextScore(self.nll(p, c), len(c), len(c), sum(ch not in self.alphabet for ch in c), False) if c else None
            for p, c in zip(prompts, continuations, strict=True)
        ]


NGRAM_PREFIX = "ngram:"


def ngram_judge(spec: str, order: int = DEFAULT_ORDER) -> CharNgramJudge:
    """``ngram:english`` (the English corpus's search documents, fetched by ``genprobe fetch english``) or
    ``ngram:FILE`` (UTF-8 human text, one document per line)."""
    what = spec[len(NGRAM_PREFIX) :]
    if what == "english":
        from ..corpus.english import english_split

        return CharNgramJudge(english_split().search, order, "english:lee-corpus search documents")
    lines = read_text(what, "--judge ngram:FILE (or ngram:english): file").splitlines()
    return CharNgramJudge([ln for ln in lines if ln.strip()], order, f"file:{what}")
