"""Compiled decoding: the model's one forward (no second implementation), captured by ``torch.compile`` over a
:class:`StaticKVCache`, and the runner that chooses per shape between that and the AOT programs (:mod:`.aot`);
docs/ARCHITECTURE.md, "Compiled decoding is the same forward", and docs/speed.md give the design and the numbers.

Three compiled functions, chosen per shape (:func:`decode_strategy`): ``loop`` (:func:`_decode_loop`, every greedy
step of a generation in one ``torch.while_loop`` call: small steps, where framework overhead is most of a step; a
sampled generation calls it one step at a time), ``stepwise`` (:func:`_decode_step`, one compiled step per Python
iteration, the batch a symbol: large steps, whose frozen weights are packed once for oneDNN) and ``prefill``
(:func:`_prefill`, the prompt's forward, its length a symbol). Every call carries :func:`version_of` the model's
:func:`fingerprint` (weights, hooks, modes): a frozen graph holds a copy of the weights, so an in-place edit or a new
hook recompiles instead of replaying stale weights. Dynamo's guards (~1.5 ms) are evaluated only the first time a
situation is met in the process. Without a C++ compiler (or if compilation fails otherwise) the runner warns once
and runs the forward eagerly. Importing this module has no global effect (see :func:`_epoch` and :mod:`.kernels`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import os
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

from ...model.gguf_blocks import block_products, reference_product
from ...model.position_lm import PositionDrivenLM as GPT  # our GPT or the Llama family (model.llama_family)
from ...model.weight_only import NARROW_WEIGHT_DTYPES
from ..samplers.chain import check_logits
from . import kernels
from .kernels import KERNEL_MAX_ROWS
from .static_cache import StaticKVCache

#: What a compiled graph of a model depends on besides input shapes (see :func:`fingerprint`).
Fingerprint = tuple[Hashable, ...]
_T = TypeVar("_T")

# Read by Inductor when a graph is compiled: switched on only around first steps.
RECOMPILE_LIMIT = 64
COMPILE_CONFIG = {
    "cpp_wrapper": True,
    "freezing": True,
    "max_autotune": True,
    "coordinate_descent_tuning": True,
    **kernels.BUILD_CONFIG,
}


# The thresholds below are measured; docs/speed.md, "The compiled path's thresholds", has the figures.
# Up to this many parameter-rows per step (parameters x batch) a step's kernels are too small to split across threads.
SINGLE_THREAD_MAX_WORK = 1_000_000
# From this many parameter-rows per step, with at least two rows, a step is dominated by its matrix products and runs
# faster as one compiled step per Python iteration (weights frozen, packed once for oneDNN) than inside the compiled
# loop, whose body receives the weights as loop operands that cannot be packed.
STEPWISE_MIN_WORK = 16_000_000
# Prompts of models that large are prefilled by a compiled graph up to this many tokens (batch x length).
COMPILED_PREFILL_MAX_ROWS = 256


def uses_kernels(model: GPT, batch_size: int) -> bool:
    """Whether the decode loop of ``batch_size`` rows of ``model`` runs its products on genprobe's kernels."""
    if batch_size > KERNEL_MAX_ROWS or model.wte.weight.dtype != torch.float32:
        return False
    return kernels.load().available


def compile_config(model: GPT, batch_size: int) -> dict[str, Any]:
    """Inductor settings for the decode loop of ``batch_size`` rows of ``model``: single-threaded for a tiny step,
    the products on :mod:`.kernels` up to ``KERNEL_MAX_ROWS`` rows, else at batch 1 fused by ``decompose_mm_pass``
    (the same float32 maths, summed in another order)."""
    cfg: dict[str, Any] = {**COMPILE_CONFIG, "cpp.threads": _threads(model, batch_size)}
    if uses_kernels(model, batch_size):
        cfg.update(kernels.inductor_config(KERNEL_MAX_ROWS))
    elif batch_size == 1:
        cfg["post_grad_fusion_options"] = {"decompose_mm_pass": {"cpu_max_other_dimension_decomposition": 1 << 30}}
    return cfg


def _threads(model: GPT, batch_size: int) -> int:
    return 1 if model.num_parameters() * batch_size <= SINGLE_THREAD_MAX_WORK else -1


def decode_strategy(model: GPT, batch_size: int) -> str:
    """How greedy steps of ``batch_size`` rows of ``model`` are compiled: ``"loop"`` or ``"stepwise"`` (see above)."""
    if batch_size >= 2 and parameter_count(model) * batch_size >= STEPWISE_MIN_WORK:
        return "loop" if _reads_narrow_weights(model, batch_size) else "stepwise"
    return "loop"


def _reads_narrow_weights(model: GPT, batch_size: int) -> bool:
    """Whether ``model`` stores weight-only narrow weights (bfloat16, int8) that the kernels read at this batch (the
    stepwise path's oneDNN packing would widen them to float32)."""
    if batch_size > KERNEL_MAX_ROWS:
        return False
    return any(p.dtype in NARROW_WEIGHT_DTYPES or p.dtype == torch.uint8 for p in model.parameters())


def prefill_config(model: GPT) -> dict[str, Any]:
    """Inductor settings for the compiled prompt forward (:func:`_prefill`) of ``model``: below ``STEPWISE_MIN_WORK``
    parameters its products on genprobe's kernels, single-threaded; a large model keeps :func:`stepwise_config`."""
    blocks = any(p.dtype == torch.uint8 for p in model.parameters())  # a GGUF file's blocks: only the kernels read them
    if (blocks or model.num_parameters() < STEPWISE_MIN_WORK) and uses_kernels(model, 1):
        # Not frozen: freezing would pack the weights for oneDNN before the kernels' pass sees the products. (Nor
        # ``cpp.weight_prepack: False``: Inductor registers its packing patterns once per process, on first use,
        # and a first use with packing off would leave every later stepwise graph unpacked.)
        cfg = {"cpp_wrapper": True, "freezing": False, "cpp.threads": -1 if blocks else 1, **kernels.BUILD_CONFIG}
        return {**cfg, **kernels.inductor_config(None)}
    return stepwise_config()


