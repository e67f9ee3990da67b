"""The inputs every job reads when the user gives none: prompt sets and human text, chosen in one place by the
model's language (:func:`corpus_of`): Tang openings of poems the models never saw and held-out poems, or English
sentence openings and human-continuation documents of the Lee corpus (:mod:`genprobe.corpus.english`).

``loops scan``, ``doctor``, ``phenomena`` and the API functions all take their defaults from here; human text for
calibrating the loop detectors follows the prompts' script (:func:`genprobe.loops.prompts.human_sequences`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

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
