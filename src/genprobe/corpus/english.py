"""English human text: the Lee corpus (350 ABC news articles) from gensim's test data, fetched once by
``genprobe fetch english`` (:func:`fetch_english_corpus`; nothing here downloads implicitly).

The documents, in sha256 order, fall into three disjoint groups: ``GROUP_DOCS`` for human continuations
(:func:`human_continuations`), as many for the validation prompt pool, the rest for every other prompt
set; a prompt is a sentence opening. Sources, sizes and the rules: docs/calibration.md ("The English corpus").
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..registry import PinnedWheel, cache_root, extract_member, fetch_wheel
from .tokenizer import encode_quiet

_GENSIM = dict(
    project="gensim",
    version="4.4.0",
    filename="gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
    sha256="91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8",
    license="LGPL-2.1-only",
)
LEE_BACKGROUND = PinnedWheel(member="gensim/test/test_data/lee_background.cor", **_GENSIM)  # 300 documents
LEE_RATED = PinnedWheel(member="gensim/test/test_data/lee.cor", **_GENSIM)  # 50 documents
ENGLISH_WHEELS = (LEE_BACKGROUND, LEE_RATED)
FETCH_COMMAND = "genprobe fetch english"
ENGLISH_PROVENANCE = (
    "Lee corpus: 350 ABC (Australian Broadcasting Corporation) news articles collected by Lee, Pincombe & Welsh "
    "(2005), as shipped in gensim 4.4.0's test data (gensim/test/test_data/lee_background.cor, lee.cor) inside "
    f"the pinned wheel {_GENSIM['filename']} (sha256 {_GENSIM['sha256']}); wheel licence LGPL-2.1-only"
)
SOURCE_NAME = "english:lee-corpus"

GROUP_DOCS = 96  # documents of the human-continuation group, and of the validation group
DEFAULT_PROMPT_WORDS = 10
VALIDATION_SET_NAMES = ("validate", "validation")  # prompt sets cut from the validation pool
# Abbreviations after which a full stop does not end a sentence (enough for news text).
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "st", "sen", "gen", "lt", "col", "sgt", "prof", "rev", "no", "jr", "sr"}
_SENTENCE_END = re.compile(r"(?<=[.!?])([\"')\]]*)\s+(?=[\"'(\[]?[A-Z0-9])")


class EnglishCorpusMissing(FileNotFoundError):
    """The English corpus has not been fetched (the message names the fetch command)."""


def english_corpus_dir(cache: Path | None = None) -> Path:
    """Where the fetched corpus files live: ``<cache>/data/lee-corpus``."""
    return (cache or cache_root()) / "data" / "lee-corpus"


def _member_paths(cache: Path | None) -> list[Path]:
    return [english_corpus_dir(cache) / Path(w.member).name for w in ENGLISH_WHEELS]


def fetch_english_corpus(cache: Path | None = None, quiet: bool = False) -> list[Path]:
    """The explicit setup step: download the pinned gensim wheel (once, sha256-checked) and extract both files.

    Idempotent: files already extracted are kept and the wheel is not fetched again.
    """
    paths = _member_paths(cache)
    if all(p.is_file() for p in paths):
        return paths
    wheel_path = fetch_wheel(LEE_BACKGROUND, cache, quiet=quiet)  # one wheel holds both members
    for w, p in zip(ENGLISH_WHEELS, paths, strict=True):
        extract_member(w, wheel_path, p)
    return paths


def english_documents(cache: Path | None = None) -> list[str]:
    """The 350 documents (background first, then the rated 50), whitespace normalised; never downloads."""
    paths = _member_paths(cache)
    if missing := [p for p in paths if not p.is_file()]:
        raise EnglishCorpusMissing(
            f"the English corpus is not fetched ({missing[0]} is missing): run `{FETCH_COMMAND}` once "
            "(it downloads the pinned gensim wheel from the package registry)"
        )
    docs = []
    for p in paths:
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # lee.cor is ISO-8859-1 (one pound sign)
            text = p.read_text(encoding="latin-1")
        docs += [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    return docs


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class EnglishSplit:
    """The three disjoint document groups (see the module doc)."""

    human: list[str]
    validation: list[str]
    search: list[str]


def english_split(documents: Sequence[str] | None = None) -> EnglishSplit:
    """Documents in sha256 order, cut into human / validation / search groups (duplicates dropped)."""
    docs = list(dict.fromkeys(english_documents() if documents is None else documents))
    ordered = sorted(docs, key=_sha)
    if len(ordered) < 3:
        raise ValueError(f"the English split needs at least 3 distinct documents, got {len(ordered)}")
    n = GROUP_DOCS if len(ordered) > 2 * GROUP_DOCS else len(ordered) // 3  # a smaller (test) corpus: thirds
    return EnglishSplit(ordered[:n], ordered[n : 2 * n], ordered[2 * n :])


def sentences(document: str) -> list[str]:
    """Sentences of one document: split after . ! ? (closing quotes kept) before a capital or digit,
    except after a known abbreviation (Mr., Dr., ...) or a single capital (initials)."""
    out: list[str] = []
    start = 0
    for m in _SENTENCE_END.finditer(document):
        before = document[start : m.start()].rsplit(None, 1)
        last = before[-1].rstrip(".!?").lower() if before else ""
        if last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha()):
            continue
        out.append(document[start : m.end(1)].strip())
        start = m.end()
    out.append(document[start:].strip())
    return [s for s in out if s]


def _openings(documents: Sequence[str], prompt_words: int) -> list[str]:
    """Distinct sentence openings of ``documents`` in sha256 order (sentences of >= prompt_words + 2 words)."""
    heads = []
    for doc in documents:
        for sent in sentences(doc):
            words = sent.split()
            if len(words) >= prompt_words + 2:
                heads.append(" ".join(words[:prompt_words]))
    return sorted(set(heads), key=_sha)


def english_prompt_sets(sizes: dict[str, int], *, prompt_words: int = DEFAULT_PROMPT_WORDS) -> dict[str, list[str]]:
    """Disjoint prompt sets of sentence openings, e.g. ``{"search": 1024, "validate": 512}``.

    Sets named in ``VALIDATION_SET_NAMES`` are cut from the validation pool, every other set from the search pool; the
    two pools come from different documents, and neither from the human-continuation documents.
    """
    if not sizes or any(n < 1 for n in sizes.values()):
        raise ValueError(f"every prompt set needs a size >= 1, got {sizes}")
    if prompt_words < 1:
        raise ValueError(f"prompt_words must be >= 1, got {prompt_words}")
    split, sets = english_split(), dict.fromkeys(sizes, list[str]())
    for pool, docs in (("validation", split.validation), ("search", split.search)):
        wanted = {k: n for k, n in sizes.items() if (k in VALIDATION_SET_NAMES) == (pool == "validation")}
        openings = _openings(docs, prompt_words)
        if sum(wanted.values()) > len(openings):
            raise ValueError(
                f"the English {pool} pool has {len(openings)} distinct {prompt_words}-word openings; "
                f"sets {wanted} ask for {sum(wanted.values())}"
            )
        for (name, n), end in zip(wanted.items(), itertools.accumulate(wanted.values()), strict=True):
            sets[name] = openings[end - n : end]
    return sets


@dataclass(frozen=True)
class HumanContinuation:
    """A real continuation: a sentence opening and the next ``length`` tokens of its document."""

    prompt: str
    ids: list[int]
    text: str


def human_continuations(
    tokenizer: Any, length: int, count: int, *, prompt_words: int = DEFAULT_PROMPT_WORDS
) -> list[HumanContinuation]:
    """Up to ``count`` continuations of exactly ``length`` tokens from the human-continuation documents.

    Each starts after a sentence opening of ``prompt_words`` words and runs on through the document (across
    sentences); sentences whose document ends before ``length`` tokens are skipped. Fewer than ``count`` when the
    documents hold fewer (the caller sees ``len``). Ordered by document (sha256) then position: deterministic.
    """
    if length < 1 or count < 1:
        raise ValueError(f"length and count must be >= 1, got length={length}, count={count}")
    out: list[HumanContinuation] = []
    for doc in english_split().human:
        pos = 0
        for sent in sentences(doc):
            at = doc.index(sent, pos)
            pos = at + len(sent)
            words = sent.split()
            if len(words) < prompt_words + 2:
                continue
            prompt = " ".join(words[:prompt_words])
            rest = doc[at:].split(None, prompt_words)[-1]  # the document after the opening's words
            ids = encode_quiet(tokenizer, " " + rest)[:length]
            if len(ids) == length:
                out.append(HumanContinuation(prompt, ids, tokenizer.decode(ids)))
            if len(out) == count:
                return out
    return out