#: Set to ``0`` to decode through ``torch.compile``'s loop instead of the AOT-compiled programs (engine.fast.aot).
AOT_ENV = "GENPROBE_AOT"


def uses_aot(model: GPT, batch_size: int, fp: Fingerprint | None = None) -> bool:
    """Whether greedy steps of ``batch_size`` rows of ``model`` run through :mod:`genprobe.engine.fast.aot` (see there).

    For the loop-strategy shapes of a float32 model in eval mode without hooks, when the kernels' library is
    available (it holds the C++ loop), ``GENPROBE_AOT`` is not ``0`` and the backend is Inductor. Hooks and
    training mode change what a forward does, which an exported program cannot follow; those calls take the
    ``torch.compile`` path, whose guards see them. ``fp``: the model's :func:`fingerprint`, when the caller has it.
    """
    fp = fingerprint(model) if fp is None else fp
    return _aot_wanted(model, batch_size, fp) and uses_kernels(model, batch_size)


def _aot_wanted(model: GPT, batch_size: int, fp: Fingerprint) -> bool:
    """:func:`uses_aot` but for the kernels (whose first use builds them)."""
    if os.environ.get(AOT_ENV, "1") == "0" or model.training or batch_size > KERNEL_MAX_ROWS:
        return False
    if compile_backend() != "inductor":  # the programs are AOTInductor's: no Inductor asked for, none built
        return False
    # A large model's batched float32 steps are GEMMs that oneDNN's packed kernels (the stepwise path) run faster.
    if batch_size > 1 and parameter_count(model) >= STEPWISE_MIN_WORK and not _reads_narrow_weights(model, batch_size):
        return False
    return fp[1] == 0 and model.wte.weight.dtype == torch.float32


# Per model, its AOT decoders by (batch, capacity); None records a shape whose compilation failed (not retried).
_aot_decoders: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[int, int], Any]] = weakref.WeakKeyDictionary()
# Per model, the background builds of its AOT programs by (batch, capacity) (see aot_building).
_Builds = dict[tuple[int, int], Future[None]]
_aot_builds: weakref.WeakKeyDictionary[torch.nn.Module, _Builds] = weakref.WeakKeyDictionary()

#: Set to ``0`` to build a shape's AOT programs inside the call that first needs them (it waits, minutes for a large
#: model) instead of in a background thread while that call and the next ones run eagerly (see aot_building).
AOT_BACKGROUND_ENV = "GENPROBE_AOT_BACKGROUND"


def aot_building(model: GPT, batch_size: int, capacity: int, fp: Fingerprint | None = None) -> bool:
    """Whether this shape's AOT programs are being built in the background: the caller then runs the step eagerly
    (:meth:`CompiledGPTRunner._eager_step`) instead of waiting. Starts the build on the first call that wants
    programs which are not cached yet (kernels included), unless ``GENPROBE_AOT_BACKGROUND=0``.

    A first call thus gives its first token after an eager prompt forward, not after minutes of compilation; the
    first call after the build has ended loads the programs from disk. A build that failed is warned about once,
    and the ``torch.compile`` path decodes that shape, as for a failed build in the foreground.
    """
    key = (batch_size, capacity)
    builds = _aot_builds.setdefault(model, {})
    future = builds.get(key)
    if future is None:
        if os.environ.get(AOT_BACKGROUND_ENV, "1") == "0" or key in _aot_decoders.get(model, {}):
            return False
        from .aot import build_in_background, program_path

        threads = _threads(model, batch_size)
        paths = (program_path(model, batch_size, capacity, threads, k) for k in ("step", "prompt"))  # lazy
        if kernels.build.loaded() and all(p.exists() for p in paths):
            return False
        if not _aot_wanted(model, batch_size, fingerprint(model) if fp is None else fp):
            return False
        future = builds[key] = build_in_background(model, batch_size, capacity, threads)
        if not _finishing_at_exit:
            _finishing_at_exit.append(atexit.register(_finish_builds_at_exit))
    if not future.done():
        return True
    if future.exception() is not None and key not in _aot_decoders.setdefault(model, {}):
        _aot_decoders[model][key] = None
        _warn_aot_failed(future.exception())
    return False


def _first_line(exc: BaseException | None) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _warn_aot_failed(exc: BaseException | None) -> None:
    msg = f"ahead-of-time compilation failed ({_first_line(exc)}); decoding through torch.compile instead"
    warnings.warn(msg, RuntimeWarning, stacklevel=4)


_finishing_at_exit: list[Callable[[], None]] = []


