"""The one inputs module (issue #45): every job's default prompts and human text are chosen in
``genprobe.corpus.inputs`` by the model's language and tokenizer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from genprobe.corpus import inputs
from genprobe.corpus.inputs import TANG_PROBE, Inputs, choose_inputs, corpus_of, default_prompts, token_windows


def _subword(tokens_per_char: int, source: str = "dir") -> SimpleNamespace:
    """A model whose tokenizer spends ``tokens_per_char`` tokens on every character."""
    return SimpleNamespace(
        tokenizer=SimpleNamespace(kind="hf"), encode=lambda t: [0] * (tokens_per_char * len(t)), source=source
    )


def test_the_language_follows_the_tokenizer(tokenizer):
    assert corpus_of(SimpleNamespace(tokenizer=tokenizer)) == "tang"  # the char model
    assert corpus_of(_subword(1)) == "tang"  # at most one token per Chinese character: trained on Chinese
    assert corpus_of(_subword(2)) == "english"
    with pytest.raises(ValueError, match="no tokenizer"):
        corpus_of(SimpleNamespace(tokenizer=None))
    assert len(TANG_PROBE) > 20


def test_default_prompts_are_held_out_openings_for_the_char_model_only(tokenizer):
    got = default_prompts(SimpleNamespace(tokenizer=tokenizer), 4)
    assert len(got) == 4 == len(set(got)) and all(len(p) == 5 for p in got)
    assert all(c in tokenizer.stoi for p in got for c in p)  # no opening would encode to <unk>
    with pytest.raises(ValueError, match="pass prompts"):
        default_prompts(_subword(2), 4)


def test_each_side_defaults_independently(monkeypatch):
    calls = []

    def held_out(model, corpus="auto", count=64):
        calls.append((corpus, count))
        return Inputs(["held-out prompt"], ["held-out text"], {"corpus": "english:lee-corpus"})

    monkeypatch.setattr(inputs, "held_out", held_out)
    model = _subword(2)
    assert choose_inputs(model, ["p"], ["t"]) == Inputs(["p"], ["t"], {})
    assert not calls  # both given: the corpus is never read
    got = choose_inputs(model, ["p"], None, "english", 8)
    assert got == Inputs(["p"], ["held-out text"], {"corpus": "english:lee-corpus"}) and calls == [("english", 8)]
    assert choose_inputs(model, None, ["t"]).prompts == ["held-out prompt"]


def test_held_out_inputs_are_read_once_per_corpus_count_and_vocabulary(monkeypatch):
    reads = []
    monkeypatch.setattr(inputs, "_HELD_OUT", {})
    monkeypatch.setattr(inputs, "_read_held_out", lambda m, c, n: reads.append((m.source, c, n)) or Inputs([], []))
    a, b = _subword(1, "a"), _subword(1, "b")
    inputs.held_out(a, count=4)
    inputs.held_out(a, count=4)
    inputs.held_out(b, count=4)  # Tang openings depend on the vocabulary: another model reads again
    inputs.held_out(a, "english", 4)
    inputs.held_out(b, "english", 4)  # English ones do not
    assert reads == [("a", "tang", 4), ("b", "tang", 4), ("a", "english", 4)]
    with pytest.raises(ValueError, match="corpus must be"):
        inputs.held_out(a, "latin", 4)


def test_token_windows_take_the_first_long_enough_texts():
    encode = lambda t: list(range(len(t)))  # noqa: E731
    assert token_windows(encode, ["abc", "a", "abcd", "abcdef"], 3, 2) == [("abc", [0, 1, 2]), ("abcd", [0, 1, 2])]
    assert token_windows(encode, ["a"], 3, 2) == []
