"""Compiled decoding ahead of time: the one forward exported, compiled by AOTInductor, driven by a C++ loop.

For small decode steps (the shapes :func:`genprobe.engine.fast.compiled.decode_strategy` runs as a loop) the cost of
a greedy generation is not arithmetic but what surrounds it: entering a compiled graph from Python, and the
wrapper work of a ``torch.while_loop`` iteration. Here the forward is exported with ``torch.export`` over a
:class:`~genprobe.engine.fast.static_cache.StaticKVCache` whose tensors are graph inputs, as three programs:

- a **step** program: one token per row, then the greedy argmax, the padding of finished rows and the
  end-token bookkeeping (what one iteration of ``compiled._decode_loop`` does);
- a **prompt** program: the same with ``T >= 2`` tokens per row (``T`` symbolic) and the logits of the last
  position only (``logits_to_keep=1``): what starts a generation. The head is skipped for every other row;
- a **chunk** program: ``T >= 2`` tokens per row with the logits of every position, for multi-token chunks
  (verify-cache, chunked prefill). Built on first use: a generation never needs it.

AOTInductor compiles each into a library (their matrix products on :mod:`genprobe.engine.fast.kernels`), and
``GreedyDecoder`` (C++, in the same library as the kernels) runs a whole generation in one call: the
prompt program, then one step per token. The weights are bound as user-managed constants, so the compiled
programs read the model's own parameters: an in-place edit is seen by the next call with nothing recompiled,
and a replaced parameter is re-bound before the next generation (see :meth:`AOTDecoder.bind`).

Compiled programs are cached on disk (``kernels.build.cache_dir()/aot``) under a hash of everything they depend
on but the weights: the model's configuration, batch size and cache capacity, the torch version and the
source of the forward, the cache and the kernels.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import itertools
import os
import threading
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch

from ..._io import fault_point, temp_beside
from ...model.position_lm import PositionDrivenLM as GPT  # our GPT or the Llama family (model.llama_family)
from . import kernels
from .static_cache import StaticKVCache

_HERE = Path(__file__).resolve().parent  # genprobe/engine/fast
_PACKAGE = _HERE.parent.parent  # genprobe
# What a compiled program depends on besides the model's configuration and shapes.
_SOURCES = (
    _PACKAGE / "model" / "gpt.py",
    _PACKAGE / "model" / "llama_family.py",
    _PACKAGE / "model" / "position_lm.py",
    _PACKAGE / "model" / "weight_only.py",
    _PACKAGE / "model" / "gguf_blocks.py",
    _HERE.parent / "cache.py",
    _HERE / "static_cache.py",
    Path(__file__).resolve(),
    *kernels.build.SOURCES,
    kernels.build.SHIM_SOURCE,  # the call's C signature
    _HERE / "kernels" / "inductor_pass.py",
)


class StepProgram(torch.nn.Module):
    """A greedy step of ``model`` over a static cache given as tensors: the step program (T = 1) and the prompt
    program (T >= 2, the first token of a generation) are this module exported for those shapes."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model

    def forward(
        self, ids: torch.Tensor, valid: torch.Tensor, done: torch.Tensor, eos: torch.Tensor, *cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(next token (B, 1), its validity (B, 1), done (B,), raw logits (B, V)); finished rows emit padding (0)."""
        cached = StaticKVCache.from_tensors(cache)
        logits = self.model(ids, cache=cached, attention_mask=valid, logits_to_keep=1)[:, -1]
        nxt = torch.where(done, 0, logits.argmax(dim=-1))
        return nxt[:, None], (~done)[:, None], done | (nxt == eos), logits


class ChunkProgram(torch.nn.Module):
    """``T >= 2`` new tokens per row through ``model`` into a static cache given as tensors: logits (B, T, V)."""

    def __init__(self, model: GPT):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, valid: torch.Tensor, *cache: torch.Tensor) -> torch.Tensor:
        """Logits of every new position; ``valid`` (B, T) marks real tokens (left padding is invalid)."""
        logits: torch.Tensor = self.model(ids, cache=StaticKVCache.from_tensors(cache), attention_mask=valid)
        return logits


#: The programs of one (model, batch size, capacity), see the module doc.
KINDS = ("step", "prompt", "chunk")


def cache_key(model: GPT, batch: int, capacity: int, threads: int) -> str:
    """Hash of everything the compiled programs depend on except the weights' values."""
    h = hashlib.sha256()
    # dtypes and shapes: weight-only layers included (an int8 layer's scales are per row or per block of 32)
    dtypes = tuple((name, p.dtype, tuple(p.shape)) for name, p in model.named_parameters())
    for part in (repr(model.cfg), batch, capacity, threads, dtypes, torch.__version__):
        h.update(repr(part).encode())
    for src in _SOURCES:
        h.update(src.read_bytes())
    return h.hexdigest()[:24]


def _example_cache(model: GPT, batch: int, capacity: int) -> StaticKVCache:
    p = next(model.parameters())
    return StaticKVCache.for_model(model.cfg, batch, max_len=capacity, dtype=p.dtype, device=p.device)


def _inductor_config(model: GPT, rows: int | None, threads: int) -> dict[str, Any]:
    # Weights stay out of the library: they are bound at load time to the model's own tensors. One compile thread:
    # no worker pool, which a build finishing in a background thread at interpreter exit could not start (measured:
    # no slower, the C++ of a program is one file).
    cfg: dict[str, Any] = {"cpp.threads": threads, "aot_inductor.package_constants_in_so": False, "compile_threads": 1}
    cfg.update(kernels.BUILD_CONFIG)
    if rows is None or rows <= kernels.KERNEL_MAX_ROWS:
        cfg.update(kernels.inductor_config(rows))
    return cfg


def _compile(program: torch.nn.Module, args: tuple[Any, ...], dynamic: Any, cfg: dict[str, Any], path: Path) -> None:
    """Export ``program`` and compile it with AOTInductor into the package ``path`` (written atomically)."""
    with torch.no_grad():
        ep = torch.export.export(program, args, dynamic_shapes=dynamic, strict=False)
    tmp = temp_beside(path, suffix=".pt2")  # AOTInductor wants a .pt2 name
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*(torch\.jit\.script_method|TypedStorage)`? is deprecated")
            warnings.filterwarnings(
                "ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
            )
            torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp), inductor_configs=cfg)
        fault_point("aot:compiled")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def program_path(model: GPT, batch: int, capacity: int, threads: int, kind: str) -> Path:
    """Where the package of the ``kind`` program (one of :data:`KINDS`) for this shape is cached."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return kernels.build.cache_dir().parent / "aot" / f"{cache_key(model, batch, capacity, threads)}-{kind}.pt2"


def build_program(model: GPT, batch: int, capacity: int, threads: int, kind: str) -> Path:
    """The package of the ``kind`` program (one of :data:`KINDS`) for ``batch`` rows and ``capacity`` cache slots,
    compiled unless cached."""
    path = program_path(model, batch, capacity, threads, kind)
    # Once per key, also across processes (a program takes 10-30 s of a core to compile).
    kernels.build.build_once(path, lambda: _build_program(model, batch, capacity, threads, kind, path))
    return path


def build_in_background(model: GPT, batch: int, capacity: int, threads: int) -> Future[None]:
    """Build the kernels and this shape's step and prompt programs in a thread of their own; the future ends when
    both are on disk (or with the reason they cannot be).

    The thread exports a copy of the model's module tree that shares its parameter and buffer tensors: exporting
    swaps the traced module's parameters for fake ones while it traces, which the caller's eager forwards of the
    model itself, running meanwhile, must never see. The programs read weights bound at load time by name, and the
    copy's names, shapes and dtypes are the model's, so they are the model's programs (same :func:`cache_key`).
    """
    # Modules that register interpreter-exit hooks cannot be imported once exit has begun, when a build may still
    # run (compiled.py waits for it then): Inductor imports these two lazily, so they are imported now.
    importlib.import_module("concurrent.futures.thread")
    importlib.import_module("concurrent.futures.process")
    tensors = itertools.chain(model.parameters(), model.buffers())
    skeleton = copy.deepcopy(model, memo={id(t): t for t in tensors})
    future: Future[None] = Future()

    def build() -> None:
        try:
            status = kernels.load()
            if not status.available:
                raise RuntimeError(f"genprobe's kernels are unavailable: {status.reason}")
            for kind in ("step", "prompt"):
                build_program(skeleton, batch, capacity, threads, kind)
        except BaseException as exc:  # reported through the future, to the call that next asks for this shape
            future.set_exception(exc)
        else:
            future.set_result(None)

    # A daemon thread: a process that ends first is not held; the half-written build's files are removed by the
    # next one (write_once), which starts over.
    threading.Thread(target=build, name=f"genprobe-aot-b{batch}-c{capacity}", daemon=True).start()
    return future


def _build_program(model: GPT, batch: int, capacity: int, threads: int, kind: str, path: Path) -> None:
    """Export and compile the ``kind`` program into ``path`` (see :func:`build_program`)."""
    cache = tuple(_example_cache(model, batch, capacity).tensors())
    done = torch.zeros(batch, dtype=torch.bool)
    eos = torch.full((1,), -1, dtype=torch.long)
    if kind == "step":
        ids = torch.zeros((batch, 1), dtype=torch.long)
        args = (ids, torch.ones_like(ids, dtype=torch.bool), done, eos, *cache)
        _compile(StepProgram(model), args, None, _inductor_config(model, batch, threads), path)
        return
    tokens = torch.export.Dim("tokens", min=2, max=capacity)
    ids = torch.zeros((batch, min(capacity, 8)), dtype=torch.long)
    valid = torch.ones_like(ids, dtype=torch.bool)
    # The products of a multi-token program on the kernels too, whatever the number of rows. Measured on the 57.8M
    # model at batch 1 (AMD EPYC, 2 threads): 7 tokens 17.6 ms vs 29.6 ms on Inductor's GEMMs, 150 tokens 101 vs
    # 117 ms; with weight-only bfloat16 weights Inductor would also widen every weight to a float32 copy first.
    cfg = _inductor_config(model, None, threads)
    if kind == "prompt":
        dynamic: tuple[Any, ...] = ({1: tokens}, {1: tokens}, None, None, (None,) * len(cache))
        _compile(StepProgram(model), (ids, valid, done, eos, *cache), dynamic, cfg, path)
    else:
        dynamic = ({1: tokens}, {1: tokens}, (None,) * len(cache))  # the cache: the *args of forward
        _compile(ChunkProgram(model), (ids, valid, *cache), dynamic, cfg, path)


class AOTDecoder:
    """The compiled programs of one (model, batch size, capacity), bound to the model's weights."""

    def __init__(self, model: GPT, batch: int, capacity: int, threads: int):
        self.model, self.batch, self.capacity, self.threads = model, batch, capacity, threads
        step_path, prompt_path = (build_program(model, batch, capacity, threads, k) for k in ("step", "prompt"))
        # A program compiled single-threaded keeps its products on the calling thread as well.
        self.decoder = torch.classes.genprobe.GreedyDecoder(str(step_path), str(prompt_path), threads == 1)
        self._names = list(self.decoder.constant_names())
        self._bound: int | None = None

    def with_chunk(self) -> Any:
        """The decoder, with the chunk program (logits of every position) loaded: built and bound on first use."""
        if not self.decoder.has_chunk():
            path = build_program(self.model, self.batch, self.capacity, self.threads, "chunk")
            self.decoder.load_chunk(str(path))  # bound to the weights the other programs read
        return self.decoder

    def _weights(self) -> dict[str, torch.Tensor]:
        named: dict[str, torch.Tensor] = dict(self.model.named_parameters(prefix="model", remove_duplicate=False))
        named.update(self.model.named_buffers(prefix="model", remove_duplicate=False))
        missing = [n for n in self._names if n not in named]
        if missing:
            raise RuntimeError(f"compiled program reads weights the model does not have: {missing[:3]}")
        return {n: named[n].detach() for n in self._names}

    def bind(self, version: int) -> None:
        """Point the programs at the model's current weight tensors (again only after one changed or was replaced).

        ``version`` is :func:`~genprobe.engine.fast.compiled.weights_version` of the model (once per generation).
        The binding shares storage: an in-place edit alone needs no new binding, but re-binding then is harmless,
        and the version cannot tell the two apart.
        """
        if version != self._bound:
            self.decoder.bind_weights(self._weights())
            self._bound = version
