"""Prompt sets for loop studies (the user's own, split by :func:`split_prompts`, or held-out Tang openings) and the
human text that calibrates the loop detectors. How the sets are drawn: docs/loop-repair.md ("Prompt sets").
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence


def slices(pool: Sequence[str], sizes: dict[str, int]) -> dict[str, list[str]]:
    """Consecutive, disjoint slices of ``pool``, one of each size, in order."""
    ends = itertools.accumulate(sizes.values())
    return {name: list(pool[end - n : end]) for (name, n), end in zip(sizes.items(), ends, strict=True)}


def read_text(path: str | os.PathLike, what: str) -> str:
    """The UTF-8 text of ``path``; a missing or non-UTF-8 file is refused, naming ``what`` it is."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} not found: {p}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {p} is not UTF-8 text ({exc.reason})") from None


def _text_lines(path: str | os.PathLike, what: str) -> tuple[Path, list[tuple[int, str]]]:
    """The path and its non-empty lines (stripped, numbered from 1)."""
    text = read_text(path, what)
    return Path(path), [(i, ln.strip()) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]


def _jsonl_prompt(p: Path, lineno: int, line: str) -> str:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: line {lineno} is not valid JSON ({exc.msg})") from None
    if isinstance(obj, str):
        return obj
    for key in ("prompt", "text"):
        if isinstance(obj, dict) and isinstance(obj.get(key), str):
            return obj[key]
    raise ValueError(f"{p}: line {lineno} has neither a 'prompt' nor a 'text' string field")


def read_prompt_file(path: str | os.PathLike) -> list[str]:
    """Prompts from a UTF-8 file: one per non-empty line, or JSONL (``.jsonl``, or every line a JSON object)
    with a "prompt" or "text" field. Empty prompts are refused."""
    p, lines = _text_lines(path, "prompt file")
    if not lines:
        raise ValueError(f"prompt file {p} is empty: it has no non-empty line")
    jsonl = p.suffix == ".jsonl" or all(ln.startswith("{") for _, ln in lines)
    prompts = [_jsonl_prompt(p, i, ln) for i, ln in lines] if jsonl else [ln for _, ln in lines]
    empty = [i for (i, _), t in zip(lines, prompts, strict=True) if not t.strip()]
    if empty:
        raise ValueError(f"{p}: line {empty[0]} holds an empty prompt; every prompt needs at least one character")
    return prompts


def split_prompts(prompts: Sequence[str], sizes: dict[str, int]) -> dict[str, list[str]]:
    """Disjoint, deterministic sets from the user's prompts (see module doc): sha256 order, proportional slices."""
    if not sizes or any(n < 1 for n in sizes.values()):
        raise ValueError(f"every set needs a size >= 1, got {sizes}")
    unique = list(dict.fromkeys(t for t in prompts))
    if len(unique) < len(sizes):
        raise ValueError(
            f"{len(unique)} distinct prompt(s) cannot fill {len(sizes)} disjoint sets "
            f"({', '.join(sizes)}); give at least {len(sizes)}"
        )
    ordered = sorted(unique, key=lambda t: hashlib.sha256(t.encode("utf-8")).hexdigest())
    total = sum(sizes.values())
    scale = min(1.0, len(ordered) / total)
    sets = slices(ordered, {k: max(1, int(n * scale)) for k, n in sizes.items()})
    empty = [name for name, s in sets.items() if not s]
    if empty:
        raise ValueError(f"{len(ordered)} distinct prompts leave the {empty[0]!r} set empty; give more prompts")
    return sets


# ---- human text for calibrating the loop detectors ------------------------------------------
HUMAN_COUNT = 1000  # human sequences to calibrate on (fewer when the source holds fewer)
TANG_PREFIX = 5


def is_cjk(texts: Sequence[str]) -> bool:
    """Whether the texts are Chinese: half or more of their non-space characters are Han."""
    from ..metrics.legit import is_han

    chars = [c for t in texts for c in t if not c.isspace()]
    return bool(chars) and 2 * sum(is_han(c) for c in chars) >= len(chars)


