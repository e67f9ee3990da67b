"""The one loader: auto-detection, safetensors only, offline, and a clear error for every bad directory."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import genprobe
from genprobe._io import json_safe
from genprobe.corpus.tokenizer import CharTokenizer
from genprobe.engine.loaded import load_model
from genprobe.model.checkpoint import save_checkpoint
from genprobe.model.errors import ModelLoadError, UnsupportedArchitectureError
from genprobe.model.hf import to_hf_gpt2
from genprobe.model.load import SubwordTokenizer, Tokenizer


def _char_tok() -> CharTokenizer:
    return CharTokenizer([chr(0x4E00 + i) for i in range(48)])


def _tiny_llama(vocab: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).eval()


def _bpe_tokenizer(d, vocab_size: int):
    """A byte-level BPE trained on a few lines, saved as a transformers fast tokenizer."""
    from tokenizers import Tokenizer as HFTok
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = HFTok(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(["白日依山盡", "黃河入海流", "hello world"] * 20, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>")
    tok.save_pretrained(d)
    return tok


def test_genprobe_checkpoint_and_its_hf_export_load_to_the_same_model(tmp_path, tiny_model):
    tok = _char_tok()
    ck = save_checkpoint(tmp_path / "ck", tiny_model, tok)
    ours = load_model(ck)
    assert (ours.kind, ours.arch, ours.vocab_size, ours.max_positions) == ("genprobe", "gpt", 50, 32)
    assert isinstance(ours.tokenizer, Tokenizer) and ours.tokenizer.kind == "char" and ours.unk_id == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        to_hf_gpt2(tiny_model).save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "genprobe_tokenizer.json").write_text(json.dumps(json_safe(tok)), encoding="utf-8")
    theirs = load_model(tmp_path / "hf")
    assert (theirs.kind, theirs.arch, theirs.max_positions) == ("hf", "gpt2", 32)
    assert theirs.tokenizer.fingerprint == tok.fingerprint
    text = tok.chars[0] + tok.chars[5]
    a, b = ours.generate(text, max_new_tokens=8), theirs.generate(text, max_new_tokens=8)
    assert a[0].token_ids == b[0].token_ids and a[0].text == b[0].text
    assert len(ours.mlp_sites()) == len(theirs.mlp_sites()) == 2


def test_hf_directory_with_a_subword_tokenizer(tmp_path):
    d = tmp_path / "llama"
    _tiny_llama(vocab=320).save_pretrained(d)
    _bpe_tokenizer(d, vocab_size=300)
    m = load_model(d)
    assert isinstance(m.tokenizer, SubwordTokenizer) and m.tokenizer.kind == "subword"
    assert m.eos_id == m.tokenizer.hf.convert_tokens_to_ids("<|endoftext|>")
    assert m.decode(m.encode("白日依山盡")) == "白日依山盡"
    assert m.tokenizer.unknown_chars("白日 anything") == []  # byte-level: every character is representable
    out = m.generate(["白日", "黃河入"], max_new_tokens=5, stop_at_eos=False)
    assert [len(c.token_ids) for c in out] == [5, 5]
    assert m.describe()["tokenizer"]["kind"] == "subword"


def test_public_api_is_lazy_and_complete():
    assert genprobe.load is load_model
    assert genprobe.SamplingParams(temperature=0.5).temperature == 0.5
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        genprobe.nope  # noqa: B018


# ---- bad input: each a clear error --------------------------------------------------------------
def test_missing_path_and_file_instead_of_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model directory"):
        load_model(tmp_path / "missing")
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="is a file"):
        load_model(f)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="neither a genprobe checkpoint"):
        load_model(tmp_path / "empty")


def test_pickled_only_directory_is_refused_with_how_to_convert(tmp_path):
    d = tmp_path / "pkl"
    _tiny_llama().save_pretrained(d)
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"never unpickled")
    with pytest.raises(ModelLoadError, match=r"only pickled weights \(pytorch_model.bin\).*safe_serialization=True"):
        load_model(d)


def test_config_without_weights(tmp_path):
    d = tmp_path / "noweights"
    _tiny_llama().config.save_pretrained(d)
    with pytest.raises(ModelLoadError, match="config.json but no weights"):
        load_model(d)


def test_weights_of_another_config_are_refused(tmp_path):
    d = tmp_path / "mismatch"
    _tiny_llama().save_pretrained(d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 3  # layer 2 has no weights in the file
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="uninitialised"):
        load_model(d)


def test_tokenizer_larger_than_the_vocabulary(tmp_path):
    d = tmp_path / "small-vocab"
    _tiny_llama(vocab=40).save_pretrained(d)
    _bpe_tokenizer(d, vocab_size=300)
    with pytest.raises(
        ModelLoadError, match=r"tokenizer has \d+ tokens but the model's output embedding has only 40 rows"
    ):
        load_model(d)


def test_unknown_or_remote_code_architecture(tmp_path):
    d = tmp_path / "remote"
    _tiny_llama().save_pretrained(d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "my_secret_arch"
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_secret.SecretForCausalLM"}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="my_secret_arch.*remote code.*never runs trust_remote_code"):
        load_model(d)


def test_text_needs_a_tokenizer(tmp_path):
    d = tmp_path / "notok"
    _tiny_llama().save_pretrained(d)
    m = load_model(d)
    assert m.tokenizer is None and m.pad_id == 0
    with pytest.raises(ValueError, match="has no tokenizer"):
        m.encode("x")
