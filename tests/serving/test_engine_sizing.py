"""verify-serving sizes vLLM to its checks: max_model_len from the prompts + new tokens, an explicit KV-cache budget
from the model's geometry; a start that cannot work is one line naming the setting (exit 2). No engine is started."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from genprobe.serving.engine import (
    EngineOptions,
    EngineStartError,
    KVGeometry,
    check_kv_fits,
    context_length,
    kv_cache_budget,
    kv_geometry,
    start_failure_message,
)
from genprobe.serving.verify import sized_for_checks

SMOL = {  # SmolLM2-135M-Instruct's config.json, the fields that matter
    "model_type": "llama",
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "vocab_size": 49152,
}
GPT2_TINY = {"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 64, "vocab_size": 50}


def _model_dir(tmp_path, cfg, name="m"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _cli_options(*flags):
    from genprobe.cli import build_parser
    from genprobe.cli._vllm_args import engine_options

    args = build_parser().parse_args(["verify-serving", "MODEL", *flags])
    return engine_options(args, seed=args.seed)


def test_geometry_of_llama_and_gpt2_configs(tmp_path):
    smol = kv_geometry(_model_dir(tmp_path, SMOL, "smol"))
    assert smol == KVGeometry(n_layer=30, n_kv_heads=3, head_dim=64, max_positions=8192)
    assert smol.bytes_per_token("float32") == 46_080 and smol.bytes_per_token("bfloat16") == 23_040
    gpt2 = kv_geometry(_model_dir(tmp_path, GPT2_TINY, "gpt2"))
    assert gpt2 == KVGeometry(n_layer=2, n_kv_heads=2, head_dim=16, max_positions=64)  # no GQA: KV heads = heads
    with pytest.raises(ValueError, match="layers, heads and width"):
        kv_geometry(_model_dir(tmp_path, {"model_type": "x"}, "bad"))


def test_budget_arithmetic_exact():
    smol = KVGeometry(30, 3, 64, 8192)
    # 160 positions = 5 blocks of 32, +1 spare = 192 tokens; × 8 sequences = 1536 tokens × 46,080 B = 70,778,880 B;
    # × 1.25 = 88,473,600 B = 84.375 MiB -> 85 MiB.
    assert kv_cache_budget(smol, "float32", 160, 8, 32) == 85 * 2**20
    assert kv_cache_budget(smol, "float32", 160, 8, 32, headroom=1.0) == 68 * 2**20  # 67.5 MiB rounded up
    assert kv_cache_budget(smol, "bfloat16", 160, 8, 32) == 43 * 2**20  # 42.19 MiB
    # vLLM's own context: 8192 positions = (64 + 1) blocks of 128 × 8 sequences -> 3656.25 MiB, 43× the sized one.
    assert kv_cache_budget(smol, "float32", 8192, 8) == 3657 * 2**20
    assert kv_cache_budget(smol, "float32", 32, 1, 32) == 4 * 2**20  # 2 blocks of 32 × 46,080 × 1.25 = 3.52 MiB
    with pytest.raises(ValueError, match="headroom"):
        kv_cache_budget(smol, "float32", 0, 8)


def test_context_length_rounds_up_to_a_block_and_stops_at_the_model():
    assert context_length(128, 16, 32) == 160
    assert context_length(128, 32, 32) == 160  # already a whole number of blocks
    assert context_length(129, 32, 32) == 192
    assert context_length(128, 16, 128, max_positions=8192) == 256
    assert context_length(9000, 16, 32, max_positions=8192) == 8192


def test_verify_serving_defaults_are_sized_for_smollm2(tmp_path):
    """The CLI's defaults (budget 32, block 32, 32 sequences, no memory setting): context 160, KV 85 MiB."""
    d = _model_dir(tmp_path, SMOL)
    opts = _cli_options()
    assert (opts.max_model_len, opts.kv_cache_memory_bytes, opts.gpu_memory_utilization) == (None, None, None)
    sized = sized_for_checks(d, opts, [], 16)
    assert sized.max_model_len == 160 and sized.kv_cache_memory_bytes == 85 * 2**20
    assert sized.llm_kwargs()["kv_cache_memory_bytes"] == 85 * 2**20
    # A prompt longer than the default room sets the context: 300 + 16 -> 320.
    assert sized_for_checks(d, opts, [list(range(300))], 16).max_model_len == 320


def test_what_the_user_chose_is_kept(tmp_path):
    d = _model_dir(tmp_path, SMOL)
    mine = sized_for_checks(d, _cli_options("--max-model-len", "512", "--kv-cache-memory-bytes", "123456789"), [], 16)
    assert (mine.max_model_len, mine.kv_cache_memory_bytes) == (512, 123456789)
    # A chosen memory fraction means "let vLLM size the cache from it": no explicit budget is added.
    frac = sized_for_checks(d, _cli_options("--gpu-memory-utilization", "0.3"), [], 16)
    assert frac.kv_cache_memory_bytes is None and frac.llm_kwargs()["gpu_memory_utilization"] == 0.3
    assert frac.max_model_len == 160
    # A chosen context sizes the cache: 512 positions = 16 + 1 blocks × 32 × 8 × 46,080 × 1.25 = 239.06 -> 240 MiB.
    assert sized_for_checks(d, _cli_options("--max-model-len", "512"), [], 16).kv_cache_memory_bytes == 240 * 2**20
    # Fewer concurrent sequences than the batch phase sends: the budget follows max_num_seqs.
    few = sized_for_checks(d, _cli_options("--max-num-seqs", "2"), [], 16)
    assert few.kv_cache_memory_bytes == kv_cache_budget(kv_geometry(d), "float32", 160, 2, 32)


