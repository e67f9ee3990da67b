"""Human texts to compare generations with and the genre that decides what legitimate repetition means: a JSONL
prompts file's ``"continuation"`` fields, else (``tang`` genre) the bundled poem each prompt opens, else none.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..corpus.tang import bundled_documents

TANG_SHARE = 0.8
GENRES = ("auto", "tang", "text")
NO_HUMAN = (
    "no human texts: the prompts file gives no 'continuation' field (JSONL) and the prompts are not "
    "openings of bundled Tang poems"
)


def read_continuations(path: str | os.PathLike) -> list[str | None] | None:
    """The ``"continuation"`` of every prompt line of a JSONL prompts file (None where a line has none);
    None when the file is not JSONL or no line has one. Lines align with ``read_prompt_file``."""
    p = Path(path)
    lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not (p.suffix == ".jsonl" or all(ln.startswith("{") for ln in lines)):
        return None
    objs = [json.loads(ln) for ln in lines]
    conts = [
        o.get("continuation") if isinstance(o, dict) and isinstance(o.get("continuation"), str) else None for o in objs
    ]
    return conts if any(c is not None for c in conts) else None


def bundled_poems_for(prompts: Sequence[str]) -> list[str | None]:
    """The first bundled Tang poem that starts with each prompt (None when none does)."""
    poems = bundled_documents()
    wanted = {len(p) for p in prompts}
    first: dict[str, str] = {}
    for poem in poems:
        for n in wanted:
            first.setdefault(poem[:n], poem)
    return [first.get(p) for p in prompts]


@dataclass
class HumanTexts:
    """Human texts aligned with the prompts (prompt included; None where there is none), their source and genre."""

    poems: list[str | None]
    genre: str
    source: str | None
    reason: str | None = None

    @property
    def available(self) -> int:
        """How many prompts have a human text."""
        return sum(p is not None for p in self.poems)


def human_texts(prompts: Sequence[str], continuations: Sequence[str | None] | None, genre: str = "auto") -> HumanTexts:
    """Resolve the genre and the human texts (see the module doc)."""
    if genre not in GENRES:
        raise ValueError(f"genre must be one of {GENRES}, got {genre!r}")
    if continuations is not None and len(continuations) != len(prompts):
        raise ValueError(f"{len(continuations)} continuations for {len(prompts)} prompts; give one per prompt")
    lookup: list[str | None] = bundled_poems_for(prompts) if genre != "text" else [None] * len(prompts)
    if genre == "auto":
        found = sum(p is not None for p in lookup)
        genre = "tang" if prompts and found >= TANG_SHARE * len(prompts) else "text"
    if continuations is not None:
        poems = [None if c is None else p + c for p, c in zip(prompts, continuations, strict=True)]
        return HumanTexts(poems, genre, "prompts file: 'continuation' field")
    if genre == "tang" and any(p is not None for p in lookup):
        return HumanTexts(lookup, genre, "bundled Tang corpus: the poem each prompt opens")
    return HumanTexts([None] * len(prompts), genre, None, NO_HUMAN)
