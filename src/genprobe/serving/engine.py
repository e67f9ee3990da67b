"""One vLLM engine per process, created lazily with explicit options.

Starting a vLLM engine costs tens of seconds (imports, worker start, weight load, KV-cache
allocation), so genprobe keeps at most one alive per process (:func:`shared_engine`): asking again
with the same model and options returns it; asking with different ones shuts the old one down first
(two engines at once would reserve memory twice on a shared machine).

Every option genprobe sets is a field of :class:`EngineOptions`, passed to ``vllm.LLM`` unchanged:

* ``dtype`` — weights/activations dtype ("float32", "bfloat16", "float16"). verify-serving's
  reference is always float32; a bfloat16 deployment is expected to differ (≈1e-2 in log p).
* ``enforce_eager`` — skip torch.compile / CUDA graphs. True by default here: on CPU, Inductor
  compilation adds tens of seconds per start; set False for production GPU throughput.
* ``enable_prefix_caching`` — reuse KV blocks of a shared prompt prefix (block-granular:
  a prefix shorter than ``block_size`` is never reused).
* ``max_num_batched_tokens`` — the per-step token budget; a prompt longer than it is prefilled
  in chunks (chunked prefill is always on in vLLM's V1 engine).
* ``max_num_seqs`` — how many sequences run concurrently (continuous batching).
* ``max_model_len`` — context length the engine admits (defaults to the model's).
* ``block_size`` — KV-cache block (the CPU backend needs a multiple of 32; vLLM picks 128 there).
* ``tensor_parallel_size`` / ``pipeline_parallel_size`` — shard the model across devices.
* ``distributed_executor_backend`` — "mp" (one host), "ray" (multi-node; needs ``pip install ray``
  and a running Ray cluster), "uni" (in-process), or None for vLLM's choice.
* ``gpu_memory_utilization`` — fraction of device memory vLLM reserves; **on CPU it is the fraction
  of host RAM** (vLLM's 0.92 default fails on a shared machine, hence 0.1 here).
* ``kv_cache_memory_bytes`` — an explicit KV-cache size instead of the fraction above.
* ``multiprocessing`` — vLLM V1 runs the engine core in a separate process by default (env
  ``VLLM_ENABLE_V1_MULTIPROCESSING``); False runs it in this process, which avoids importing vLLM
  three times (tests, small CPU runs). Scripts that keep it True need an ``if __name__ == "__main__"``
  guard (workers are spawned).
* ``loop_monitor`` — register genprobe's online loop monitor (:mod:`genprobe.serving.vllm_monitor`)
  as a vLLM logits-processor plug-in (on by default: it touches no logits of a request that does not
  ask for it, so every genprobe engine can monitor without a restart).
"""

from __future__ import annotations

import atexit
import gc
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ._vllm import require_vllm_engine
from .model_dir import ServedModel, served_model

MONITOR_FQCN = "genprobe.serving.vllm_monitor:LoopMonitorProcessor"
DISTRIBUTED_BACKENDS = (None, "mp", "ray", "uni", "external_launcher")