def _ids(tokenizer: Any, text: str) -> list[int]:
    stoi = getattr(tokenizer, "stoi", None)
    if getattr(tokenizer, "kind", None) == "char" and isinstance(stoi, dict):
        # Characters outside the vocabulary keep their identity (a negative id of their own) instead of all
        # becoming <unk>: human text is measured on what it says, and one <unk> id would fake repetition.
        return [stoi.get(c, -1 - ord(c)) for c in text]
    try:
        return list(tokenizer.encode(text, warn=False))  # the char tokenizer: no OOV warning for reference text
    except TypeError:
        return list(tokenizer.encode(text))


@functools.lru_cache(maxsize=1)
def _tang_human_poems() -> tuple[str, ...]:
    """The first half of the held-out poems (read once per process: the whole file is decompressed)."""
    from ..corpus.tang import DEFAULT_SUBWORD_POEMS, bundled_documents, corpus_split

    docs = bundled_documents()
    held = corpus_split(docs, DEFAULT_SUBWORD_POEMS).heldout  # = reference_split(), without reading twice
    return tuple(docs[held.start : held.start + len(held) // 2])


def tang_human_sequences(
    tokenizer: Any, length: int, count: int = HUMAN_COUNT, unk_id: int | None = None
) -> list[list[int]]:
    """Human Tang text: from each held-out poem's start + 5 characters (where a prompt would end), the next
    ``length`` tokens of the held-out stream (poems back to back, as the models read them).

    The poems are the first half of ``reference_split().heldout`` (poems 50,000 on): outside the training and
    validation text of both reference models and of the default prompt sets (poems after 4,003, or
    ``from_end`` from the last poem backwards). Sequences holding ``unk_id`` are skipped (the scans ban it).
    """
    poems = _tang_human_poems()
    streams = (p[TANG_PREFIX:] + "".join(poems[i + 1 : i + 1 + max(1, 4 * length // 20)]) for i, p in enumerate(poems))
    return _windows((_ids(tokenizer, s) for s in streams), length, count, unk_id, first_only=True)


def _windows(
    docs: Iterable[list[int]], length: int, count: int, unk_id: int | None, first_only: bool = False
) -> list[list[int]]:
    """Up to ``count`` consecutive ``length``-token windows of each document (its first only with ``first_only``);
    a window holding ``unk_id`` is skipped (the scans ban it)."""
    out: list[list[int]] = []
    for ids in docs:
        for start in range(0, len(ids) - length + 1, length):
            if unk_id is None or unk_id not in ids[start : start + length]:
                out.append(ids[start : start + length])
            if len(out) == count:
                return out
            if first_only:
                break
    return out


def human_sequences(
    tokenizer: Any,
    length: int,
    prompts: Sequence[str],
    *,
    human_text: str | os.PathLike | None = None,
    count: int = HUMAN_COUNT,
    unk_id: int | None = None,
) -> tuple[list[list[int]], str]:
    """Human sequences of ``length`` tokens and their source name: ``human_text`` (a file) when given, else
    held-out Tang poems for Chinese prompts, else the English corpus (which must have been fetched)."""
    if human_text is not None:  # one document per line: consecutive windows of each
        docs = (_ids(tokenizer, doc) for _, doc in _text_lines(human_text, "--human-text file")[1])
        seqs, source = _windows(docs, length, count, unk_id), f"file:{human_text}"
    elif is_cjk(prompts):
        seqs, source = tang_human_sequences(tokenizer, length, count, unk_id), "tang:heldout-poems"
    else:
        from ..corpus.english import SOURCE_NAME, human_continuations

        got = human_continuations(tokenizer, length, count)
        seqs, source = [c.ids for c in got if unk_id is None or unk_id not in c.ids], SOURCE_NAME
    if len(seqs) < 20:
        raise ValueError(
            f"{source} gives only {len(seqs)} human sequences of {length} tokens; calibration needs at least 20 "
            "(use a shorter --max-new-tokens, a longer --human-text, or --no-calibrate)"
        )
    return seqs, source
