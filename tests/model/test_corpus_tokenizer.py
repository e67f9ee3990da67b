"""Bundled corpus and character tokenizer: the seed's figures, <unk> handling, user files."""

from __future__ import annotations

import json
import warnings

import pytest

from genprobe._io import json_safe
from genprobe.corpus.tang import load_corpus
from genprobe.corpus.tokenizer import UNK_ID, CharTokenizer, UnknownCharactersWarning


def test_default_corpus_size(corpus):
    assert len(corpus.documents) == 4003
    assert len(corpus.text) == 237_760
    assert len(corpus.train) + len(corpus.val) == len(corpus.text)
    assert len(corpus.val) == pytest.approx(0.1 * len(corpus.text), abs=1)


def test_seed_validation_snippet_lies_in_the_tail_split(corpus):
    snippet = "已驚飛。方從列子御"
    assert snippet in corpus.val
    assert snippet not in corpus.train


def test_vocabulary_coverage(corpus, tokenizer):
    assert tokenizer.vocab_size == 1202
    cov = tokenizer.coverage(corpus.text)
    assert 0.87 <= cov["coverage"] <= 0.88
    assert cov["unk_share"] == pytest.approx(1 - cov["coverage"])


def test_simplified_character_warns_and_names_it(tokenizer):
    with pytest.warns(UnknownCharactersWarning, match="连"):
        ids = tokenizer.encode("春江潮水连海平")
    assert ids[4] == UNK_ID and UNK_ID not in ids[:4] + ids[5:]
    rep = tokenizer.encode_with_report("春江潮水连海平")
    assert rep.unknown_chars == ["连"] and rep.unknown_positions == [4]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokenizer.encode("春江潮水連海平")  # the traditional form is in the vocabulary: no warning


def test_decode_shows_or_hides_unk(tokenizer):
    ids = tokenizer.encode("春江潮水连海平", warn=False)
    assert tokenizer.decode(ids) == "春江潮水海平"
    assert tokenizer.decode(ids, show_unk=True) == "春江潮水<unk>海平"
    assert tokenizer.decode([0, 0] + ids) == "春江潮水海平"  # padding never shows


def test_tokenizer_dict_round_trip(tokenizer):
    again = CharTokenizer.from_dict(json_safe(tokenizer))
    assert again.fingerprint == tokenizer.fingerprint
    assert again.itos[:2] == ["<pad>", "<unk>"]


def test_user_text_file(tmp_path):
    p = tmp_path / "mine.txt"
    p.write_text("abcabcabd" * 10, encoding="utf-8")
    c = load_corpus(p)
    assert c.text == "abcabcabd" * 10 and c.source == str(p)
    assert len(c.val) == 9
    tok = CharTokenizer.from_text(c.text, 2)
    assert tok.chars == ["a", "b"]


def test_user_jsonl_file_and_poems_limit(tmp_path):
    p = tmp_path / "mine.jsonl"
    lines = [{"paragraphs": ["一二三", "四五"]}, {"text": "六七八九十"}, "甲乙丙丁戊己庚辛壬癸", {"text": "不要"}]
    p.write_text("\n".join(json.dumps(x, ensure_ascii=False) for x in lines) + "\n\n", encoding="utf-8")
    c = load_corpus(p, poems=3)
    assert c.documents == ["一二三四五", "六七八九十", "甲乙丙丁戊己庚辛壬癸"]
    assert c.text == "一二三四五六七八九十甲乙丙丁戊己庚辛壬癸"


def test_bad_jsonl_line_is_reported(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"text": "一二三四五六七八九十一二三四五六七八九十"}\n{oops\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        load_corpus(p)
    p.write_text('{"title": "no text"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 1 has neither"):
        load_corpus(p)


def test_bad_corpus_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_corpus(tmp_path / "missing.txt")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1") * 10)
    with pytest.raises(ValueError, match="not UTF-8"):
        load_corpus(tmp_path / "latin1.txt")
    with pytest.raises(ValueError, match="poems"):
        load_corpus(poems=0)
    with pytest.raises(ValueError, match="max_chars"):
        CharTokenizer.from_text("abc", 0)