@dataclass(frozen=True)
class EngineOptions:
    """The vLLM engine settings genprobe uses (each passed to ``vllm.LLM`` by the same name)."""

    dtype: str = "float32"
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    block_size: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    gpu_memory_utilization: float = 0.1
    kv_cache_memory_bytes: int | None = None
    seed: int = 0
    multiprocessing: bool = True
    loop_monitor: bool = True
    extra: tuple[tuple[str, Any], ...] = field(default=())  # any other vllm.LLM keyword, as (name, value) pairs

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ValueError(f"dtype must be float32, bfloat16, float16 or auto, got {self.dtype!r}")
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "block_size", "kv_cache_memory_bytes"):
            v = getattr(self, name)
            if v is not None and (int(v) != v or v < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {v!r}")
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.distributed_executor_backend not in DISTRIBUTED_BACKENDS:
            raise ValueError(
                f"distributed_executor_backend must be one of {DISTRIBUTED_BACKENDS}, "
                f"got {self.distributed_executor_backend!r}"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` (None-valued options left to vLLM's defaults)."""
        kw: dict[str, Any] = {
            "dtype": self.dtype,
            "enforce_eager": self.enforce_eager,
            "enable_prefix_caching": self.enable_prefix_caching,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "seed": self.seed,
            "skip_tokenizer_init": True,  # genprobe passes token ids and decodes with its own tokenizer
            "trust_remote_code": False,
            "use_tqdm_on_load": False,  # its progress bar goes to stdout, which belongs to the caller (--json)
        }
        for name in (
            "max_num_batched_tokens",
            "max_num_seqs",
            "max_model_len",
            "block_size",
            "distributed_executor_backend",
            "kv_cache_memory_bytes",
        ):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        if self.loop_monitor:
            kw["logits_processors"] = [MONITOR_FQCN]
        kw.update(dict(self.extra))
        return kw

    def to_dict(self) -> dict:
        """JSON form."""
        d = asdict(self)
        d["extra"] = {k: repr(v) for k, v in self.extra}
        return d


class ServingEngine:
    """A started ``vllm.LLM`` on one model directory, plus what genprobe needs to know about it."""

    def __init__(self, model: str | os.PathLike | ServedModel, options: EngineOptions | None = None):
        require_vllm_engine()
        self.served = model if isinstance(model, ServedModel) else served_model(model)
        self.options = options or EngineOptions()
        t0 = time.perf_counter()
        self.llm = _start_llm(self.served.path, self.options)
        self.startup_seconds = time.perf_counter() - t0
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)

    @property
    def vocab_size(self) -> int:
        """Rows of the served model's output embedding."""
        return self.served.vocab_size

    def generate(self, prompts: Sequence[Sequence[int]], params: Any, use_tqdm: bool = False) -> list[Any]:
        """``LLM.generate`` on token-id prompts (one SamplingParams, or one per prompt); outputs in prompt order."""
        from vllm.inputs import TokensPrompt

        batch = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        return self.llm.generate(batch, params, use_tqdm=use_tqdm)

    def shutdown(self) -> None:
        """Stop the engine (and its worker processes) and free its memory."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            _stop_llm(llm)
        self.served.cleanup()

    def describe(self) -> dict:
        """JSON summary: model, options, start-up time, context length."""
        return {
            "model": self.served.to_dict(),
            "options": self.options.to_dict(),
            "startup_seconds": self.startup_seconds,
            "max_model_len": self.max_model_len,
        }


def _start_llm(path: Path, options: EngineOptions) -> Any:
    import vllm.envs as envs
    from vllm import LLM

    # vLLM caches its environment after the first engine starts; a later engine must see our setting.
    if hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if options.multiprocessing else "0"
    return LLM(model=str(path), **options.llm_kwargs())


def _stop_llm(llm: Any) -> None:
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()
    del llm
    try:  # an in-process engine leaves torch.distributed groups behind; the next engine needs them gone
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except (ImportError, RuntimeError, AssertionError):
        pass
    gc.collect()


# ---- the one engine of this process ---------------------------------------------------------------
_CURRENT: ServingEngine | None = None
_KEY: tuple | None = None


def shared_engine(model: str | os.PathLike, options: EngineOptions | None = None) -> ServingEngine:
    """The process's engine for (``model``, ``options``): reused when both match, else the old one stops first."""
    global _CURRENT, _KEY
    options = options or EngineOptions()
    key = (str(Path(model).resolve()), options)
    if _CURRENT is not None and _KEY == key and _CURRENT.llm is not None:
        return _CURRENT
    shutdown_shared_engine()
    _CURRENT, _KEY = ServingEngine(model, options), key
    return _CURRENT


def shutdown_shared_engine() -> None:
    """Shut the process's engine down (no-op when none is running)."""
    global _CURRENT, _KEY
    if _CURRENT is not None:
        eng, _CURRENT, _KEY = _CURRENT, None, None
        eng.shutdown()


atexit.register(shutdown_shared_engine)
