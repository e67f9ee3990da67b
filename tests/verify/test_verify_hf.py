"""transformers causal LMs through the HF adapter: their own cache against recomputation."""

from __future__ import annotations

import json

import pytest
import torch

from genprobe._io import json_safe

transformers = pytest.importorskip("transformers")

from genprobe.verify.adapters import FullRecompute, HFAdapter  # noqa: E402
from genprobe.verify.harness import VerifyOptions, verify_implementation  # noqa: E402

PROMPTS = [[5, 17, 42, 8, 91, 23, 64, 30], [12, 77, 3, 56, 9], [40, 2, 88]]
STEPS = 4


def tiny_hf(kind: str, init: float = 0.02):
    """A seeded random causal LM from a small config (eager attention, vocab 100)."""
    torch.manual_seed(0)
    common = dict(
        vocab_size=100,
        initializer_range=init,
        attn_implementation="eager",
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common
        )
        return transformers.GPT2LMHeadModel(cfg).eval()
    kw = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **common,
    )
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**kw)).eval()
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw)).eval()


@pytest.mark.parametrize("kind", ["gpt2", "llama", "qwen2"])
def test_hf_models_pass(kind):
    hf = tiny_hf(kind, init=0.2)
    r = verify_implementation(
        HFAdapter(hf), FullRecompute(hf), PROMPTS, VerifyOptions(max_new_tokens=STEPS, chunk_sizes=(1, 4))
    )
    assert r.verdict == "pass", r.max_abs_dlogit_by_phase
    assert r.phase("padded_batch").skipped is None
    assert r.text_divergences == 0


def test_gpt2_left_padding_without_position_ids_is_flagged():
    hf = tiny_hf("gpt2", init=0.2)
    bad = verify_implementation(
        HFAdapter(hf, pass_position_ids=False),
        FullRecompute(hf),
        PROMPTS,
        VerifyOptions(max_new_tokens=STEPS, chunk_sizes=(4,)),
    )
    assert bad.verdict == "bug", bad.max_abs_dlogit_by_phase
    assert bad.worst_phase == "padded_batch"
    # unpadded runs are fine: the bug needs left padding, which only the padded-batch comparison makes
    assert all(p.max_abs_dlogit < 1e-4 for p in bad.phases if p.phase != "padded_batch")
    good = verify_implementation(
        HFAdapter(hf, pass_position_ids=True),
        FullRecompute(hf),
        PROMPTS,
        VerifyOptions(max_new_tokens=STEPS, chunk_sizes=()),
    )
    assert good.verdict == "pass", good.max_abs_dlogit_by_phase


def test_llama_rope_is_immune_to_the_position_shift():
    # RoPE scores depend on position differences only; a constant per-row shift changes nothing
    hf = tiny_hf("llama", init=0.2)
    r = verify_implementation(
        HFAdapter(hf, pass_position_ids=False),
        FullRecompute(hf),
        PROMPTS,
        VerifyOptions(max_new_tokens=STEPS, chunk_sizes=()),
    )
    assert r.verdict == "pass", r.max_abs_dlogit_by_phase


def test_converted_genprobe_model_agrees_through_hf(sharp_model, prompt):
    from genprobe.model.hf import to_hf_gpt2

    hf = to_hf_gpt2(sharp_model)
    r = verify_implementation(
        HFAdapter(hf), FullRecompute(sharp_model), [prompt], VerifyOptions(max_new_tokens=STEPS, padded_batch=False)
    )
    assert r.verdict == "pass", r.max_abs_dlogit_by_phase


