"""Prompt sets for loop scans: openings of Tang poems the default model never saw.

The default corpus is the first 4,003 poems of the bundled file (its last 10% of characters is the
validation split). Poems after those 4,003 are outside both training and validation text, so their
openings are clean held-out prompts. Sets are drawn in file order, deduplicated, and skip openings
holding a character outside the vocabulary (it would become ``<unk>``) or a placeholder (□), and
openings that occur anywhere in the default corpus text (the same poem is sometimes recorded
twice, and a few openings are stock phrases) — so the model never saw any prompt verbatim.
Consecutive, disjoint slices give the scan / search / validation sets.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..corpus.tang import DEFAULT_POEMS, _read_jsonl, bundled_corpus_path

PUNCT = set("，。、；：？！「」『』（）《》□")


def heldout_openings(
    tokenizer, count: int, prefix_chars: int = 5, skip_poems: int = DEFAULT_POEMS, exclude_text: str | None = None
) -> list[str]:
    """The first ``count`` distinct usable ``prefix_chars``-character openings of poems after ``skip_poems``.

    ``exclude_text`` (default: the first ``skip_poems`` poems) — openings found in it are skipped.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if prefix_chars < 1:
        raise ValueError(f"prefix_chars must be >= 1, got {prefix_chars}")
    out: list[str] = []
    seen: set[str] = set()
    limit = skip_poems + 40 * count + 1000  # read only as far as needed
    docs = _read_jsonl(bundled_corpus_path(), limit)
    if exclude_text is None:
        exclude_text = "".join(docs[:skip_poems])
    for doc in docs[skip_poems:]:
        head = doc[:prefix_chars]
        if len(head) < prefix_chars or head in seen:
            continue
        vocab = getattr(tokenizer, "stoi", None)
        if any(ch in PUNCT for ch in head) or (vocab is not None and any(ch not in vocab for ch in head)):
            continue
        if head in exclude_text:
            continue
        seen.add(head)
        out.append(head)
        if len(out) == count:
            return out
    raise ValueError(f"only {len(out)} usable held-out openings found, {count} requested")


def prompt_sets(tokenizer, sizes: dict[str, int], prefix_chars: int = 5) -> dict[str, list[str]]:
    """Disjoint consecutive slices, e.g. ``{"scan": 256, "search": 64, "validate": 256}`` (order kept)."""
    total = sum(sizes.values())
    pool = heldout_openings(tokenizer, total, prefix_chars)
    sets, i = {}, 0
    for name, n in sizes.items():
        sets[name] = pool[i : i + n]
        i += n
    return sets


def read_prompt_file(path: str | os.PathLike) -> list[str]:
    """One prompt per non-empty line (UTF-8)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"prompt file not found: {p}")
    try:
        lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p} is not UTF-8 text ({exc.reason})") from None
    prompts = [ln for ln in lines if ln]
    if not prompts:
        raise ValueError(f"prompt file {p} has no non-empty line")
    return prompts
