"""Compiled decoding: the model's one forward, captured once by ``torch.compile`` (gpt-fast's recipe).

At batch 1 a decode step of a small model is ~40 tiny kernels whose cost is almost all framework
overhead (dispatch, allocation, Python), not arithmetic. ``torch.compile`` removes most of it: it
traces :meth:`GPT.forward` for a single-token step over a :class:`StaticKVCache` into one graph,
fuses the element-wise work into a few C++ kernels and calls the matrix products directly. The
traced code is the same forward every other phase runs — there is no second implementation of the
model to keep in sync — and prefill (any length, left padding) stays eager: it runs once per
generation.

What makes the replay cheap, each measured with ``benchmarks/generate_speed.py``:

- a static cache (one base tensor per layer, written with ``index_put_``), so every step has the same
  shapes, the graph is compiled once per batch size, and the write is a scatter, not a copy;
- ``freezing`` + ``max_autotune``: weights become constants, so GEMMs use prepacked kernels chosen
  for the exact shape. A frozen graph holds a copy of the weights, so the call also carries
  :func:`weights_version` and an in-place weight edit recompiles instead of replaying stale weights;
- ``cpp_wrapper``: the graph is driven from C++ rather than a Python wrapper;
- single-threaded kernels up to ``SINGLE_THREAD_MAX_BATCH`` rows (a fork/join costs more than it saves);
- guard evaluation only on the *first* step of a generation (where a new model, weights, batch size
  or capacity recompiles); the remaining steps replay with new tensor values, which guards never read.

``torch.compile`` needs a C++ compiler on CPU. Without one (or if compilation fails for another
reason) the runner warns once, naming the error, and runs the same forward eagerly.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Any

import torch

from ..model.gpt import GPT
from .static_cache import StaticKVCache


# Read by Inductor when a graph is compiled, so they are switched on only around first steps (a patch
# around every replay would cost more than the guards it sits beside).
RECOMPILE_LIMIT = 64
COMPILE_CONFIG = {"cpp_wrapper": True, "freezing": True, "max_autotune": True, "coordinate_descent_tuning": True}
SINGLE_THREAD_MAX_BATCH = 4


def compile_config(batch_size: int) -> dict:
    """Inductor settings for a decode graph of ``batch_size`` rows.

    Up to ``SINGLE_THREAD_MAX_BATCH`` rows a step's kernels are too small to split: an OpenMP region
    costs more than it saves (measured: 193 µs vs 277 µs per step at batch 1 on 2 cores), so the
    generated kernels are compiled single-threaded; larger batches keep every thread.
    """
    threads = 1 if batch_size <= SINGLE_THREAD_MAX_BATCH else -1
    return {**COMPILE_CONFIG, "cpp.threads": threads}


def _decode_one_token(
    model: GPT, ids: torch.Tensor, valid: torch.Tensor | None, cache: StaticKVCache, weights_version: int
) -> torch.Tensor:
    """One cached forward of one new token per row; logits (B, V). This is what gets compiled.

    ``weights_version`` is unused by the maths; it is there to be guarded on: the frozen graph holds a
    copy of the weights, so weights edited in place (a loop patch, ``load_state_dict``) must recompile.
    """
    if weights_version == -1:  # a branch on the value is what makes Dynamo guard on it
        raise ValueError("weights_version -1 is reserved")
    return model(ids, cache=cache, attention_mask=valid)[:, -1]


def weights_version(model: torch.nn.Module) -> int:
    """A number that changes whenever a parameter or buffer is replaced or modified in place."""
    return hash(tuple((id(t), t.data_ptr(), t._version) for t in (*model.parameters(), *model.buffers()))) & (2**62 - 1)


_compiled_decode: Any = None
_compile_error: str | None = None  # set once per process when compilation fails: not retried every call


def compiled_decode_fn() -> Any:
    """The process-wide compiled decode step (compiled lazily, cached by torch per model and shape)."""
    global _compiled_decode
    if _compiled_decode is None:
        _compiled_decode = torch.compile(_decode_one_token, fullgraph=True, dynamic=False)
    return _compiled_decode


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


class CompiledGPTRunner:
    """The reference GPT behind the generation ``Runner`` protocol, decode steps compiled (see module doc)."""

    pad_id = 0

    def __init__(self, model: GPT):
        if not isinstance(model, GPT):
            raise TypeError(f"compiled decoding is for genprobe GPT models, got {type(model).__name__}")
        self.model = model
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.vocab_size = model.cfg.vocab_size
        self.max_positions = model.cfg.block_size if model.cfg.pos_encoding == "learned" else None
        self._warm: weakref.WeakSet[StaticKVCache] = weakref.WeakSet()  # states past their first step
        self._version = 0

    def new_state(self, batch_size: int, max_len: int) -> StaticKVCache:
        """A fresh static cache of capacity :func:`static_capacity` (one compiled graph serves many lengths)."""
        cap = static_capacity(max_len, self.max_positions)
        return StaticKVCache.for_model(self.model.cfg, batch_size, max_len=cap, dtype=self.dtype, device=self.device)

    def step(self, ids: torch.Tensor, valid: torch.Tensor | None, state: StaticKVCache) -> torch.Tensor:
        """Prefill (T > 1) eagerly; a one-token step through the compiled graph. Logits (B, T, V)."""
        global _compile_error
        if ids.shape[1] != 1 or _compile_error is not None:
            return self.model(ids, cache=state, attention_mask=valid)
        # The compiled graph skips the host-side range checks of GPT.forward; the same limits, checked here.
        held = state.length
        if held + 1 > state.capacity:
            raise ValueError(f"KV cache overflow: {held} cached + 1 new token > capacity {state.capacity}")
        if self.max_positions is not None and held + 1 > self.max_positions:
            raise ValueError(f"context overflow: the model's context length (block_size) is {self.max_positions}")
        self.model.check_ids(ids)
        # Inputs with their own contiguous strides: a column sliced from a (B, P+N) buffer has stride P+N,
        # which Dynamo guards on, so every new prompt length would otherwise recompile.
        ids = ids.clone(memory_format=torch.contiguous_format)
        if valid is not None:
            valid = valid.clone(memory_format=torch.contiguous_format)
        first = state not in self._warm
        # The first step of a generation evaluates every guard (new model, batch size, capacity or weights
        # recompile) under COMPILE_CONFIG; the rest of the generation replays with only new tensor values.
        if first:
            stance = contextlib.ExitStack()
            stance.enter_context(torch._inductor.config.patch(compile_config(ids.shape[0])))
            # One graph per (model, weights, batch size, capacity): allow more than Dynamo's default 8.
            stance.enter_context(torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT))
            # Compiling imports and calls torch internals that emit deprecation notices about torch's own
            # code (torch.jit.script_method, TypedStorage); they say nothing to our users.
            stance.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message=r".*(torch\.jit\.script_method|TypedStorage) is deprecated")
            self._version = weights_version(self.model)
        else:
            stance = torch.compiler.set_stance(skip_guard_eval_unsafe=True)
        try:
            with stance:
                logits = compiled_decode_fn()(self.model, ids, valid, state, self._version)
        except torch._dynamo.exc.TorchDynamoException as exc:  # no C++ compiler, unsupported op, ...
            if not first:
                raise
            lines = str(exc).strip().splitlines()
            _compile_error = f"{type(exc).__name__}: {lines[0] if lines else ''}"
            warnings.warn(f"torch.compile failed, decoding eagerly instead ({_compile_error})", RuntimeWarning, stacklevel=2)
            # Dynamo applies a graph's mutations only when it runs, so the cache is untouched: redo eagerly.
            return self.model(ids, cache=state, attention_mask=valid)
        self._warm.add(state)
        return logits[:, None, :]

    def full(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Uncached forward of the whole sequence (eager)."""
        return self.model(ids, attention_mask=valid)
