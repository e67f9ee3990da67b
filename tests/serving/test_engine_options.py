"""EngineOptions reach vllm.LLM unchanged (parallelism included); bad values are refused before any engine starts."""

from __future__ import annotations

import pytest

from genprobe.serving.engine import MONITOR_FQCN, EngineOptions


def test_parallelism_and_memory_options_pass_through():
    o = EngineOptions(
        tensor_parallel_size=4,
        pipeline_parallel_size=2,
        distributed_executor_backend="ray",
        gpu_memory_utilization=0.9,
        dtype="bfloat16",
        enforce_eager=False,
        max_num_batched_tokens=8192,
        extra=(("quantization", "fp8"),),
    )
    kw = o.llm_kwargs()
    assert (kw["tensor_parallel_size"], kw["pipeline_parallel_size"], kw["distributed_executor_backend"]) == (
        4,
        2,
        "ray",
    )
    assert (kw["gpu_memory_utilization"], kw["dtype"], kw["enforce_eager"], kw["max_num_batched_tokens"]) == (
        0.9,
        "bfloat16",
        False,
        8192,
    )
    assert kw["quantization"] == "fp8" and kw["trust_remote_code"] is False and kw["skip_tokenizer_init"] is True
    assert kw["logits_processors"] == [MONITOR_FQCN]
    assert "max_model_len" not in kw and "block_size" not in kw  # unset options are left to vLLM
    assert "logits_processors" not in EngineOptions(loop_monitor=False).llm_kwargs()


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(dtype="int8"), "dtype"),
        (dict(tensor_parallel_size=0), "tensor_parallel_size"),
        (dict(distributed_executor_backend="slurm"), "distributed_executor_backend"),
        (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization"),
        (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
        (dict(block_size=16.5), "block_size"),
    ],
)
def test_bad_options_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        EngineOptions(**bad)


def test_one_engine_per_process_is_reused(engine, served_dirs, engine_options):
    from genprobe.serving.engine import shared_engine

    assert shared_engine(served_dirs["patched"], engine_options("float32")) is engine
    assert engine.describe()["max_model_len"] == 64 and engine.startup_seconds > 0
