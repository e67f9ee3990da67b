"""The same generation loop drives a transformers GPT2LMHeadModel (its own cache) to our engine's tokens."""

from __future__ import annotations

import warnings

import pytest

from genprobe._io import json_safe
from genprobe.engine.generate import generate
from genprobe.engine.hf_adapter import HFCausalLM
from genprobe.engine.runner import runner_for
from genprobe.engine.samplers.stages import SamplerConfig
from genprobe.model.hf import to_hf_gpt2
from genprobe.model.load import load_model


@pytest.fixture
def hf_tiny(tiny_model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return HFCausalLM(to_hf_gpt2(tiny_model))


@pytest.mark.parametrize("mode", ["cached", "naive"])
def test_hf_adapter_greedy_matches_our_engine_with_left_padding(tiny_model, hf_tiny, mode):
    prompts = [[3, 4, 5, 6, 7], [8, 9], [10, 11, 12]]
    ours = generate(tiny_model, prompts, 15, return_logits=True)
    theirs = generate(hf_tiny, prompts, 15, mode=mode, return_logits=True)
    assert theirs.tokens == ours.tokens
    assert max(float((a - b).abs().max()) for a, b in zip(ours.step_logits, theirs.step_logits, strict=True)) < 1e-4
    if mode == "cached":
        assert theirs.token_forwards == ours.token_forwards
    else:
        assert theirs.token_forwards > ours.token_forwards


def test_hf_adapter_padded_row_equals_row_alone(hf_tiny):
    prompts = [[3, 4, 5, 6, 7, 8, 9], [10, 11]]
    batch = generate(hf_tiny, prompts, 10, return_logits=True)
    alone = generate(hf_tiny, [prompts[1]], 10, return_logits=True)
    assert alone.tokens[0] == batch.tokens[1]
    steps = zip(alone.step_logits, batch.step_logits, strict=True)
    assert max(float((a[0] - b[1]).abs().max()) for a, b in steps) < 1e-5


def test_hf_adapter_samplers_and_context_limit(tiny_model, hf_tiny):
    cfg = SamplerConfig(temperature=0.8, top_p=0.9, repetition_penalty=1.3, order="hf")
    theirs = generate(hf_tiny, [[3, 4]], 12, sampler=cfg, seed=5)
    assert theirs.tokens == generate(tiny_model, [[3, 4]], 12, sampler=cfg, seed=5).tokens
    assert hf_tiny.max_positions == 32 and hf_tiny.vocab_size == 50
    with pytest.raises(ValueError, match="context length 32"):
        generate(hf_tiny, [[3] * 30], 5)


def test_loaded_checkpoint_and_hf_dir_get_their_runners(tmp_path, tiny_model):
    from genprobe.corpus.tokenizer import CharTokenizer
    from genprobe.model.checkpoint import save_checkpoint

    tok = CharTokenizer([chr(0x4E00 + i) for i in range(48)])
    ck = save_checkpoint(tmp_path / "ck", tiny_model, tok)
    loaded = load_model(ck)
    m1, t1 = runner_for(loaded), loaded.tokenizer
    assert t1.unk_id == 1 and t1.vocab_size == 50
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = to_hf_gpt2(tiny_model)
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "genprobe_tokenizer.json").write_text(__import__("json").dumps(json_safe(tok)), encoding="utf-8")
    loaded = load_model(tmp_path / "hf")
    m2, t2 = runner_for(loaded), loaded.tokenizer
    assert isinstance(m2, HFCausalLM) and t2.fingerprint == tok.fingerprint
    ids = t1.encode(tok.chars[0] + tok.chars[5])
    assert generate(m1, [ids], 8).tokens == generate(m2, [ids], 8).tokens == generate(loaded, [ids], 8).tokens
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="neither a genprobe checkpoint"):
        load_model(tmp_path / "empty")


def test_load_model_refuses_pickled_weights(tmp_path):
    d = tmp_path / "pkl"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "gpt2"}', encoding="utf-8")
    (d / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ValueError, match="safetensors"):
        load_model(d)
