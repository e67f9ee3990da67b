"""The one corpus split (genprobe.corpus.tang.corpus_split): the char GPT's validation text and the
held-out poems are never subword training text, and the validation cut is load_corpus's own."""

from __future__ import annotations

import json

import pytest

from genprobe._io import json_safe
from genprobe.corpus.tang import (
    DEFAULT_POEMS,
    bundled_documents,
    corpus_split,
    load_corpus,
    reference_split,
    split_texts,
)


@pytest.fixture(scope="module")
def docs():
    return bundled_documents()


@pytest.fixture(scope="module")
def ref(docs):
    split = reference_split()
    return split, split_texts(docs, split)


def test_reference_split_ranges(ref):
    split, _ = ref
    d = json_safe(split)
    assert d["documents"] == 57607 and d["char_poems"] == DEFAULT_POEMS
    assert (d["char_val_start"], d["char_val_offset"]) == (3604, 33)  # the 90% cut falls inside poem 3604
    assert d["subword_train"] == [[0, 3604], [4003, 50000]]
    assert d["char_val"] == [3604, 4003] and d["heldout"] == [50000, 57607]
    assert split.heldout_start == 50000


def test_char_validation_text_is_exactly_load_corpus_val(ref):
    _, texts = ref
    assert texts.char_val_text == load_corpus().val
    assert "".join(texts.char_val_documents) == texts.char_val_text


def test_no_protected_text_in_subword_training(docs, ref):
    """No training document equals a char-validation poem (whole, incl. the partial one) or a held-out poem.

    The corpus records some poems twice, so index ranges alone are not enough: exact copies are dropped.
    """
    split, texts = ref
    protected = {docs[i] for i in split.char_val} | {docs[i] for i in split.heldout}
    train = set(texts.train)
    assert not train & protected
    assert texts.duplicates_dropped > 0  # the reference split has copies to drop (17)
    assert texts.heldout == docs[50000:]
    train_idx = {i for r in split.subword_train for i in r}
    assert not train_idx & set(split.char_val) and not train_idx & set(split.heldout)
    assert len(texts.train) + texts.duplicates_dropped + sum(1 for i in train_idx if not docs[i]) == len(train_idx)


@pytest.mark.parametrize(
    "n, train, heldout_start",
    [
        (1000, [[0, 1000]], 4003),
        (3800, [[0, 3604]], 4003),
        (4003, [[0, 3604]], 4003),
        (4004, [[0, 3604], [4003, 4004]], 4004),
    ],
)
def test_small_subword_ranges(docs, n, train, heldout_start):
    s = corpus_split(docs, n)
    assert json_safe(s)["subword_train"] == train and s.heldout_start == heldout_start


def test_cut_on_a_document_boundary_matches_load_corpus(tmp_path):
    """10 poems of 10 characters: the 90% cut is exactly the start of poem 9 (offset 0)."""
    poems = ["".join(chr(0x4E00 + 10 * i + j) for j in range(10)) for i in range(12)]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"text": p}) + "\n" for p in poems), encoding="utf-8")
    s = corpus_split(poems, subword_poems=11, char_poems=10)
    assert (s.char_val_start, s.char_val_offset) == (9, 0)
    texts = split_texts(poems, s)
    assert texts.char_val_text == load_corpus(path, poems=10).val == poems[9]
    assert texts.train == poems[:9] + poems[10:11] and texts.heldout == poems[11:]


def test_bad_split_values_name_the_limit(docs):
    for n in (0, 57607, -3):
        with pytest.raises(ValueError, match=r"\[1, 57606\]"):
            corpus_split(docs, n)
    with pytest.raises(ValueError, match="at least 2 documents"):
        corpus_split(["only one"], 1)
    with pytest.raises(ValueError, match="no training documents"):
        corpus_split(["a" * 10, "b" * 10, "c"], 1, char_poems=1)
    with pytest.raises(ValueError, match="split is for"):
        split_texts(docs[:10], corpus_split(docs, 100))