def _finish_builds_at_exit() -> None:
    """A process that ends while programs build waits for them (else a one-shot command would never get them)."""
    if any(not f.done() for builds in list(_aot_builds.values()) for f in builds.values()):
        print("genprobe: finishing the compiled programs for the next run (Ctrl-C skips)", file=sys.stderr, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            wait_for_builds()


def wait_for_builds(timeout: float | None = None) -> None:
    """Wait until every background build of this process has ended (benchmarks measure steady state after it)."""
    for builds in list(_aot_builds.values()):
        for future in list(builds.values()):
            with contextlib.suppress(Exception):
                future.result(timeout)


def aot_decoder(model: GPT, batch_size: int, capacity: int, fp: Fingerprint | None = None) -> Any | None:
    """The :class:`~genprobe.engine.fast.aot.AOTDecoder` for this shape (built on first use), bound to the weights.

    None where :func:`uses_aot` says no, while :func:`aot_building`, or where building failed (warned once per
    shape; the ``torch.compile`` path then decodes it). ``fp``: the model's :func:`fingerprint`, when the caller has it.
    """
    fp = fingerprint(model) if fp is None else fp
    if aot_building(model, batch_size, capacity, fp) or not uses_aot(model, batch_size, fp):
        return None
    decoders = _aot_decoders.setdefault(model, {})
    key = (batch_size, capacity)
    if key not in decoders:
        from .aot import AOTDecoder

        try:
            decoders[key] = AOTDecoder(model, batch_size, capacity, _threads(model, batch_size))
        except Exception as exc:  # export or AOTInductor refused this model: the torch.compile path takes over
            decoders[key] = None
            _warn_aot_failed(exc)
    decoder = decoders[key]
    if decoder is not None:
        decoder.bind(fp[0])
    return decoder


def stepwise_config() -> dict[str, Any]:
    """Inductor settings for one compiled step of a large batch (see :func:`_decode_step`).

    No ``max_autotune``: its GEMM templates would compete with the oneDNN-packed products the batch
    dimension being a symbol selects (Inductor packs frozen fp32 weights for oneDNN when the batch is
    dynamic, for MKL's packed GEMM when it is static; the oneDNN kernels are the fast ones here).
    """
    return {"cpp_wrapper": True, "freezing": True, "cpp.threads": -1, **kernels.BUILD_CONFIG}


def _decode_step(
    model: GPT, version: int, cache: StaticKVCache, ids: Tensor, valid: Tensor, done: Tensor, eos: Tensor, span: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One greedy step, as one iteration of :func:`_decode_loop` does it. Returns (token, its validity, done, logits).

    Compiled with the batch dimension as a symbol: one graph serves every batch size from 2 up. ``span`` is
    one longer than the cache slots written after this step (its length only; a symbol too, at least 2 even after
    a one-token prompt, so that Dynamo does not specialise it): attention reads those slots, not the whole capacity.
    """
    if version == -1:  # a branch on the value is what makes Dynamo guard on it (see _decode_loop)
        raise ValueError("version -1 is reserved")
    return _greedy_step(model, cache.view(span.shape[0] - 1), ids, valid, done, eos)


def _greedy_step(
    model: GPT, cache: StaticKVCache, ids: Tensor, valid: Tensor, done: Tensor, eos: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(token, its validity, done, logits): the argmax, padding (0) where the row had finished before it."""
    step_logits = model(ids, cache=cache, attention_mask=valid)[:, -1]
    nxt = torch.where(done, 0, step_logits.argmax(dim=-1))
    return nxt, ~done, done | (nxt == eos), step_logits


def _prefill(
    model: GPT, version: int, cache: StaticKVCache, ids: torch.Tensor, valid: torch.Tensor | None
) -> torch.Tensor:
    """The prompt's forward (B, T > 1) into the static cache: logits (B, T, V). Compiled with T as a symbol.

    One graph then serves every prompt length of a (batch size, capacity), and the symbolic row count
    (B x T) makes Inductor pack the frozen weights for oneDNN, as for :func:`_decode_step`.
    """
    if version == -1:  # guarded on, see _decode_loop
        raise ValueError("version -1 is reserved")
    logits: torch.Tensor = model(ids, cache=cache.view(), attention_mask=valid)
    return logits


def _decode_loop(
    model: GPT,
    version: int,
    cache: StaticKVCache,
    ids: torch.Tensor,
    valid: torch.Tensor,
    done: torch.Tensor,
    eos: torch.Tensor,
    steps: torch.Tensor,
    tokens: torch.Tensor,
    valids: torch.Tensor,
    logits: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to ``steps`` greedy decode steps in one ``torch.while_loop`` call (no Python between steps), each step
    :func:`_decode_step`'s work: a row already ``done`` emits padding (``pad_id`` 0, invalid), a row finishes at
    ``eos`` ((1,), -1 for none), the loop stops once every row has. ``ids``/``valid`` (B, 1) are the first step's
    input; step ``i`` writes its token, validity and (when given) raw logits at index ``i`` of ``tokens``/``valids``
    (B, S) and ``logits`` (B, S, V). Returns (steps run, finished rows).

    ``version`` (:func:`version_of` the :func:`fingerprint`) is unused by the maths, there to be guarded on: the
    frozen graph holds a copy of the weights, so an in-place edit (a loop patch, ``load_state_dict``) or a forward
    hook added since (Dynamo's ``skip_nnmodule_hook_guards`` misses one) must recompile.
    """
    if version == -1:  # a branch on the value is what makes Dynamo guard on it
        raise ValueError("version -1 is reserved")

    def more(i: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        return (i < steps) & ~done.all()

    def step(
        i: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor, done: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        # A fresh view per step: the loop body may not set attributes of the cache object itself.
        nxt, emitted_valid, now_done, step_logits = _greedy_step(model, cache.view(), ids, valid, done, eos)
        at = i.view(1)
        tokens.index_copy_(1, at, nxt[:, None])
        valids.index_copy_(1, at, emitted_valid[:, None])
        if logits is not None:
            logits.index_copy_(1, at, step_logits[:, None])
        return i + 1, nxt[:, None], emitted_valid[:, None], now_done

    start = torch.zeros((), dtype=torch.long, device=ids.device)
    # torch's while_loop higher-order op has no type annotations
    ran, _, _, done = torch._higher_order_ops.while_loop(  # type: ignore[no-untyped-call]
        more, step, (start, ids, valid, done)
    )
    return ran, done


# Bumped whenever any module anywhere gets a new submodule, parameter or buffer: cached lists below are then stale.
_module_epoch = [0]
# Per kind of cached value (see _cached), per model: (epoch, value).
_by_epoch: dict[str, weakref.WeakKeyDictionary[torch.nn.Module, tuple[int, Any]]] = {}


def _bump_epoch(module: torch.nn.Module, name: str, value: Any) -> None:
    _module_epoch[0] += 1  # returns None: the hook must not replace what is being registered


@functools.cache
def _watch() -> None:
    """Install the global registration hooks that bump the epoch, once.

    On first use of the compiled path, not at import: importing this module changes nothing in ``torch.nn``. No
    cached list exists before the first call, so none can have missed a registration.
    """
    for kind in ("module", "parameter", "buffer"):
        getattr(torch.nn.modules.module, f"register_module_{kind}_registration_hook")(_bump_epoch)


def _epoch() -> int:
    """The current module epoch (see :func:`_watch`)."""
    _watch()
    return _module_epoch[0]


def _cached(kind: str, model: torch.nn.Module, compute: Callable[[], _T]) -> _T:
    """``compute()``, cached per ``model`` until anything is registered anywhere (walking a model costs ~40 µs)."""
    table = _by_epoch.setdefault(kind, weakref.WeakKeyDictionary())
    cached, epoch = table.get(model), _epoch()
    if cached is None or cached[0] != epoch:
        cached = table[model] = (epoch, compute())
    value: _T = cached[1]
    return value


def _modules_of(model: torch.nn.Module) -> list[torch.nn.Module]:
    return _cached("modules", model, lambda: list(model.modules()))


def parameter_count(model: GPT) -> int:
    """``model.num_parameters()``, cached (a sum over every parameter)."""
    return _cached("parameters", model, model.num_parameters)


_model_serials: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()
_next_serial = itertools.count(1)


def weights_version(model: torch.nn.Module) -> int:
    """A number that changes whenever a parameter or buffer is replaced or modified in place, unique to ``model``.

    Tensor ids and addresses alone are not enough: a model built where a freed one was (same architecture, the
    allocator handing out the same blocks) can show the same ids, addresses and version counters, and would
    then be given the frozen graph of the freed model's weights. The model's serial rules that out.
    """
    # The tensors are read from each module's own parameter and buffer dicts every time: a replaced or deleted one
    # shows (a module registered since bumps the epoch, so the list of dicts is rebuilt then).
    dicts = _cached("dicts", model, lambda: [d for m in _modules_of(model) for d in (m._parameters, m._buffers)])
    state = tuple([(id(t), t.data_ptr(), t._version) for d in dicts for t in d.values() if t is not None])
    serial = _model_serials.setdefault(model, next(_next_serial))  # unlike ``id``, never reused by another model
    return hash((serial, state)) & (2**62 - 1)


def fingerprint(model: torch.nn.Module) -> Fingerprint:
    """What a compiled graph of ``model`` depends on besides input shapes, cheap enough to check per generation.

    Dynamo's own guards check all of it and more, but evaluating them costs ~1.5 ms per call; they
    run on the first call in each new fingerprint (see :meth:`CompiledGPTRunner._call`).
    """
    # The modules' own hook dicts (a hook added later shows), and the global ones.
    own = _cached(
        "hooks", model, lambda: [d for m in _modules_of(model) for d in (m._forward_hooks, m._forward_pre_hooks)]
    )
    glob = torch.nn.modules.module
    hooks = sum(map(len, own)) + len(glob._global_forward_hooks) + len(glob._global_forward_pre_hooks)
    cfg = getattr(model, "cfg", None)
    modes = (model.training, torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_num_threads())
    return (weights_version(model), hooks, id(cfg), cfg, *modes)


def version_of(fp: Fingerprint) -> int:
    """The fingerprint as the int the compiled loop is guarded on (Dynamo itself does not guard on hooks)."""
    return hash(fp) & (2**62 - 1)


# Per model, the situations (loop length, batch size, capacity, fingerprint) its graphs have run in.
_warm: weakref.WeakKeyDictionary[torch.nn.Module, set[tuple[Hashable, ...]]] = weakref.WeakKeyDictionary()


_compiled: dict[str, Any] = {}
_runners: weakref.WeakKeyDictionary[torch.nn.Module, "CompiledGPTRunner"] = weakref.WeakKeyDictionary()
_compile_error: str | None = None  # set once per process when compilation fails: not retried every call


_FUNCTIONS: dict[str, Callable[..., Any]] = {"loop": _decode_loop, "stepwise": _decode_step, "prefill": _prefill}


#: Set to ``aot_eager`` (or ``eager``) to run the compiled path's own logic traced by Dynamo but executed by PyTorch's
#: eager kernels, without Inductor (the tests use it where they check that logic and not Inductor's code).
BACKEND_ENV = "GENPROBE_COMPILE_BACKEND"
_BACKENDS = ("inductor", "aot_eager", "eager")


def _kernel_block_product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ggml_type: int
) -> torch.Tensor:
    out: torch.Tensor = torch.ops.genprobe.small_linear_ggml(x.contiguous(), weight, bias, ggml_type)
    return out


def compile_backend() -> str:
    """The backend ``torch.compile`` builds the decode graphs with: Inductor unless :data:`BACKEND_ENV` says."""
    backend = os.environ.get(BACKEND_ENV) or "inductor"
    if backend not in _BACKENDS:
        raise ValueError(f"{BACKEND_ENV} must be one of {', '.join(_BACKENDS)}; got {backend!r}")
    return backend


def compiled_fn(kind: str) -> Any:
    """The process-wide compiled ``kind`` (a key of ``_FUNCTIONS``), compiled lazily, cached by torch."""
    key = f"{kind}:{compile_backend()}"
    if key not in _compiled:
        # dynamic=False: only the dimensions the runner marks (batch, prompt length) become symbols.
        _compiled[key] = torch.compile(_FUNCTIONS[kind], fullgraph=True, dynamic=False, backend=compile_backend())
    return _compiled[key]


def static_capacity(max_len: int, max_positions: int | None) -> int:
    """Cache capacity for a generation of ``max_len`` tokens, rounded up so that lengths share a graph: the next power
    of two (at least 64), never more than the model's context length when it has one. Not the context length
    itself: a step of the compiled loop and of the AOT programs reads every slot of the capacity."""
    bucket = max(64, 1 << (max_len - 1).bit_length())
    if max_positions is not None and max_len <= max_positions:
        return min(bucket, max_positions)
    return bucket


def compile_error() -> str | None:
    """Why compilation failed in this process (None if it worked or was not tried yet)."""
    return _compile_error


@dataclass
class GreedyChunk:
    """What one compiled call of greedy decode steps returns (see ``compiled._decode_loop``)."""

    tokens: torch.Tensor  # (B, steps run) long
    valid: torch.Tensor  # (B, steps run) bool: False for the padding a finished row emits
    done: torch.Tensor  # (B,) bool, rows finished after the call
    logits: torch.Tensor | None  # (B, steps run, V) raw logits of every step, when asked for


@dataclass
class GreedyRun:
    """A finished greedy generation: what :class:`~genprobe.engine.runner.GenerationResult` reports of it."""

    tokens: list[list[int]]
    finished: list[str]
    token_forwards: int
    forward_calls: int
    seconds: float
    step_logits: list[torch.Tensor] | None


#: Capacity-shaped buffers one generation's compiled calls write into (see :func:`_decode_loop`): tokens (B, capacity)
#: long, their validity (B, capacity) bool, raw logits (B, capacity, V) once asked for.
_Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


class CompiledGPTRunner:
    """The reference GPT behind the generation ``Runner`` protocol, decode steps compiled (see module doc)."""

    pad_id = 0  # what _decode_loop emits for finished rows

    def __init__(self, model: GPT):
        if not isinstance(model, GPT):
            raise TypeError(
                f"compiled decoding is for genprobe GPT and Llama-family models, got {type(model).__name__}"
            )
        self.model = model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.vocab_size = model.cfg.vocab_size
        self.max_positions = model.cfg.max_positions
        # Per state (one generation): the model's fingerprint at its first compiled call, output buffers.
        self._fingerprints: weakref.WeakKeyDictionary[StaticKVCache, Fingerprint] = weakref.WeakKeyDictionary()
        self._outputs: weakref.WeakKeyDictionary[StaticKVCache, _Outputs] = weakref.WeakKeyDictionary()
        self._pool: dict[tuple[int, int], list[StaticKVCache]] = {}
        self._marked: weakref.WeakSet[StaticKVCache] = weakref.WeakSet()  # caches with symbolic-dimension marks
        # Read-only inputs of the compiled programs, made once: the end token by id, all-true masks by shape.
        self._constants: dict[Hashable, torch.Tensor] = {}

    @classmethod
    def for_model(cls, model: GPT) -> "CompiledGPTRunner":
        """The runner of ``model`` (one per model, so that its pooled caches and buffers outlive a generation)."""
        runner = _runners.get(model)
        if runner is None:
            runner = _runners[model] = cls(model)
        return runner

    def new_state(self, batch_size: int, max_len: int) -> StaticKVCache:
        """An empty static cache of capacity :func:`static_capacity` (one compiled graph serves many lengths).

        A cache given back with :meth:`release_state` is reused (reset, with its output buffers) instead of
        allocating a new one.
        """
        cap = static_capacity(max_len, self.max_positions)
        pool = self._pool.get((batch_size, cap))
        if pool:
            state = pool.pop()
            state.reset()
            self._fingerprints.pop(state, None)  # the model may have changed since: fingerprint it afresh
            return state
        return StaticKVCache.for_model(self.model.cfg, batch_size, max_len=cap, dtype=self.dtype, device=self.device)

    def release_state(self, state: StaticKVCache) -> None:
        """Give back a cache nobody uses any more, for :meth:`new_state` to reuse.

        Not one that a stepwise call marked (``torch._dynamo.mark_dynamic`` records a symbolic batch on the tensors
        themselves, which the next generation's prefill graph, specialised on the batch, would then refuse).
        """
        if state not in self._marked:
            self._pool.setdefault((state.batch_size, state.capacity), []).append(state)

    def _fingerprint(self, state: StaticKVCache) -> Fingerprint:
        """The model's fingerprint, taken once per generation (per state): a weight edit between generations shows."""
        fp = self._fingerprints.get(state)
        if fp is None:
            fp = self._fingerprints[state] = fingerprint(self.model)
        return fp

    def _aot(self, batch: int, state: StaticKVCache) -> Any | None:
        """The shape's :func:`aot_decoder`, None where compilation failed in this process."""
        if _compile_error is not None:
            return None
        return aot_decoder(self.model, batch, state.capacity, self._fingerprint(state))

    def _building(self, batch: int, state: StaticKVCache) -> bool:
        return _compile_error is None and aot_building(self.model, batch, state.capacity, self._fingerprint(state))

    def step(self, ids: torch.Tensor, valid: torch.Tensor | None, state: StaticKVCache) -> torch.Tensor:
        """Prefill (T > 1) compiled, a one-token step through the compiled loop: logits (B, T, V)."""
        aot = self._aot(ids.shape[0], state)
        if aot is not None and ids.shape[1] > 1:  # the chunk program: logits of every position
            ids, mask = self._aot_inputs(ids, valid, state)
            logits: torch.Tensor = aot.with_chunk().forward(ids, mask, state.tensors())
            return logits
        if aot is not None:
            return self._aot_last(aot, ids, valid, state)[:, None]
        if _compile_error is not None or self._building(ids.shape[0], state):
            return self._eager_step(ids, valid, state)
        # The compiled graphs skip the host-side range checks of GPT.forward; the same limits, checked here.
        self.model.check_ids(ids)
        if ids.shape[1] > 1:
            # A compiled prefill pays off up to a few hundred rows, for a small model once its products run on the
            # kernels (docs/speed.md, "The compiled path's thresholds").
            if ids.numel() <= COMPILED_PREFILL_MAX_ROWS and (
                self.model.num_parameters() >= STEPWISE_MIN_WORK or uses_kernels(self.model, 1)
            ):
                self._check_room(state, ids.shape[1])
                prefilled: torch.Tensor | None = self._call("prefill", state, ids, valid, ())
                if prefilled is not None:
                    return prefilled
            return self._eager_step(ids, valid, state)
        chunk = self.decode_greedy(ids, valid, torch.zeros(ids.shape[0], dtype=torch.bool), state, 1, None, True)
        if chunk is None:  # compilation failed just now: redo eagerly
            return self._eager_step(ids, valid, state)
        assert chunk.logits is not None  # asked for with_logits=True
        return chunk.logits

    def _aot_inputs(
        self, ids: torch.Tensor, valid: torch.Tensor | None, state: StaticKVCache, room: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids`` and their validity as the AOT programs take them, after the checks those programs skip (``room``:
        the cache slots the call fills, default ``ids``' length)."""
        self.model.check_ids(ids)  # the compiled programs skip GPT.forward's host-side checks
        self._check_room(state, ids.shape[1] if room is None else room)
        ids = ids.contiguous()
        if valid is None:  # an all-true mask, made once per shape
            return ids, self._constant(ids.shape, lambda: torch.ones(ids.shape, dtype=torch.bool, device=ids.device))
        return ids, valid.to(torch.bool).contiguous()

    def _aot_last(self, aot: Any, ids: torch.Tensor, valid: torch.Tensor | None, state: StaticKVCache) -> torch.Tensor:
        """Logits (B, V) of the last position, through the step program (T == 1) or the prompt program (T > 1)."""
        ids, mask = self._aot_inputs(ids, valid, state)
        done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
        logits: torch.Tensor = aot.decoder.step(ids, mask, done, self._eos(None), state.tensors())[3]
        return logits

    def last_logits(self, ids: torch.Tensor, valid: torch.Tensor | None, state: StaticKVCache) -> torch.Tensor:
        """What :meth:`step` gives for the last position only, (B, V): a prompt's forward before sampling, through
        the AOT prompt program where it applies (the head applied to that position alone)."""
        aot = self._aot(ids.shape[0], state)
        return self.step(ids, valid, state)[:, -1] if aot is None else self._aot_last(aot, ids, valid, state)

    def greedy_all(
        self,
        prompt: torch.Tensor,
        prompt_valid: torch.Tensor | None,
        max_new_tokens: int,
        eos_id: int | None = None,
        on_token: Callable[[int, list[int]], None] | None = None,
        return_logits: bool = False,
    ) -> GreedyRun | None:
        """The :class:`~genprobe.engine.runner.Runner` protocol's optional plain-greedy hook: a whole greedy generation
        after the (B, P) left-padded ``prompt`` (``prompt_valid``: None when no row is padded), booked as the per-step
        loop of :func:`~genprobe.engine.generate.generate` books it (that loop is the reference it is tested against).

        Two shapes, tried in order: the whole generation in one call (:meth:`generate_greedy`, the AOT programs' C++
        loop), else the prompt's forward and every later step in one call (:meth:`decode_greedy`). None, with nothing
        reported through ``on_token``, where compilation is unavailable or while this shape's programs build in the
        background (:func:`aot_building`): ``generate`` then runs its loop.
        """
        (B, P), N = prompt.shape, int(max_new_tokens)
        if _compile_error is None and aot_building(self.model, B, static_capacity(P + N, self.max_positions)):
            return None
        t0 = time.perf_counter()
        with torch.inference_mode():
            state = self.new_state(B, P + N)
            chunk = self.generate_greedy(prompt, prompt_valid, state, N, eos_id, return_logits)
            if chunk is None:
                chunk = self._prefill_then_loop(prompt, prompt_valid, state, N, eos_id, return_logits)
            self.release_state(state)
        if chunk is None:
            return None
        seconds = time.perf_counter() - t0
        taken: int = chunk.tokens.shape[1]
        rows: list[list[int]] = chunk.tokens.tolist()
        finished = ["length"] * len(rows)
        if eos_id is not None:
            for b, row in enumerate(rows):
                if eos_id in row:  # a finished row emits padding after its eos: cut there
                    rows[b], finished[b] = row[: row.index(eos_id) + 1], "eos"
        # Reported only now, after the compiled calls: a None above leaves nothing half-reported.
        if on_token is not None:
            shown = torch.where(chunk.valid, chunk.tokens, -1).tolist()
            for j in range(taken):
                on_token(j, [row[j] for row in shown])
        logits = chunk.logits
        step_logits = [logits[:, j].float().clone() for j in range(taken)] if logits is not None else None
        return GreedyRun(rows, finished, P + taken - 1, taken, seconds, step_logits)

    def _prefill_then_loop(
        self,
        prompt: torch.Tensor,
        prompt_valid: torch.Tensor | None,
        state: StaticKVCache,
        N: int,
        eos_id: int | None,
        return_logits: bool,
    ) -> GreedyChunk | None:
        """The prompt's forward (step 0), then steps 1 .. N-1 in one compiled call, as one chunk of every step."""
        logits = self.last_logits(prompt, prompt_valid, state)
        check_logits(logits, sampling=False)
        first = logits.argmax(dim=-1)
        done = first == eos_id if eos_id is not None else torch.zeros_like(first, dtype=torch.bool)
        out = GreedyChunk(first[:, None], torch.ones_like(first[:, None], dtype=torch.bool), done, None)
        out.logits = logits[:, None].float() if return_logits else None
        if N == 1 or bool(done.all()):
            return out
        rest = self.decode_greedy(out.tokens, None, done, state, N - 1, eos_id, return_logits)
        if rest is None:  # compilation unavailable: nothing reported yet, the caller's per-step loop decodes
            return None
        tokens, valid = torch.cat([out.tokens, rest.tokens], 1), torch.cat([out.valid, rest.valid], 1)
        if out.logits is not None and rest.logits is not None:
            out.logits = torch.cat([out.logits, rest.logits.float()], 1)
        return GreedyChunk(tokens, valid, rest.done, out.logits)

    def generate_greedy(
        self,
        prompt: torch.Tensor,
        prompt_valid: torch.Tensor | None,
        state: StaticKVCache,
        steps: int,
        eos_id: int | None = None,
        with_logits: bool = False,
    ) -> GreedyChunk | None:
        """A whole greedy generation into a fresh ``state`` in one call: the prompt's forward, then ``steps`` tokens.

        Runs the AOT programs' C++ loop (:mod:`genprobe.engine.fast.aot`); None where they do not apply, and the
        caller prefills and then calls :meth:`decode_greedy`. Fewer tokens come back when every row ends with
        ``eos_id``.
        """
        aot = self._aot(prompt.shape[0], state)
        if aot is None:
            return None
        prompt, valid = self._aot_inputs(prompt, prompt_valid, state, prompt.shape[1] + steps - 1)
        # The C++ loop allocates what it returns: a generation is one call, with nothing to copy after it.
        tokens, valids, done, logits = aot.decoder.generate(
            prompt, valid, self._eos(eos_id), state.tensors(), steps, with_logits
        )
        return GreedyChunk(tokens, valids, done, logits if with_logits else None)

    def _constant(self, key: Hashable, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``make()``, made once per ``key``: an input the compiled programs read and never write."""
        made = self._constants.get(key)
        if made is None:
            made = self._constants[key] = make()
        return made

    def _eager_step(self, ids: torch.Tensor, valid: torch.Tensor | None, state: StaticKVCache) -> torch.Tensor:
        # A GGUF file's block layers multiply on the kernels once they are loaded, not by dequantizing every weight
        # in numpy on every call (the reference): the programs' own products, for the steps run while they build.
        with block_products(_kernel_block_product if kernels.build.loaded() else reference_product):
            logits: torch.Tensor = self.model(ids, cache=state, attention_mask=valid)
        return logits

    def decode_greedy(
        self,
        ids: torch.Tensor,
        valid: torch.Tensor | None,
        done: torch.Tensor,
        state: StaticKVCache,
        steps: int,
        eos_id: int | None = None,
        with_logits: bool = False,
    ) -> GreedyChunk | None:
        """Up to ``steps`` greedy decode steps in one compiled call (None when compilation is unavailable).

        ``ids`` (B, 1) are the last chosen tokens (in range: they came from an argmax or were checked),
        ``valid`` (B, 1) their validity (None when every row is real), ``done`` (B,) the rows that
        already hit ``eos_id``. Fewer steps run when every row reaches ``eos_id``.
        """
        if _compile_error is not None:
            return None
        self._check_room(state, steps)
        B = ids.shape[0]
        if valid is None:
            valid = torch.ones((B, 1), dtype=torch.bool, device=ids.device)
        eos = self._eos(eos_id)
        tokens, valids, logits = self._buffers(state, B, with_logits)
        aot = self._aot(B, state)
        if aot is None and self._building(B, state):
            return None  # the caller steps eagerly meanwhile
        if aot is not None:
            done = done.clone()
            args = (ids.contiguous(), valid.contiguous(), done, eos, state.tensors(), steps)
            ran = aot.decoder.decode(*args, tokens, valids, logits, 0)
            return self._chunk((tokens, valids, logits), ran, done)
        if decode_strategy(self.model, B) == "stepwise":
            res = self._decode_stepwise(ids, valid, done, eos, state, steps, tokens, valids, logits)
        else:
            n = torch.full((), steps, dtype=torch.long)
            res = self._call("loop", state, ids, valid, (done.clone(), eos, n, tokens, valids, logits))
        return None if res is None else self._chunk((tokens, valids, logits), *res)

    def _eos(self, eos_id: int | None) -> torch.Tensor:
        """The end token as the compiled programs take it, (1,) int64 (-1: none)."""
        value = -1 if eos_id is None else eos_id
        return self._constant(("eos", value), lambda: torch.full((1,), value, dtype=torch.long, device=self.device))

    def _buffers(self, state: StaticKVCache, batch: int, with_logits: bool) -> _Outputs:
        """The generation's output buffers (made on its first call, or when logits are first asked); no logits
        buffer unless ``with_logits``."""
        out = self._outputs.get(state)
        if out is None or (with_logits and out[2] is None):
            V, cap, dev = self.vocab_size, state.capacity, self.device
            out = self._outputs[state] = (
                torch.zeros((batch, cap), dtype=torch.long, device=dev),
                torch.zeros((batch, cap), dtype=torch.bool, device=dev),
                torch.zeros((batch, cap, V), dtype=self.dtype, device=dev) if with_logits else None,
            )
        return out[0], out[1], out[2] if with_logits else None

    @staticmethod
    def _chunk(out: _Outputs, ran: Any, done: torch.Tensor) -> GreedyChunk:
        """The first ``ran`` entries of the output buffers (copies: the buffers are reused) and ``done``."""
        (tokens, valids, logits), n = out, int(ran)
        return GreedyChunk(
            tokens[:, :n].clone(), valids[:, :n].clone(), done, logits[:, :n].clone() if logits is not None else None
        )

    def _check_room(self, state: StaticKVCache, steps: int) -> None:
        held = state.length
        if held + steps > state.capacity:
            raise ValueError(f"KV cache overflow: {held} cached + {steps} new token(s) > capacity {state.capacity}")
        if self.max_positions is not None and held + steps > self.max_positions:
            raise ValueError(f"context overflow: the model's context length (block_size) is {self.max_positions}")

    def _decode_stepwise(
        self,
        ids: torch.Tensor,
        valid: torch.Tensor,
        done: torch.Tensor,
        eos: torch.Tensor,
        state: StaticKVCache,
        steps: int,
        tokens: torch.Tensor,
        valids: torch.Tensor,
        logits: torch.Tensor | None,
    ) -> tuple[int, torch.Tensor] | None:
        """Up to ``steps`` greedy steps, one compiled :func:`_decode_step` call each, stopping as the loop does."""
        ran, held = 0, state.length
        replay = None  # after the first call, later steps replay its graph without _call's bookkeeping
        while ran < steps and not bool(done.all()):
            res = None
            # Only its length is read (see _decode_step).
            filled = torch.empty(held + ran + 2, dtype=torch.bool, device=ids.device)
            if replay is not None:
                try:
                    with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                        version = version_of(self._fingerprints[state])
                        res = replay(self.model, version, state, ids, valid, done, eos, filled)
                except RuntimeError as exc:
                    if "skip_guard_eval_unsafe" not in str(exc):
                        raise
            if res is None:  # the first step, or a replay Dynamo refused: guards (and compilation) as usual
                res = self._call("stepwise", state, ids, valid, (done.clone(), eos, filled))
                if res is None:
                    return None
                replay = compiled_fn("stepwise")
            nxt, emitted_valid, done, step_logits = res
            tokens[:, ran] = nxt
            valids[:, ran] = emitted_valid
            if logits is not None:
                logits[:, ran] = step_logits
            ids, valid = nxt.view(-1, 1), emitted_valid.view(-1, 1)
            ran += 1
        return ran, done

    def _call(
        self, kind: str, state: StaticKVCache, ids: torch.Tensor, valid: torch.Tensor | None, rest: tuple[Any, ...]
    ) -> Any | None:
        """Run the compiled ``kind`` (:func:`compiled_fn`); a first call per situation evaluates guards, compiling.

        Returns what the compiled function returns, or None when compilation failed (then the caller runs
        the step eagerly; the cache is untouched).
        """
        global _compile_error
        # Fresh contiguous copies: a column sliced from a (B, P+N) buffer has stride P+N, which Dynamo guards
        # on (every prompt length would recompile), and copies made here share one tensor kind (inference
        # mode or not), which guards check too.
        ids = ids.clone(memory_format=torch.contiguous_format)
        valid = None if valid is None else valid.clone(memory_format=torch.contiguous_format)
        fp = self._fingerprint(state)  # once per generation: a weight edit, hook or mode switch between them shows
        shape = ids.shape[0] if kind != "prefill" else (ids.shape[0], valid is None)
        situation = (kind, shape, state.capacity, kind == "loop" and rest[-1] is None, fp, compile_backend())
        warm = _warm.setdefault(self.model, set())
        first = situation not in warm
        # A first call evaluates every Dynamo guard (a new model, weights, batch size or capacity recompiles)
        # under the Inductor settings for this shape. A situation seen before replays the graph it selected
        # then, evaluating only the guards that tell the cached graphs apart.
        stance = self._first_call_stance(kind, state, ids, valid, rest) if first else None
        if stance is None:
            stance = torch.compiler.set_stance(skip_guard_eval_unsafe=True)
        try:
            with stance:
                out = compiled_fn(kind)(self.model, version_of(fp), state, ids, valid, *rest)
        except RuntimeError as exc:  # Dynamo's and Inductor's exceptions are RuntimeErrors too
            if not first and "skip_guard_eval_unsafe" in str(exc):
                # Dynamo found no cached graph for these inputs (something the fingerprint does not cover
                # changed): forget the situation and take the path of a first call, guards and all.
                warm.discard(situation)
                return self._call(kind, state, ids, valid, rest)
            if not first or not isinstance(exc, torch._dynamo.exc.TorchDynamoException):
                raise
            # No C++ compiler, an unsupported op, ...: say so once and decode eagerly from now on.
            _compile_error = _first_line(exc)
            msg = f"torch.compile failed, decoding eagerly instead ({_compile_error})"
            warnings.warn(msg, RuntimeWarning, stacklevel=4)
            # Dynamo applies a graph's mutations only when it runs, so the cache is untouched.
            return None
        warm.add(situation)
        return out

    def _first_call_stance(
        self, kind: str, state: StaticKVCache, ids: torch.Tensor, valid: torch.Tensor | None, rest: tuple[Any, ...]
    ) -> contextlib.ExitStack:
        """Settings for a first call: this shape's Inductor config, symbolic dimensions marked, quiet warnings."""
        if kind == "loop":
            config = compile_config(self.model, ids.shape[0])
        elif kind == "prefill":  # the prompt length as a symbol: one graph for every length
            config = prefill_config(self.model)
            for t in (ids, valid):
                if t is not None:
                    torch._dynamo.mark_dynamic(t, 1)
        else:  # stepwise, the batch size as a symbol: what makes Inductor pack weights for oneDNN
            config = stepwise_config()
            self._marked.add(state)
            for t in (ids, valid, rest[0], state.pos, state.valid, state.next_pos, *state.k, *state.v):
                torch._dynamo.mark_dynamic(t, 0)
            torch._dynamo.mark_dynamic(rest[2], 0)  # the slots attention reads (see _decode_step)
        stance = contextlib.ExitStack()
        stance.enter_context(torch._inductor.config.patch(config))
        # One graph per (model, weights, batch size, capacity, logits or not): allow more than Dynamo's 8.
        stance.enter_context(torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT))
        # Compiling imports and calls torch internals that emit deprecation notices about torch's own
        # code (torch.jit.script_method, TypedStorage); they say nothing to our users.
        stance.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message=r".*(torch\.jit\.script_method|TypedStorage)`? is deprecated")
        return stance

    def full(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Uncached forward of the whole sequence (eager)."""
        logits: torch.Tensor = self.model(ids, attention_mask=valid)
        return logits