def test_a_context_reaching_the_models_own_leaves_the_options_unchanged(tmp_path):
    """The serving tests' model (64 positions): sizing must not change its options, so the engine is reused."""
    d = _model_dir(tmp_path, GPT2_TINY)
    opts = _cli_options("--in-process", "--kv-cache-memory-bytes", str(64 << 20))
    assert sized_for_checks(d, opts, [], 16) == opts


def test_unset_fraction_passes_the_default_and_bad_fraction_is_refused():
    assert EngineOptions().llm_kwargs()["gpu_memory_utilization"] == 0.1
    assert "kv_cache_memory_bytes" not in EngineOptions().llm_kwargs()
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineOptions(gpu_memory_utilization=1.5)


def test_a_kv_cache_that_cannot_work_is_refused_before_vllm_starts(tmp_path):
    d = _model_dir(tmp_path, SMOL)
    one_seq = 46_080 * 160
    check_kv_fits(d, EngineOptions(max_model_len=160, kv_cache_memory_bytes=one_seq))
    with pytest.raises(EngineStartError, match=r"cannot hold one sequence of 160 positions.*--max-model-len"):
        check_kv_fits(d, EngineOptions(max_model_len=160, kv_cache_memory_bytes=one_seq - 1))
    with pytest.raises(EngineStartError, match="8192 positions"):  # no max_model_len: the model's context
        check_kv_fits(d, EngineOptions(kv_cache_memory_bytes=256 << 20))  # 8192 × 46,080 = 360 MiB
    with pytest.raises(EngineStartError, match="exceeds the .* bytes of memory available now"):
        check_kv_fits(d, EngineOptions(max_model_len=160, kv_cache_memory_bytes=1 << 50))
    check_kv_fits(d, EngineOptions())  # a fraction of RAM well above the (absent) weights


def test_a_memory_fraction_below_the_weights_is_refused_before_vllm_starts(tmp_path, monkeypatch):
    import psutil

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    d = _model_dir(tmp_path, SMOL)
    total = psutil.virtual_memory().total
    with open(d / "model.safetensors", "wb") as f:  # sparse: as large as a tenth of RAM, no disk used
        f.truncate(total // 10)
    with pytest.raises(EngineStartError, match="--gpu-memory-utilization 0.1 reserves .* give --kv-cache-memory"):
        check_kv_fits(d, EngineOptions())
    check_kv_fits(d, EngineOptions(gpu_memory_utilization=0.5))
    check_kv_fits(d, EngineOptions(max_model_len=160, kv_cache_memory_bytes=85 << 20))  # explicit: no fraction


def test_start_failures_are_one_line_naming_the_setting():
    opts = EngineOptions(max_model_len=160, kv_cache_memory_bytes=85 << 20)
    neg = ValueError(
        "Available memory on node 0 (21.1/23.5 GiB) on kv cache allocation is less than requested memory for kv "
        "(-0.3/2.4 GiB).\nReduce CPU memory used by other processes."
    )
    msg = start_failure_message(neg, replace(opts, kv_cache_memory_bytes=None))
    assert "\n" not in msg and "--kv-cache-memory-bytes (now unset: 0.1 of RAM" in msg and "-0.3/2.4 GiB" in msg
    long_ctx = ValueError("To serve at least one request with the models's max seq len (8192), 1.4 GiB KV cache ...")
    assert "lower --max-model-len (now 160)" in start_failure_message(long_ctx, opts)
    other = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    msg = start_failure_message(other, opts)
    assert msg.startswith("vLLM failed to start (RuntimeError: Engine core initialization failed")
    assert "--kv-cache-memory-bytes (now 89128960)" in msg and "--max-model-len" in msg


def test_serving_engine_turns_a_start_failure_into_engine_start_error(tmp_path, monkeypatch):
    import genprobe.serving.engine as eng

    d = _model_dir(tmp_path, SMOL)
    (d / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(eng, "require_vllm", lambda: None)

    def boom(path, options):
        raise RuntimeError("Engine core initialization failed. See root cause above.")

    monkeypatch.setattr(eng, "_start_llm", boom)
    with pytest.raises(EngineStartError, match="vLLM failed to start") as caught:
        eng.ServingEngine(d, EngineOptions(max_model_len=160, kv_cache_memory_bytes=85 << 20))
    assert isinstance(caught.value, ValueError)  # the CLI's "one line, exit 2" class
