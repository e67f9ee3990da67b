"""Human texts to compare generations with (a JSONL prompts file's ``"continuation"`` fields, else the bundled
Tang poem each prompt opens) and their genre; fluency as NLL per character, each text encoded by the scoring model's
own tokenizer (a prompt + continuation past the context is cut and counted), or under :class:`CharNgramJudge`.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from .._io import read_text
from ..corpus.tang import bundled_documents
from ..corpus.tokenizer import encode_quiet
from .regress import forward_logits, pad_right

TANG_SHARE = 0.8
GENRES = ("auto", "tang", "text")
NO_HUMAN = (
    "no human texts: the prompts file gives no 'continuation' field (JSONL) and the prompts are not "
    "openings of bundled Tang poems"
)


def read_continuations(path: str | os.PathLike) -> list[str | None] | None:
    """The ``"continuation"`` of every line of a JSONL prompts file (None where a line has none); None if none has."""
    p = Path(path)
    lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not (p.suffix == ".jsonl" or all(ln.startswith("{") for ln in lines)):
        return None
    objs = [json.loads(ln) for ln in lines]
    conts = [
        o.get("continuation") if isinstance(o, dict) and isinstance(o.get("continuation"), str) else None for o in objs
    ]
    return conts if any(c is not None for c in conts) else None


@dataclass
class HumanTexts:
    """Human texts aligned with the prompts (prompt included; None where there is none), their source and genre."""

    poems: list[str | None]
    genre: str
    source: str | None
    reason: str | None = None


def human_texts(prompts: Sequence[str], continuations: Sequence[str | None] | None, genre: str = "auto") -> HumanTexts:
    """Resolve the genre and the human texts (see the module doc)."""
    if genre not in GENRES:
        raise ValueError(f"genre must be one of {GENRES}, got {genre!r}")
    if continuations is not None and len(continuations) != len(prompts):
        raise ValueError(f"{len(continuations)} continuations for {len(prompts)} prompts; give one per prompt")
    first: dict[str, str] = {}  # each prompt's first bundled Tang poem (that starts with it)
    wanted = {len(p) for p in prompts}
    for poem in bundled_documents() if genre != "text" else ():
        for n in wanted:
            first.setdefault(poem[:n], poem)
    lookup = [first.get(p) for p in prompts]
    if genre == "auto":
        found = sum(p is not None for p in lookup)
        genre = "tang" if prompts and found >= TANG_SHARE * len(prompts) else "text"
    if continuations is not None:
        poems = [None if c is None else p + c for p, c in zip(prompts, continuations, strict=True)]
        return HumanTexts(poems, genre, "prompts file: 'continuation' field")
    if genre == "tang" and any(p is not None for p in lookup):
        return HumanTexts(lookup, genre, "bundled Tang corpus: the poem each prompt opens")
    return HumanTexts([None] * len(prompts), genre, None, NO_HUMAN)


# ---- fluency ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TextScore:
    """Summed NLL (nats) of one continuation's scored tokens, its scored characters and tokens."""

    nll: float
    chars: int
    tokens: int
    unk: int
    truncated: bool


@dataclass
class Fluency:
    """Pooled NLL per character of a set of continuations under one model."""

    model: str
    nll_per_char: float | None
    texts: int
    chars: int
    unk_share: float  # share of scored tokens that are the scoring tokenizer's unknown token
    truncated: int


def score_continuations(
    model: Any, prompts: Sequence[str], continuations: Sequence[str | None], batch_size: int = 64
) -> list[TextScore | None]:
    """NLL of each continuation given its prompt under ``model`` (a loaded Model, or a judge with its own
    ``score``, e.g. :class:`CharNgramJudge`); None where nothing is scored."""
    if not hasattr(model, "module") and callable(getattr(model, "score", None)):
        judged: list[TextScore | None] = model.score(prompts, continuations)
        return judged
    tok, limit, unk = model.tokenizer, model.max_positions, model.unk_id
    scored: dict[int, tuple[list[int], list[int], int, bool]] = {}  # prompt ids, continuation ids, chars, truncated
    for i, (prompt, cont) in enumerate(zip(prompts, continuations, strict=True)):
        p, c, cut = encode_quiet(tok, prompt), encode_quiet(tok, cont) if cont is not None else [], False
        if limit is not None and len(p) + len(c) > limit:
            c, cut = c[: max(0, limit - len(p))], True
        if p and c and cont is not None:
            scored[i] = (p, c, (len(c) if tok.kind == "char" else len(tok.decode(c))) if cut else len(cont), cut)
    order = sorted(scored, key=lambda i: len(scored[i][0]) + len(scored[i][1]))
    out: list[TextScore | None] = [None] * len(prompts)
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        ids, _ = pad_right([scored[i][0] + scored[i][1] for i in idx], model.pad_id)
        with torch.no_grad():
            logp = F.log_softmax(forward_logits(model.module, ids)[:, :-1].float(), dim=-1)
        tok_logp = logp.gather(-1, ids[:, 1:, None])[..., 0]
        for row, i in enumerate(idx):
            p, c, chars, cut = scored[i]
            nll = -float(tok_logp[row, len(p) - 1 : len(p) + len(c) - 1].sum())
            out[i] = TextScore(nll, chars, len(c), sum(1 for t in c if t == unk) if unk is not None else 0, cut)
    return out


def fluency(name: str, scores: Sequence[TextScore | None]) -> Fluency:
    """Pool text scores: total NLL / total characters."""
    got = [s for s in scores if s is not None]
    chars, tokens = sum(s.chars for s in got), sum(s.tokens for s in got)
    return Fluency(
        name,
        sum(s.nll for s in got) / chars if chars else None,
        len(got),
        chars,
        sum(s.unk for s in got) / tokens if tokens else 0.0,
        sum(s.truncated for s in got),
    )


# ---- the n-gram judge: it did not write the text and cannot be flattered by repetition ----------
DEFAULT_ORDER = 5


class CharNgramJudge:
    """Character n-gram model of human text (``loops compare --judge ngram:FILE``): no memory beyond ``order - 1``
    characters, so a repeating continuation earns no credit; interpolated Witten–Bell smoothing (Chen & Goodman 1998,
    §2.4) down to a uniform distribution over the alphabet plus one unseen slot."""

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
