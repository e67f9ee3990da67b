"""``genprobe.verify_cache``: the same harness as the CLI, on a loaded Model, returning a typed report."""

from __future__ import annotations

import json

import pytest

import genprobe
from genprobe._io import json_safe
from genprobe.model.load import Model


def test_engine_by_default_on_default_prompts(sharp_model):
    r = genprobe.verify_cache(Model.from_module(sharp_model), max_new_tokens=6)
    assert r.impl == "engine" and r.verdict == "pass"
    assert len(set(r.prompt_lengths)) == 3 and r.phase("isolation").verdict == "pass"  # random ids: 3 lengths
    json.loads(json.dumps(json_safe(r), allow_nan=False))


def test_text_prompts_window_and_a_user_implementation(tiny_ckpt, U):
    model = genprobe.load(tiny_ckpt)
    r = genprobe.verify_cache(
        model, prompts=["春江潮水连海平", "白日"], max_new_tokens=16, window=8, sinks=2, padded_batch=False
    )
    assert r.prompt_lengths == [7, 2] and r.reference == "windowed recomputation (window 8, sinks 2)"
    assert r.verdict == "pass"
    bad = genprobe.verify_cache(model, U.window8_sinks2_fifo(model.module), max_new_tokens=16, window=8, sinks=2)
    assert bad.verdict == "bug"
    leak = genprobe.verify_cache(model, U.leaky(model.module), prompts=[[3, 7, 11, 5, 9, 2, 8]], max_new_tokens=8)
    assert leak.verdict == "bug" and leak.phase("isolation").verdict == "bug"


def test_transformers_cache_class(tmp_path):
    pytest.importorskip("transformers")
    from genprobe.verify.hf_matrix import tiny_model

    tiny_model("llama", init=0.2).save_pretrained(tmp_path / "llama", safe_serialization=True)
    model = genprobe.load(tmp_path / "llama")
    r = genprobe.verify_cache(model, hf_cache="static", max_new_tokens=6)
    assert r.impl == "hf:llama[static]" and r.verdict == "pass"
    with pytest.raises(ValueError, match="sliding_window"):
        genprobe.verify_cache(model, hf_cache="sliding")
    with pytest.raises(ValueError, match="window applies to a genprobe model"):
        genprobe.verify_cache(model, window=4)
