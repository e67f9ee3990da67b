"""Byte-level BPE (genprobe.corpus.bpe): lossless on every bundled poem, deterministic, and what AutoTokenizer loads.

References: ``tokenizers`` ``pre_tokenizers.ByteLevel`` / ``decoders.ByteLevel`` (byte alphabet, exact
inverse); transformers/models/qwen2/tokenization_qwen2.py ``Qwen2Tokenizer.__init__`` (the pipeline
transformers 5 substitutes for a qwen2 directory's tokenizer.json); transformers/models/auto/
tokenization_auto.py ``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`` (why that substitution happens).
"""

from __future__ import annotations

import json

import pytest

from genprobe.corpus import bpe
from genprobe.corpus.tang import bundled_documents

# Hard cases: text never seen in training (Latin, emoji, private use, combining marks), spaces that a
# prefix-space or clean-up setting would alter, full-width punctuation that NFKC would fold, the literal
# special-token string.
HARD = ["Hello  world ,.", " 春", "春 ", "a\n\tb\r\n", "😀\ue829⿰", "，。！？「」", "e\u0301", "x<|endoftext|>y", ""]


def lossless_failures(tok, texts):
    """Indices of the texts for which ``decode(encode(t)) != t`` (empty list = lossless)."""
    back = tok.decode_batch(bpe.encode_batch(tok, texts), skip_special_tokens=False)
    return [i for i, (t, b) in enumerate(zip(texts, back, strict=True)) if t != b]


@pytest.fixture(scope="module")
def docs():
    return bundled_documents()


@pytest.fixture(scope="module")
def toks(docs):
    """One small tokenizer per style, trained on 1,500 poems (vocabulary 600)."""
    return {style: bpe.train_bpe(docs[:1500], 600, style) for style in bpe.STYLES}


@pytest.mark.parametrize("style", bpe.STYLES)
def test_lossless_on_every_bundled_poem(docs, toks, style):
    """decode(encode(t)) == t for all 57,607 poems, including ~56,000 the tokenizer never saw."""
    assert len(docs) == 57607
    assert lossless_failures(toks[style], docs) == []


def test_gpt2_style_is_lossless_on_hard_strings(toks):
    """No normaliser, no prefix space: exact even for combining marks and text outside the training script."""
    assert lossless_failures(toks["gpt2"], HARD) == []


def test_qwen2_style_normalises_to_nfc_like_qwen2(toks):
    """The qwen2 pipeline applies NFC (as Qwen2Tokenizer does): only non-NFC input changes."""
    fails = lossless_failures(toks["qwen2"], HARD)
    assert [HARD[i] for i in fails] == ["e\u0301"]
    assert toks["qwen2"].decode(toks["qwen2"].encode("e\u0301").ids) == "\u00e9"


def test_bpe_training_is_deterministic(docs):
    """Same text → the same vocabulary and merges, byte for byte; a different size → a different tokenizer."""
    a = bpe.train_bpe(docs[:800], 500)
    b = bpe.train_bpe(docs[:800], 500)
    assert a.to_str() == b.to_str()
    assert a.get_vocab() == b.get_vocab()
    assert bpe.train_bpe(docs[:800], 520).to_str() != a.to_str()


def test_vocab_layout_and_limits(docs):
    tok = bpe.train_bpe(docs[:300], bpe.MIN_VOCAB)  # zero merges: bytes + <|endoftext|> only
    assert tok.get_vocab_size() == 257 and bpe.eos_id(tok) == 0
    assert lossless_failures(tok, docs[:300] + HARD) == []
    for bad in (256, 0, bpe.MAX_VOCAB + 1, 4096.0):
        with pytest.raises(ValueError, match=r"\[257, 65536\]"):
            bpe.train_bpe(docs[:10], bad)
    with pytest.raises(ValueError, match="style"):
        bpe.train_bpe(docs[:10], 300, "sentencepiece")


def test_stream_joins_documents_with_end_of_text(toks):
    tok = toks["gpt2"]
    a, b = tok.encode("春眠不覺曉").ids, tok.encode("處處聞啼鳥").ids
    assert bpe.stream_ids(tok, ["春眠不覺曉", "處處聞啼鳥"]) == [0, *a, 0, *b, 0]
    assert 0 not in a + b  # no special token added by encode


@pytest.mark.parametrize("arch, style", [("llama", "gpt2"), ("qwen2", "qwen2")])
def test_auto_tokenizer_runs_the_trained_pipeline(tmp_path, docs, toks, arch, style):
    """AutoTokenizer on a saved directory gives the trained tokenizer's ids on held-out poems and decodes exactly.

    For qwen2, transformers 5 swaps in Qwen2Tokenizer: a gpt2-style tokenizer.json would be re-split with
    Qwen2's regex (single digits) — the test below shows that mismatch, which is why qwen2 trains its own style.
    """
    from transformers import AutoTokenizer, LlamaConfig, Qwen2Config

    tok = toks[style]
    (LlamaConfig if arch == "llama" else Qwen2Config)(vocab_size=600).save_pretrained(tmp_path)
    bpe.to_hf_tokenizer(tok).save_pretrained(tmp_path)
    auto = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    sample = docs[50000:51000] + [h for h in HARD if h != "e\u0301"]
    assert [auto.encode(t, add_special_tokens=False) for t in sample] == bpe.encode_batch(tok, sample)
    assert [auto.encode(t) for t in sample] == bpe.encode_batch(tok, sample)  # nothing added by default
    assert auto.batch_decode(bpe.encode_batch(tok, sample)) == sample
    assert auto.eos_token == bpe.EOS_TOKEN and auto.eos_token_id == 0 and auto.pad_token_id == 0
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["clean_up_tokenization_spaces"] is False


def test_qwen2_directory_does_not_run_a_gpt2_style_tokenizer_json(tmp_path, toks):
    """The hazard the per-arch style avoids: digits merge under GPT-2's regex, Qwen2Tokenizer splits them."""
    from transformers import AutoTokenizer, Qwen2Config

    tok = bpe.train_bpe(["12 12 12 12 345 345"] * 50, 300)
    Qwen2Config(vocab_size=300).save_pretrained(tmp_path)
    bpe.to_hf_tokenizer(tok).save_pretrained(tmp_path)
    auto = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert auto.encode("12", add_special_tokens=False) != tok.encode("12").ids
