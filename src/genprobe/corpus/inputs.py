"""The inputs every job reads when the user gives none: prompt sets and human text, chosen in one place by the
model's language (:func:`corpus_of`): Tang openings of poems the models never saw and held-out poems, or English
sentence openings and human-continuation documents of the Lee corpus (:mod:`genprobe.corpus.english`).

``loops scan``, ``doctor``, ``phenomena`` and the API functions all take their defaults from here; human text for
calibrating the loop detectors follows the prompts' script (:func:`human_sequences`).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .._io import read_text
from ..metrics.calibrate import MIN_SEQUENCES
from ..metrics.legit import is_cjk
from .tang import DEFAULT_POEMS, bundled_corpus_path, bundled_documents, read_documents

PUNCT = set("，。、；：？！「」『』（）《》□")
#: A Tang line; a model whose tokenizer spends at most one token per character on it was trained on Chinese.
TANG_PROBE = "床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。"
CORPORA = ("tang", "english")


def heldout_openings(
    tokenizer: Any,
    count: int,
    prefix_chars: int = 5,
    skip_poems: int = DEFAULT_POEMS,
    exclude_text: str | None = None,
    *,
    from_end: bool = False,
) -> list[str]:
    """The first ``count`` distinct usable ``prefix_chars``-character openings of poems after ``skip_poems``.

    Openings holding punctuation, a placeholder (□) or a character outside a char tokenizer's vocabulary (it would
    become ``<unk>``) are skipped, and so are openings found in ``exclude_text`` (default: the first ``skip_poems``
    poems, the bundled model's training and validation text: the same poem is sometimes recorded twice).
    ``from_end``: walk the bundled poems from the last one backwards (``skip_poems`` is then ignored and
    ``exclude_text`` must be given: the text the model was trained on).
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if prefix_chars < 1:
        raise ValueError(f"prefix_chars must be >= 1, got {prefix_chars}")
    if from_end and exclude_text is None:
        raise ValueError("from_end=True needs exclude_text: the text the model was trained on")
    out: list[str] = []
    seen: set[str] = set()
    if from_end:
        pool = bundled_documents()[::-1]
    else:
        docs = read_documents(bundled_corpus_path(), skip_poems + 40 * count + 1000)  # read only as far as needed
        if exclude_text is None:
            exclude_text = "".join(docs[:skip_poems])
        pool = docs[skip_poems:]
    assert exclude_text is not None  # from_end refuses None above; otherwise it defaults to the skipped poems
    vocab = getattr(tokenizer, "stoi", None)
    for doc in pool:
        head = doc[:prefix_chars]
        usable = len(head) == prefix_chars and not PUNCT & set(head) and (vocab is None or set(head) <= vocab.keys())
        if not usable or head in seen or head in exclude_text:
            continue
        seen.add(head)
        out.append(head)
        if len(out) == count:
            return out
    raise ValueError(f"only {len(out)} usable held-out openings found, {count} requested")


def default_prompts(model: Any, count: int) -> list[str]:
    """Held-out Tang openings for the bundled char model; any other model must be given prompts."""
    if model.tokenizer is None or model.tokenizer.kind != "char":
        raise ValueError("this model is not the bundled character model: pass prompts (a list of strings)")
    return heldout_openings(model.tokenizer, count)


def corpus_of(model: Any) -> str:
    """The corpus of the model's language: "tang" for the char tokenizer or a tokenizer that spends at most one
    token per character of a Tang line, else "english"."""
    if model.tokenizer is None:
        raise ValueError("the model has no tokenizer")
    chinese = model.tokenizer.kind == "char" or len(model.encode(TANG_PROBE)) <= len(TANG_PROBE)
    return "tang" if chinese else "english"


def vocab_key(model: Any) -> str:
    """What identifies the tokenizer: a char vocabulary's fingerprint (a property), else the model's directory."""
    return str(getattr(model.tokenizer, "fingerprint", None) or model.source)


@dataclass(frozen=True)
class Inputs:
    """Prompts and real texts, with where they came from."""

    prompts: list[str]
    texts: list[str]
    sources: dict = field(default_factory=dict)


_HELD_OUT: dict[tuple[Any, ...], Inputs] = {}  # (corpus, count, vocabulary) -> inputs: read once per process


def held_out(model: Any, corpus: str = "auto", count: int = 64) -> Inputs:
    """``count`` held-out prompts and the human texts of the model's corpus ("auto": :func:`corpus_of`): Tang
    openings and poems held out from both reference models (documents from ``reference_split().heldout_start``),
    or English sentence openings and the Lee corpus's human-continuation documents.

    Kept for the process (Tang openings depend on the char vocabulary, English ones on nothing): reading the corpus
    costs about a second.
    """
    corpus = corpus_of(model) if corpus == "auto" else corpus
    if corpus not in CORPORA:
        raise ValueError(f"corpus must be 'auto', 'tang' or 'english', got {corpus!r}")
    key = (corpus, count, vocab_key(model) if corpus == "tang" else None)
    if key not in _HELD_OUT:
        _HELD_OUT[key] = _read_held_out(model, corpus, count)
    return _HELD_OUT[key]


def _read_held_out(model: Any, corpus: str, count: int) -> Inputs:
    if corpus == "tang":
        from .tang import reference_split, split_texts

        split = reference_split()
        opens = heldout_openings(model.tokenizer, count, skip_poems=split.heldout_start)
        poems = split_texts(bundled_documents(), split).heldout
        # The first held-out poems gave the prompts: texts are read from the other end of the held-out range.
        return Inputs(opens, poems[::-1], {"corpus": "tang", "held_out_from": split.heldout_start})
    from .english import SOURCE_NAME, english_prompt_sets, english_split

    opens = english_prompt_sets({"phenomena": count})["phenomena"]
    return Inputs(opens, english_split().human, {"corpus": SOURCE_NAME})


def choose_inputs(
    model: Any,
    prompts: Sequence[str] | None = None,
    texts: Sequence[str] | None = None,
    corpus: str = "auto",
    count: int = 64,
) -> Inputs:
    """The given prompts and texts, each side independently defaulting to :func:`held_out` of ``corpus``."""
    if prompts is not None and texts is not None:
        return Inputs(list(prompts), list(texts))
    d = held_out(model, corpus, count)
    return Inputs(
        list(d.prompts if prompts is None else prompts), list(d.texts if texts is None else texts), dict(d.sources)
    )


def token_windows(
    encode: Callable[[str], list[int]], texts: Iterable[str], length: int, count: int
) -> list[tuple[str, list[int]]]:
    """The first ``count`` texts holding at least ``length`` tokens, each with its first ``length`` ids."""
    out: list[tuple[str, list[int]]] = []
    for text in texts:
        ids = encode(text)
        if len(ids) >= length:
            out.append((text, ids[:length]))
        if len(out) == count:
            break
    return out


# ---- the user's prompt files and sets (drawn as docs/loop-repair.md "Prompt sets" says) ---------------
def slices(pool: Sequence[str], sizes: dict[str, int]) -> dict[str, list[str]]:
    """Consecutive, disjoint slices of ``pool``, one of each size, in order."""
    ends = itertools.accumulate(sizes.values())
    return {name: list(pool[end - n : end]) for (name, n), end in zip(sizes.items(), ends, strict=True)}


def _text_lines(path: str | os.PathLike, what: str) -> list[tuple[int, str]]:
    """The non-empty lines of ``path`` (stripped, numbered from 1)."""
    return [(i, ln.strip()) for i, ln in enumerate(read_text(path, what).splitlines(), 1) if ln.strip()]


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
    p, lines = Path(path), _text_lines(path, "prompt file")
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


def _ids(tokenizer: Any, text: str) -> list[int]:
    stoi = getattr(tokenizer, "stoi", None)
    if getattr(tokenizer, "kind", None) == "char" and isinstance(stoi, dict):
        # Characters outside the vocabulary keep their identity (a negative id of their own) instead of all
        # becoming <unk>: human text is measured on what it says, and one <unk> id would fake repetition.
        return [stoi.get(c, -1 - ord(c)) for c in text]
    return list(tokenizer.encode(text))


@functools.lru_cache(maxsize=1)
def _tang_human_poems() -> tuple[str, ...]:
    """The first half of ``reference_split().heldout`` (poems 50,000 on): outside the training and validation text of
    both reference models and of the default prompt sets (poems after 4,003, or ``from_end`` from the last poem
    backwards). Read once per process: the whole file is decompressed."""
    from .tang import DEFAULT_SUBWORD_POEMS, bundled_documents, corpus_split

    docs = bundled_documents()
    held = corpus_split(docs, DEFAULT_SUBWORD_POEMS).heldout  # = reference_split(), without reading twice
    return tuple(docs[held.start : held.start + len(held) // 2])


def _windows(docs: Iterable[list[int]], length: int, unk_id: int | None, first_only: bool = False) -> list[list[int]]:
    """Up to :data:`HUMAN_COUNT` consecutive ``length``-token windows of each document (its first only with
    ``first_only``); a window holding ``unk_id`` is skipped (the scans ban it)."""
    out: list[list[int]] = []
    for ids in docs:
        for start in range(0, len(ids) - length + 1, length):
            if unk_id is None or unk_id not in ids[start : start + length]:
                out.append(ids[start : start + length])
            if len(out) == HUMAN_COUNT:
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
    unk_id: int | None = None,
) -> tuple[list[list[int]], str]:
    """Human sequences of ``length`` tokens and their source name: ``human_text`` (a file) when given, else
    held-out Tang poems for Chinese prompts, else the English corpus (which must have been fetched)."""
    if human_text is not None:  # one document per line: consecutive windows of each
        docs = (_ids(tokenizer, doc) for _, doc in _text_lines(human_text, "--human-text file"))
        seqs, source = _windows(docs, length, unk_id), f"file:{human_text}"
    elif is_cjk(prompts):  # from each poem's start + 5 characters (where a prompt would end), the next ``length``
        # tokens of the held-out stream (poems back to back, as the models read them)
        poems = _tang_human_poems()
        streams = (
            p[TANG_PREFIX:] + "".join(poems[i + 1 : i + 1 + max(1, 4 * length // 20)]) for i, p in enumerate(poems)
        )
        seqs = _windows((_ids(tokenizer, s) for s in streams), length, unk_id, first_only=True)
        source = "tang:heldout-poems"
    else:
        from .english import SOURCE_NAME, human_continuations

        got = human_continuations(tokenizer, length, HUMAN_COUNT)
        seqs, source = [c.ids for c in got if unk_id is None or unk_id not in c.ids], SOURCE_NAME
    if len(seqs) < MIN_SEQUENCES:
        raise ValueError(
            f"{source} gives only {len(seqs)} human sequences of {length} tokens; calibration needs at least "
            f"{MIN_SEQUENCES} (use a shorter --max-new-tokens, a longer --human-text, or --no-calibrate)"
        )
    return seqs, source
