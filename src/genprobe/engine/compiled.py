"""Compiled decoding: the model's one forward, captured by ``torch.compile`` inside a compiled decode loop.

At batch 1 a decode step of a small model is ~40 tiny kernels whose cost is almost all framework
overhead (dispatch, allocation, Python), not arithmetic. ``torch.compile`` removes it: it traces
:meth:`GPT.forward` for one-token steps over a :class:`StaticKVCache` and fuses the element-wise work
into a few C++ kernels. The traced code is the same forward every other phase runs — there is no
second implementation of the model to keep in sync.

Three compiled functions, chosen per shape from measurements on the 2-core machine (see
:func:`decode_strategy` and the README's "Decoding speed"):

- ``loop`` (:func:`_decode_loop`): every greedy step of a generation in one call. For small steps (the
  427k model up to batch 16, any model at batch 1), where framework overhead is most of a step;
- ``stepwise`` (:func:`_decode_step`): one compiled step per Python iteration, the batch dimension a
  symbol. For large steps, which are matrix products: as graph constants (not loop operands) the frozen
  weights are packed once for oneDNN, whose fp32 GEMMs run at 2.6-3.2x the speed of the unpacked
  ``addmm`` on this AMD CPU (MKL takes a slower path there); the Python loop costs < 1% of such a step;
- ``prefill`` (:func:`_prefill`): the prompt's forward with its length a symbol (one graph for every
  length), for models of ``STEPWISE_MIN_WORK`` parameters or more and prompts of up to
  ``COMPILED_PREFILL_MAX_ROWS`` tokens; otherwise the prompt is prefilled eagerly (measured: there the
  compiled call costs more than it saves).

What makes a step cheap, each measured (``benchmarks/generate_speed.py``, ``benchmarks/bench_profile.py``):

- the decode loop itself is compiled (:func:`_decode_loop`, a ``torch.while_loop``): greedy argmax,
  eos and padding of finished rows happen inside the graph, so a whole greedy generation after the
  prefill is one call and no Python runs between steps. A sampled generation calls the same loop for
  one step at a time and samples in Python;
- a static cache (one base tensor per layer, written with ``index_put_``), so every step has the same
  shapes and one graph serves every prompt length and token count of a (batch size, capacity);
- ``freezing``: weights become constants of the graph. A frozen graph holds a copy of the weights, so
  the call carries :func:`version_of` the model's :func:`fingerprint` (weights, hooks, modes) and an
  in-place weight edit or a new hook recompiles instead of replaying stale weights;
- at batch 1 the matrix-vector products are generated as fused C++ loops (see :func:`compile_config`),
  single-threaded for small models;
- ``cpp_wrapper``: the graph is driven from C++ rather than a Python wrapper;
- Dynamo's guards (~1.5 ms) are evaluated only the first time a situation (batch size, capacity,
  logits or not, fingerprint) is met in the process; later generations replay.

``torch.compile`` needs a C++ compiler on CPU. Without one (or if compilation fails for another
reason) the runner warns once, naming the error, and runs the same forward eagerly.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch

from ..model.gpt import GPT
from .static_cache import StaticKVCache

#: What a compiled graph of a model depends on besides input shapes (see :func:`fingerprint`).
Fingerprint = tuple[Hashable, ...]

# Read by Inductor when a graph is compiled, so they are switched on only around first steps (a patch
# around every replay would cost more than the guards it sits beside).
RECOMPILE_LIMIT = 64
COMPILE_CONFIG = {"cpp_wrapper": True, "freezing": True, "max_autotune": True, "coordinate_descent_tuning": True}


# Measured on the 2-core machine (see compile_config): below this many parameter-rows per step
# (parameters x batch) a step's kernels are too small to split across threads.
SINGLE_THREAD_MAX_WORK = 4_000_000

# Measured on the 2-core machine (benchmarks/generate_speed.py, README "Decoding speed"): from this many
# parameter-rows per step, with at least two rows, a step is dominated by its matrix products and runs
# faster as one compiled step per Python iteration (weights frozen as graph constants, packed once for
# oneDNN: 2-3x the GFLOP/s of an unpacked addmm here) than inside the compiled loop, whose body receives
# the weights as loop operands that cannot be packed. Below it, the per-step overhead of a Python loop
# dominates and the whole loop stays in one call. (427k parameters: loop at batch 16, stepwise at 64;
# 57.8M: loop at batch 1, stepwise at 16 and 64.)
STEPWISE_MIN_WORK = 16_000_000
# Prompts of models that large are prefilled by a compiled graph up to this many tokens (batch x length).
COMPILED_PREFILL_MAX_ROWS = 256


def compile_config(model: GPT, batch_size: int) -> dict[str, Any]:
    """Inductor settings for the decode loop of ``batch_size`` rows of ``model``.

    - Threads: when a step is tiny (parameters x rows below ``SINGLE_THREAD_MAX_WORK``) an OpenMP
      region costs more than it saves, so the generated kernels are single-threaded; larger steps keep
      every thread (a 58M-parameter model at batch 1 is bound by reading its weights, which two cores
      do faster than one).
    - Batch 1: every matrix product is a matrix-vector product, bound by reading the weights. Inside
      the compiled loop an ATen ``addmm`` call per product costs more than the product itself for a
      small model, so Inductor's ``decompose_mm_pass`` turns them into multiply-and-sum loops it
      generates and fuses like any other kernel (same float32 maths, summed in another order).
    """
    threads = 1 if model.num_parameters() * batch_size <= SINGLE_THREAD_MAX_WORK else -1
    cfg: dict[str, Any] = {**COMPILE_CONFIG, "cpp.threads": threads}
    if batch_size == 1:
        cfg["post_grad_fusion_options"] = {"decompose_mm_pass": {"cpu_max_other_dimension_decomposition": 1 << 30}}
    return cfg


def decode_strategy(model: GPT, batch_size: int) -> str:
    """How greedy steps of ``batch_size`` rows of ``model`` are compiled: ``"loop"`` or ``"stepwise"`` (see above)."""
    if batch_size >= 2 and model.num_parameters() * batch_size >= STEPWISE_MIN_WORK:
        return "stepwise"
    return "loop"


def stepwise_config() -> dict[str, Any]:
    """Inductor settings for one compiled step of a large batch (see :func:`_decode_step`).

    No ``max_autotune``: its GEMM templates would compete with the oneDNN-packed products the batch
    dimension being a symbol selects (Inductor packs frozen fp32 weights for oneDNN when the batch is
    dynamic, for MKL's packed GEMM when it is static; the oneDNN kernels are the fast ones here).
    """
    return {"cpp_wrapper": True, "freezing": True, "cpp.threads": -1}


def _decode_step(
    model: GPT,
    version: int,
    cache: StaticKVCache,
    ids: torch.Tensor,
    valid: torch.Tensor,
    done: torch.Tensor,
    eos: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One greedy step, as one iteration of :func:`_decode_loop` does it. Returns (token, its validity, done, logits).

    Compiled with the batch dimension as a symbol: one graph serves every batch size from 2 up.
    """
    if version == -1:  # a branch on the value is what makes Dynamo guard on it (see _decode_loop)
        raise ValueError("version -1 is reserved")
    step_logits = model(ids, cache=cache.view(), attention_mask=valid)[:, -1]
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
    """Up to ``steps`` greedy decode steps in one call, each step's token fed to the next. This is what gets compiled.

    The loop is a ``torch.while_loop``: compiled once, it runs in the generated C++ for any number of
    steps, so no Python runs between steps. ``ids`` (B, 1) is the first step's input and ``valid``
    (B, 1) its key validity. Each step does what :func:`genprobe.engine.generate.generate` does per
    step with an eos token (``eos`` (1,), -1 for none): a row already ``done`` emits ``pad_id`` (0) as
    a padding token (invalid: no position, no attention), a row finishes at its eos, and the loop stops
    early once every row has. Step ``i`` writes its token, the token's validity and (when ``logits`` is
    given) its raw logits at index ``i`` of ``tokens``/``valids`` (B, S) and ``logits`` (B, S, V).
    Returns (steps run, finished rows).

    ``version`` (:func:`version_of` the model's :func:`fingerprint`) is unused by the maths; it is there
    to be guarded on: the frozen graph holds a copy of the weights, so weights edited in place (a loop
    patch, ``load_state_dict``) must recompile, and so must a forward hook added since (Dynamo's default
    ``skip_nnmodule_hook_guards`` does not notice one).
    """
    if version == -1:  # a branch on the value is what makes Dynamo guard on it
        raise ValueError("version -1 is reserved")

    def more(i: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        return (i < steps) & ~done.all()

    def step(
        i: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor, done: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        # A fresh view per step: the loop body may not set attributes of the cache object itself.
        step_logits = model(ids, cache=cache.view(), attention_mask=valid)[:, -1]
        nxt = torch.where(done, 0, step_logits.argmax(dim=-1))
        emitted_valid = ~done  # the emitted token is real unless its row had finished before it
        at = i.view(1)
        tokens.index_copy_(1, at, nxt[:, None])
        valids.index_copy_(1, at, emitted_valid[:, None])
        if logits is not None:
            logits.index_copy_(1, at, step_logits[:, None])
        return i + 1, nxt[:, None], emitted_valid[:, None], done | (nxt == eos)

    start = torch.zeros((), dtype=torch.long, device=ids.device)
    # torch's while_loop higher-order op has no type annotations
    ran, _, _, done = torch._higher_order_ops.while_loop(  # type: ignore[no-untyped-call]
        more, step, (start, ids, valid, done)
    )
    return ran, done


# Bumped whenever any module anywhere gets a new submodule: the cached module lists below are then stale.
_module_epoch = [0]


def _bump_epoch(module: torch.nn.Module, name: str, submodule: torch.nn.Module | None) -> None:
    _module_epoch[0] += 1  # returns None: the hook must not replace the submodule


torch.nn.modules.module.register_module_module_registration_hook(_bump_epoch)
_module_lists: weakref.WeakKeyDictionary[torch.nn.Module, tuple[int, list[torch.nn.Module]]] = (
    weakref.WeakKeyDictionary()
)


def _modules_of(model: torch.nn.Module) -> list[torch.nn.Module]:
    """``list(model.modules())``, cached until a submodule is registered anywhere (walking it costs ~40 µs)."""
    cached = _module_lists.get(model)
    if cached is None or cached[0] != _module_epoch[0]:
        cached = _module_lists[model] = (_module_epoch[0], list(model.modules()))
    return cached[1]


def weights_version(model: torch.nn.Module) -> int:
    """A number that changes whenever a parameter or buffer is replaced or modified in place."""
    # Read from each module's own dicts every time: a replaced parameter or buffer shows without any hook.
    tensors = (t for m in _modules_of(model) for d in (m._parameters, m._buffers) for t in d.values() if t is not None)
    return hash(tuple((id(t), t.data_ptr(), t._version) for t in tensors)) & (2**62 - 1)


def fingerprint(model: torch.nn.Module) -> Fingerprint:
    """What a compiled graph of ``model`` depends on besides input shapes, cheap enough to check per generation.

    Dynamo's own guards check all of it and more, but evaluating them costs ~1.5 ms per call; they
    run on the first call in each new fingerprint (see :meth:`CompiledGPTRunner._call`).
    """
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in _modules_of(model))
    hooks += len(torch.nn.modules.module._global_forward_hooks) + len(torch.nn.modules.module._global_forward_pre_hooks)
    cfg = getattr(model, "cfg", None)
    modes = (model.training, torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_num_threads())
    return (weights_version(model), hooks, id(cfg), cfg, *modes)


def version_of(fp: Fingerprint) -> int:
    """The fingerprint as the int the compiled loop is guarded on (Dynamo itself does not guard on hooks)."""
    return hash(fp) & (2**62 - 1)


# Per model, the situations (loop length, batch size, capacity, fingerprint) its graphs have run in.
_warm: weakref.WeakKeyDictionary[torch.nn.Module, set[tuple[Hashable, ...]]] = weakref.WeakKeyDictionary()


_compiled: dict[str, Any] = {}
_compile_error: str | None = None  # set once per process when compilation fails: not retried every call


_FUNCTIONS: dict[str, Callable[..., Any]] = {"loop": _decode_loop, "stepwise": _decode_step, "prefill": _prefill}


def compiled_fn(kind: str) -> Any:
    """The process-wide compiled ``kind`` ("loop", "stepwise" or "prefill"), compiled lazily, cached by torch."""
    if kind not in _compiled:
        # dynamic=False: only the dimensions the runner marks (batch, prompt length) become symbols.
        _compiled[kind] = torch.compile(_FUNCTIONS[kind], fullgraph=True, dynamic=False)
    return _compiled[kind]


def static_capacity(max_len: int, max_positions: int | None) -> int:
    """Cache capacity for a generation of ``max_len`` tokens, rounded up so that lengths share a graph.

    The capacity is part of the compiled graph's shape: sized to each prompt + new tokens, every new
    length would recompile. So it is the model's context length when it has one (learned positions),
    else the next power of two (at least 64); the extra slots are masked and cost little.
    """
    if max_positions is not None and max_len <= max_positions:
        return max_positions
    return max(64, 1 << (max_len - 1).bit_length())


def compile_error() -> str | None:
    """Why compilation failed in this process (None if it worked or was not tried yet)."""
    return _compile_error


@dataclass
class GreedyChunk:
    """What one compiled call of greedy decode steps returns (see :func:`_decode_loop`)."""

    tokens: torch.Tensor  # (B, steps run) long
    valid: torch.Tensor  # (B, steps run) bool: False for the padding a finished row emits
    done: torch.Tensor  # (B,) bool, rows finished after the call
    logits: torch.Tensor | None  # (B, steps run, V) raw logits of every step, when asked for


@dataclass
class _Outputs:
    """Capacity-shaped buffers one generation's compiled calls write into (see :func:`_decode_loop`)."""

    tokens: torch.Tensor  # (B, capacity) long
    valids: torch.Tensor  # (B, capacity) bool
    logits: torch.Tensor | None  # (B, capacity, V), when logits were asked for


class CompiledGPTRunner:
    """The reference GPT behind the generation ``Runner`` protocol, decode steps compiled (see module doc)."""

    pad_id = 0  # what _decode_loop emits for finished rows

    def __init__(self, model: GPT):
        if not isinstance(model, GPT):
            raise TypeError(f"compiled decoding is for genprobe GPT models, got {type(model).__name__}")
        self.model = model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.vocab_size = model.cfg.vocab_size
        self.max_positions = model.cfg.block_size if model.cfg.pos_encoding == "learned" else None
        # Per state (one generation): the model's fingerprint at its first compiled call, output buffers.
        self._fingerprints: weakref.WeakKeyDictionary[StaticKVCache, Fingerprint] = weakref.WeakKeyDictionary()
        self._outputs: weakref.WeakKeyDictionary[StaticKVCache, _Outputs] = weakref.WeakKeyDictionary()

    def new_state(self, batch_size: int, max_len: int) -> StaticKVCache:
        """A fresh static cache of capacity :func:`static_capacity` (one compiled graph serves many lengths)."""
        cap = static_capacity(max_len, self.max_positions)
        return StaticKVCache.for_model(self.model.cfg, batch_size, max_len=cap, dtype=self.dtype, device=self.device)

    def step(self, ids: torch.Tensor, valid: torch.Tensor | None, state: StaticKVCache) -> torch.Tensor:
        """Prefill (T > 1) compiled, a one-token step through the compiled loop: logits (B, T, V)."""
        if _compile_error is not None:
            return self._eager_step(ids, valid, state)
        if ids.shape[1] > 1:
            # Measured (time to first token, 7-token prompts): a compiled prefill pays off for a large model
            # over a few hundred rows (57.8M parameters: 23 -> 10 ms at batch 1, 82 -> 48 ms at 16, but
            # 285 -> 329 ms at 64); for the 427k model its call costs more than it saves at every batch size
            # (0.37 -> 0.51 ms at 1, 1.3 -> 1.6 ms at 16).
            if self.model.num_parameters() >= STEPWISE_MIN_WORK and ids.numel() <= COMPILED_PREFILL_MAX_ROWS:
                logits = self._prefill(ids, valid, state)
                if logits is not None:
                    return logits
            return self._eager_step(ids, valid, state)
        # The compiled graph skips the host-side range checks of GPT.forward; the same limits, checked here.
        self.model.check_ids(ids)
        chunk = self.decode_greedy(ids, valid, torch.zeros(ids.shape[0], dtype=torch.bool), state, 1, None, True)
        if chunk is None:  # compilation failed just now: redo eagerly
            return self._eager_step(ids, valid, state)
        assert chunk.logits is not None  # asked for with_logits=True
        return chunk.logits

    def _prefill(self, ids: torch.Tensor, valid: torch.Tensor | None, state: StaticKVCache) -> torch.Tensor | None:
        """The compiled :func:`_prefill` (None when compilation is unavailable), after the checks its graph skips."""
        self.model.check_ids(ids)
        self._check_room(state, ids.shape[1])
        logits: torch.Tensor | None = self._call("prefill", state, ids, valid, ())
        return logits

    def _eager_step(self, ids: torch.Tensor, valid: torch.Tensor | None, state: StaticKVCache) -> torch.Tensor:
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
        eos = torch.full((1,), -1 if eos_id is None else eos_id, dtype=torch.long, device=ids.device)
        out = self._outputs.get(state)
        if out is None or (with_logits and out.logits is None):  # one set per generation, capacity-shaped
            V, cap = self.vocab_size, state.capacity
            out = self._outputs[state] = _Outputs(
                tokens=torch.zeros((B, cap), dtype=torch.long, device=ids.device),
                valids=torch.zeros((B, cap), dtype=torch.bool, device=ids.device),
                logits=torch.zeros((B, cap, V), dtype=self.dtype, device=ids.device) if with_logits else None,
            )
        logits = out.logits if with_logits else None
        if decode_strategy(self.model, B) == "stepwise":
            res = self._decode_stepwise(ids, valid, done, eos, state, steps, out.tokens, out.valids, logits)
        else:
            n = torch.full((), steps, dtype=torch.long)
            res = self._call("loop", state, ids, valid, (done.clone(), eos, n, out.tokens, out.valids, logits))
        if res is None:
            return None
        ran, done = int(res[0]), res[1]
        return GreedyChunk(
            out.tokens[:, :ran].clone(),
            out.valids[:, :ran].clone(),
            done,
            logits[:, :ran].clone() if logits is not None else None,
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
        ran = 0
        replay = None  # after the first call, later steps replay its graph without _call's bookkeeping
        while ran < steps and not bool(done.all()):
            res = None
            if replay is not None:
                try:
                    with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                        res = replay(self.model, version_of(self._fingerprints[state]), state, ids, valid, done, eos)
                except RuntimeError as exc:
                    if "skip_guard_eval_unsafe" not in str(exc):
                        raise
            if res is None:  # the first step, or a replay Dynamo refused: guards (and compilation) as usual
                res = self._call("stepwise", state, ids, valid, (done.clone(), eos))
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
        fp = self._fingerprints.get(state)
        if fp is None:  # once per generation: a weight edit, a hook or a mode switch between generations shows
            fp = self._fingerprints[state] = fingerprint(self.model)
        shape = ids.shape[0] if kind != "prefill" else (ids.shape[0], valid is None)
        situation = (kind, shape, state.capacity, kind == "loop" and rest[-1] is None, fp)
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
            lines = str(exc).strip().splitlines()
            _compile_error = f"{type(exc).__name__}: {lines[0] if lines else ''}"
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
        else:
            config = stepwise_config()
        if kind == "stepwise":  # the batch size as a symbol: what makes Inductor pack weights for oneDNN
            for t in (ids, valid, rest[0], state.pos, state.valid, state.next_pos, *state.k, *state.v):
                torch._dynamo.mark_dynamic(t, 0)
        if kind == "prefill":  # the prompt length as a symbol: one graph for every length
            for t in (ids, valid):
                if t is not None:
                    torch._dynamo.mark_dynamic(t, 1)
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