# ---- transformers' own cache classes ------------------------------------------------------------------
def save_tiny(kind: str, directory, init: float = 0.02):
    """A tiny random model written as a transformers directory (safetensors), as a user would have it."""
    tiny_hf(kind, init).save_pretrained(directory, safe_serialization=True)
    return directory


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_cli_hf_cache_static_passes(capsys, tmp_path, arch):
    """StaticCache (transformers cache_utils.StaticCache: preallocated, written with index_copy_) vs recomputation."""
    from genprobe.cli import main

    d = save_tiny(arch, tmp_path / arch)
    rc = main(["verify-cache", str(d), "--hf-cache", "static", "--max-new-tokens", "6", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    (impl,) = json.loads(out.out)["implementations"]
    assert impl["impl"] == f"hf:{arch}[static]" and impl["verdict"] == "pass"
    assert {p["phase"] for p in impl["phases"] if p["verdict"] == "pass"} == {
        "prefill",
        "incremental",
        "chunk_1",
        "chunk_4",
        "padded_batch",
        "isolation",
        "prefix_reuse",
        "prefix_reuse_no_reset",
    }


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("kind, cls", [("static", "StaticCache"), ("dynamic", "DynamicCache")])
def test_the_named_cache_class_is_the_one_driven(arch, kind, cls):
    hf = tiny_hf(arch, init=0.2)
    a = HFAdapter(hf, cache=kind, max_cache_len=64)  # the prefix-reuse sequences have 48 tokens
    r = verify_implementation(a, FullRecompute(hf), PROMPTS, VerifyOptions(max_new_tokens=4, chunk_sizes=(4,)))
    assert r.verdict == "pass", r.max_abs_dlogit_by_phase
    assert type(a.cache).__name__ == cls  # the cache the model filled and returned is of that class


def test_cli_hf_cache_all_reports_every_class(capsys, tmp_path):
    from genprobe.cli import main
    from genprobe.verify.hf_caches import quantized_backend

    d = save_tiny("gpt2", tmp_path / "gpt2", init=0.2)
    rc = main(["verify-cache", str(d), "--hf-cache", "all", "--max-new-tokens", "6", "--json"])
    out = capsys.readouterr()
    by_kind = {i["impl"].split("[")[1].rstrip("]"): i for i in json.loads(out.out)["implementations"]}
    assert list(by_kind) == ["dynamic", "static", "sliding", "quantized", "offloaded"]
    assert by_kind["dynamic"]["verdict"] == "pass" and by_kind["static"]["verdict"] == "pass"
    assert by_kind["sliding"]["verdict"] == "unavailable" and "sliding_window" in by_kind["sliding"]["unavailable"]
    if not torch.cuda.is_available():
        assert by_kind["offloaded"]["verdict"] == "unavailable" and "CUDA" in by_kind["offloaded"]["unavailable"]
    if quantized_backend() == "fp8":
        # fp8 keys/values: lossy, and on these logits by about one unit — said with the numbers, not a crash
        q = by_kind["quantized"]
        assert q["verdict"] in ("suspicious", "bug") and q["max_abs_dlogit"] > 0.1 and not q["errors"]
        assert rc == (1 if q["verdict"] == "bug" else 0)
        assert "quantized" in out.err and "unavailable: hf:gpt2[sliding]" in out.err


def test_mistral_sliding_window_caches_pass():
    """Mistral with sliding_window 6 < sequence length: its sliding layers (DynamicSlidingWindowLayer) evict."""
    from genprobe.verify.hf_caches import unavailable_reason
    from genprobe.verify.hf_matrix import tiny_model

    hf = tiny_model("mistral", init=0.2, window=6)
    for kind in ("dynamic", "static", "sliding"):
        assert unavailable_reason(hf, kind) is None
        r = verify_implementation(
            HFAdapter(hf, cache=kind, max_cache_len=64),
            FullRecompute(hf),
            PROMPTS,
            VerifyOptions(max_new_tokens=8, chunk_sizes=(4,)),
        )
        assert r.verdict == "pass", (kind, r.max_abs_dlogit_by_phase)
    assert "full-attention layers only" in unavailable_reason(hf, "quantized")
    # the reference really is windowed: it differs from the same weights without the window
    hf.config.sliding_window = None
    ids = torch.tensor([PROMPTS[0] + PROMPTS[1]])
    windowed = FullRecompute(tiny_model("mistral", init=0.2, window=6)).full(ids)
    assert (FullRecompute(hf).full(ids) - windowed).abs().max() > 1e-3


def test_cli_offers_exactly_the_library_cache_kinds(capsys):
    from genprobe.cli import main
    from genprobe.verify.hf_caches import CACHE_KINDS

    with pytest.raises(SystemExit):
        main(["verify-cache", "--help"])
    assert "verify these cache classes: " + " ".join([*CACHE_KINDS, "all"]) in " ".join(capsys.readouterr().out.split())


def test_unavailable_cache_is_refused_by_the_adapter():
    from genprobe.verify.adapters import CacheUnavailableError

    with pytest.raises(CacheUnavailableError, match="sliding_window"):
        HFAdapter(tiny_hf("llama"), cache="sliding")
    with pytest.raises(ValueError, match="unknown cache kind"):
        HFAdapter(tiny_hf("llama"), cache="paged")


def test_cache_matrix_small(capsys):
    from genprobe.verify.hf_matrix import cache_matrix

    m = cache_matrix(archs=("gpt2", "mistral"), kinds=("dynamic", "static", "sliding"), steps=4)
    at = m.cells
    assert at[("gpt2", "static")].verdict == "pass" and at[("mistral", "sliding")].verdict == "pass"
    assert at[("gpt2", "sliding")].verdict == "unavailable"
    md = m.markdown()
    assert md.splitlines()[0] == "| cache class | gpt2 | mistral |" and "unavailable" in md
    json.dumps(json_safe(m), allow_nan=False)
