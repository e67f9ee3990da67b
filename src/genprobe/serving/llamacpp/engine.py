"""llama.cpp as an engine: a GGUF file's logits at every position, greedy generation, KV-cache operations.

:class:`LlamaCppModel` drives llama.cpp's own context through ``llama-cpp-python``'s low-level API (``llama_batch`` +
``llama_decode``; ``include/llama.h``), so every call says exactly what llama.cpp computed: which tokens at which
positions in which sequence, which rows' logits were asked for. Each public call starts from a fresh KV cache unless
it says otherwise; every comparison runs on token ids. Only an F32 file with an F32 KV cache is float32 arithmetic
throughout: the KV cache stores K/V in ``kv_type`` and a product with a quantized weight quantizes the activations to
the weight type's ``vec_dot_type`` (docs/llamacpp.md).

The one place that imports the bindings (:func:`require_llama_cpp`, called by every entry point): they ship as source
only, and ``scripts/install_llamacpp.sh`` builds them with explicit instruction-set flags (a default build crashed in
its quantized kernels on the test machines).
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Self, Sequence

import numpy as np
import torch

from ...engine.backend import Backend, Capabilities, Position, Request, Response, stop_text

#: The version genprobe is tested against (its low-level API changes between releases: e.g. the argument order
#: of ``llama_sampler_init_penalties``).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
INSTALL_HINT = "bash scripts/install_llamacpp.sh (builds llama-cpp-python from source, ~2 min on 2 cores)"


class LlamaCppNotAvailableError(ImportError):
    """llama-cpp-python is not installed (or cannot be imported) in this environment."""


def llama_cpp_problem() -> str | None:
    """Why ``llama_cpp`` cannot be used here, or None when it can (for test skips and doctor output)."""
    try:
        import llama_cpp
    except ImportError as exc:
        return f"llama.cpp's Python bindings are not installed ({exc}); {INSTALL_HINT}"
    except OSError as exc:  # the shared library failed to load (built for another CPU, missing libgomp, ...)
        return f"llama-cpp-python is installed but its library cannot be loaded: {exc}; rebuild: {INSTALL_HINT}"
    version = getattr(llama_cpp, "__version__", "?")
    if version != LLAMA_CPP_PYTHON_VERSION:
        return f"llama-cpp-python {version} is installed; genprobe needs {LLAMA_CPP_PYTHON_VERSION}: {INSTALL_HINT}"
    return None


def require_llama_cpp() -> ModuleType:
    """Import and return ``llama_cpp``, or raise :class:`LlamaCppNotAvailableError` saying how to install it."""
    problem = llama_cpp_problem()
    if problem is not None:
        raise LlamaCppNotAvailableError(problem)
    import llama_cpp

    return llama_cpp


def llama_cpp_facts() -> dict[str, str]:
    """The bindings' version and llama.cpp's build (``llama_print_system_info``: the instruction sets it uses)."""
    lib = require_llama_cpp()
    info = lib.llama_print_system_info().decode("utf-8", errors="replace").strip()
    return {"llama_cpp_python": getattr(lib, "__version__", LLAMA_CPP_PYTHON_VERSION), "system_info": info}


class Closeable:
    """Owns llama.cpp objects that :meth:`close` frees (idempotently); as a context manager, closed on exit."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: KV-cache element types a context can be created with (ggml type ids of ``ggml.h``).
KV_TYPES = {"f32": 0, "f16": 1}
DEFAULT_N_CTX = 512
CTX_PAD = 256  # llama.cpp rounds a context's n_ctx up to a multiple of 256 (src/llama-context.cpp, llama_context())
GGUF_MAGIC = b"GGUF"

# (logits row, tokens so far: prompt + generated) -> next token id
NextToken = Callable[[np.ndarray, list[int]], int]
Stop = Callable[[list[int]], bool]  # the tokens generated so far -> the sequence ends here
Entry = tuple[int, int, int, bool]  # one token of a llama_decode call: (token, position, seq_id, logits wanted)


class LlamaCppDecodeError(RuntimeError):
    """``llama_decode`` refused a batch (no room in the KV cache, a batch over n_batch, ...)."""


class LlamaCppModel(Closeable):
    """One GGUF file in llama.cpp: ``logits(ids)`` at every position, ``greedy``, ``generate`` and the KV-cache
    primitives the verification phases drive (``decode``, ``remove``, ``shift``).

    ``n_ctx`` is rounded up to a multiple of 256, as llama.cpp does, and is also llama.cpp's logical and physical
    batch (``n_batch``, ``n_ubatch``): a prompt up to that length is prefilled by one ``llama_decode`` call in one
    graph. ``kv_type`` is the KV cache's element type (``"f16"``, llama.cpp's default, or ``"f32"``). ``n_threads``
    is llama.cpp's thread count for both prompt and generation (default 1: the test machines are shared)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int = 1,
        seed: int = 0,
        kv_type: str = "f16",
    ):
        self.path = Path(path)
        if n_ctx < 8 or n_threads < 1:
            raise ValueError(f"n_ctx must be >= 8 and n_threads >= 1, got n_ctx={n_ctx}, n_threads={n_threads}")
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(KV_TYPES)}, got {kv_type!r}")
        n_ctx = -(-n_ctx // CTX_PAD) * CTX_PAD  # what llama.cpp would make of it anyway: every size below agrees
        if not self.path.is_file():
            raise FileNotFoundError(f"no such GGUF file: {self.path}")
        with self.path.open("rb") as fh:
            if fh.read(4) != GGUF_MAGIC:
                raise ValueError(f"{self.path} is not a GGUF file (it does not start with the bytes 'GGUF')")
        self._lib = require_llama_cpp()
        self.llama = self._lib.Llama(
            model_path=str(self.path),
            n_ctx=n_ctx,
            n_batch=n_ctx,
            n_ubatch=n_ctx,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            seed=seed,
            logits_all=True,  # Llama.generate's prefix reuse keeps every row it computed (verify's prompt-cache phase)
            type_k=KV_TYPES[kv_type],
            type_v=KV_TYPES[kv_type],
            flash_attn=False,
            verbose=False,
        )
        # how the context was created (what describe() reports)
        self.n_ctx, self.n_batch = int(self.llama.n_ctx()), n_ctx
        self.n_threads, self.kv_type, self.seed = n_threads, kv_type, seed
        self.vocab_size = int(self.llama.n_vocab())
        eos = int(self.llama.token_eos())
        self.eos_id: int | None = eos if 0 <= eos < self.vocab_size else None
        bos = int(self.llama.token_bos())
        self.bos_id: int | None = bos if 0 <= bos < self.vocab_size else None
        self._batch = self._lib.llama_batch_init(n_ctx, 0, 1)

    # ---- tokenizer (llama.cpp's, from the GGUF metadata) ----------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        """llama.cpp's token ids of ``text`` (BOS first when ``add_bos`` and the file's tokenizer adds one)."""
        return [int(t) for t in self.llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False)]

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (invalid UTF-8 byte sequences replaced)."""
        return self.llama.detokenize([int(t) for t in ids]).decode("utf-8", errors="replace")

    # ---- KV-cache primitives -----------------------------------------------------------------------------------
    def _memory(self) -> Any:
        mem = self._lib.llama_get_memory(self.llama.ctx)
        if mem is None:
            raise RuntimeError(f"{self.path.name}: this llama.cpp context has no KV cache (an embedding-only model?)")
        return mem

    def reset(self) -> None:
        """Empty the KV cache (every sequence, data buffers too) and forget the Llama object's cached prompt."""
        self._lib.llama_memory_clear(self._memory(), True)
        self.llama.n_tokens = 0

    def decode(self, tokens: Sequence[int], start: int, *, logits: str = "all") -> np.ndarray:
        """Append ``tokens`` at positions ``start, start + 1, ...`` in ONE ``llama_decode`` call and return their
        logits rows, float32 ``(rows, vocab)``: every row (``logits="all"``) or the last one (``"last"``). Longer
        than ``n_batch`` is refused, not split."""
        ids = [int(t) for t in tokens]
        self._check_ids(ids)
        if len(ids) > self.n_batch:
            raise ValueError(f"{len(ids)} tokens in one decode call exceed n_batch={self.n_batch}")
        if start < 0:
            raise ValueError(f"positions start at 0, got {start}")
        want = [logits == "all" or (logits == "last" and i == len(ids) - 1) for i in range(len(ids))]
        return self._step([(t, start + i, 0, w) for i, (t, w) in enumerate(zip(ids, want, strict=True))])

    def _step(self, entries: list[Entry]) -> np.ndarray:
        return _decode(self._lib, self.llama.ctx, self._batch, entries, self.vocab_size)

    def remove(self, p0: int, p1: int, seq_id: int = 0) -> None:
        """Drop the cached positions ``[p0, p1)`` of ``seq_id`` (``llama_memory_seq_rm``)."""
        if not self._lib.llama_memory_seq_rm(self._memory(), seq_id, p0, p1):
            raise RuntimeError(f"llama.cpp could not remove positions [{p0}, {p1}) of sequence {seq_id}")

    def shift(self, p0: int, p1: int, delta: int, seq_id: int = 0) -> None:
        """Move the cached positions ``[p0, p1)`` of ``seq_id`` by ``delta`` (``llama_memory_seq_add``: llama.cpp
        re-rotates the cached keys by the RoPE of ``delta`` before the next decode, ``llama_kv_cache::update``)."""
        if not self._lib.llama_memory_can_shift(self._memory()):
            raise RuntimeError(f"{self.path.name}: llama.cpp cannot shift this model's KV cache")
        self._lib.llama_memory_seq_add(self._memory(), seq_id, p0, p1, delta)

    def _check_ids(self, ids: Sequence[int]) -> None:
        if not ids:
            raise ValueError("no tokens to decode")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")

    # ---- whole computations (each from a fresh KV cache) ------------------------------------------------------
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """float32 logits ``(len(ids), vocab)`` at every position: a fresh cache, the whole sequence prefilled in
        one ``llama_decode`` call (``len(ids) <= n_batch``); row t predicts token t + 1."""
        self.reset()
        return self.decode(ids, 0, logits="all")

    def extend(
        self,
        history: Sequence[int],
        rows: np.ndarray | Sequence[np.ndarray],
        max_new_tokens: int,
        next_token: NextToken,
        stop: Stop | None = None,
    ) -> Generation:
        """Continue the sequence the KV cache holds (``history``; ``rows``: its logits rows kept so far, the last one
        predicting the next token): :func:`decode_loop` in this context, one ``llama_decode`` call per token."""
        return decode_loop(self._step, [list(history)], [list(rows)], [max_new_tokens], [next_token], [stop])[0]

    def generate(
        self, prompt_ids: Sequence[int], max_new_tokens: int, next_token: NextToken, stop_ids: Sequence[int] = ()
    ) -> list[int]:
        """Prefill ``prompt_ids`` (fresh cache), then ``next_token(logits_row, prompt + generated)`` picks each of
        at most ``max_new_tokens`` tokens, decoded one per call; stops after a token in ``stop_ids``."""
        if len(prompt_ids) + max_new_tokens > self.n_ctx:
            raise ValueError(
                f"context overflow: prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                f"n_ctx {self.n_ctx}"
            )
        self.reset()
        first = self.decode(prompt_ids, 0, logits="last")
        return self.extend(prompt_ids, first, max_new_tokens, next_token, lambda out: out[-1] in stop_ids).tokens

    def greedy(
        self, prompt_ids: Sequence[int], max_new_tokens: int, stop_at_eos: bool = True, ban_ids: Sequence[int] = ()
    ) -> list[int]:
        """Greedy generation: the argmax of each row (lowest id among ties, as ``torch.argmax``/``np.argmax``),
        ``ban_ids`` never chosen; stops after EOS when ``stop_at_eos``."""
        stops = (self.eos_id,) if stop_at_eos and self.eos_id is not None else ()
        return self.generate(prompt_ids, max_new_tokens, greedy_picker(ban_ids), stops)

    def cached_prompt_logits(self, prompt_ids: Sequence[int]) -> tuple[np.ndarray, int]:
        """The prompt's logits rows through the ``Llama`` object's own prompt cache, and how many prompt tokens it
        served from that cache instead of evaluating them.

        ``Llama.generate`` (llama-cpp-python ``llama.py``) keeps the previous call's tokens in the KV cache, finds
        the longest common prefix with the new prompt, drops the rest (``kv_cache_seq_rm``) and evaluates only the
        remainder; with ``logits_all`` the reused rows are the earlier call's. The state is NOT reset first: call it
        twice to reuse. The count is measured, not trusted: the tokens ``Llama.eval`` was actually given."""
        prompt = [int(t) for t in prompt_ids]
        self._check_ids(prompt)
        if len(prompt) > self.n_ctx:
            raise ValueError(f"a prompt of {len(prompt)} tokens does not fit the context of {self.n_ctx}")
        evaluated: list[int] = []
        original_eval = self.llama.eval

        def recording_eval(tokens: Sequence[int]) -> None:
            evaluated.extend(int(t) for t in tokens)
            original_eval(tokens)

        self.llama.eval = recording_eval
        try:
            gen = self.llama.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True)
            next(gen)  # evaluates the uncached part of the prompt and samples one token (not evaluated)
            gen.close()
        finally:
            del self.llama.eval  # the class's method again
        return np.array(self.llama.scores[: len(prompt)], dtype=np.float32), len(prompt) - len(evaluated)

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        next_token: NextToken | Sequence[NextToken],
        *,
        keep_logits: bool = False,
        stop: Stop | Sequence[Stop | None] | None = None,
    ) -> list[Generation]:
        """Several sequences in one llama.cpp context, one ``seq_id`` each: every prompt prefilled in ONE
        ``llama_decode`` call, then each step decodes one token of every running sequence in one call (what a server's
        batch does). ``max_new_tokens``, ``next_token`` (a sampler with per-sequence state) and ``stop``: one for all,
        or one per sequence; without a stop, exactly ``max_new_tokens`` each. ``keep_logits``: every row, prompt
        positions included; else only the rows that picked a token. The context is a second one on the same weights,
        sized to the batch, with one KV cache shared by every sequence (``kv_unified``); freed on return."""
        seqs, lib = [[int(t) for t in p] for p in prompts], self._lib
        given: tuple[Any, ...] = (max_new_tokens, next_token, stop)  # each one per sequence, or one for all
        budgets, pickers, stops = (list(x) if isinstance(x, Sequence) else [x] * len(seqs) for x in given)
        if min(budgets, default=0) < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {min(budgets, default=0)}")
        if not seqs or any(not p for p in seqs):
            raise ValueError("give at least one prompt, each with at least one token")
        if len(seqs) > (limit := int(lib.llama_max_parallel_sequences())):
            raise ValueError(f"{len(seqs)} sequences exceed llama.cpp's limit of {limit} per context")
        for p in seqs:
            self._check_ids(p)
        params = lib.llama_context_default_params()
        params.n_ctx = (tokens := sum(len(p) for p in seqs)) + sum(budgets)
        params.n_batch = params.n_ubatch = max(tokens, len(seqs))
        params.n_seq_max, params.kv_unified, params.no_perf = len(seqs), True, True
        params.type_k = params.type_v = KV_TYPES[self.kv_type]
        params.n_threads = params.n_threads_batch = self.n_threads
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        # llama-cpp-python's log forwarding silenced: a context sized to the batch exceeds the model's training
        # context by design, and llama.cpp warns about it on stderr
        log = logging.getLogger("llama-cpp-python")
        level = log.level
        log.setLevel(logging.CRITICAL + 1)
        try:
            ctx = lib.llama_init_from_model(self.llama.model, params)
        finally:
            log.setLevel(level)
        if ctx is None:
            raise RuntimeError(f"llama.cpp could not create a context for {len(seqs)} sequences")
        batch = lib.llama_batch_init(params.n_batch, 0, 1)
        try:
            decode = partial(_decode, lib, ctx, batch, vocab=self.vocab_size)
            entries = [(t, i, s, keep_logits or i == len(p) - 1) for s, p in enumerate(seqs) for i, t in enumerate(p)]
            rows, at, first = decode(entries), 0, []
            for p in seqs:
                n = len(p) if keep_logits else 1
                first.append(list(rows[at : at + n]))
                at += n
            return decode_loop(decode, seqs, first, budgets, pickers, stops)
        finally:
            lib.llama_batch_free(batch)
            lib.llama_free(ctx)

    # ---- facts ------------------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """The file, its tensor types, llama.cpp's version and build, and how the context was created."""
        from ...model.gguf import inspect_gguf

        try:
            types: dict[str, int] | str = inspect_gguf(self.path).type_counts
        except Exception as exc:  # the gguf reader is an optional extra of its own
            types = f"unknown ({exc})"
        return {
            "engine": "llama.cpp",
            "file": str(self.path),
            "size_bytes": self.path.stat().st_size,
            "tensor_types": types,
            **llama_cpp_facts(),
            "vocab_size": self.vocab_size,
            **{k: getattr(self, k) for k in ("n_ctx", "n_batch", "n_threads", "kv_type", "seed")},
        }

    def close(self) -> None:
        """Free the batch, the context and the model (idempotent)."""
        if self._batch is not None:
            self._lib.llama_batch_free(self._batch)
            self.llama.close()
            self._batch = None


def _decode(lib: Any, ctx: Any, batch: Any, entries: Sequence[Entry], vocab: int) -> np.ndarray:
    """ONE ``llama_decode`` call of ``(token, position, seq_id, logits wanted)`` entries through ``batch``; the wanted
    rows, float32 ``(rows, vocab)``."""
    batch.n_tokens = len(entries)
    for i, (tok, pos, seq, want) in enumerate(entries):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, want
        batch.seq_id[i][0] = seq
    rc = lib.llama_decode(ctx, batch)
    if rc != 0:
        raise LlamaCppDecodeError(f"llama_decode returned {rc} for {len(entries)} tokens from position {entries[0][1]}")
    rows = sum(w for *_, w in entries)
    if rows == 0:
        return np.zeros((0, vocab), np.float32)
    logits = ctypes.cast(lib.llama_get_logits(ctx), ctypes.POINTER(ctypes.c_float))
    return np.ctypeslib.as_array(logits, shape=(rows * vocab,)).reshape(rows, vocab).copy()


@dataclass
class Generation:
    """One generated sequence: its prompt, the tokens generated, its logits rows (the rows it started with, then one
    per generated token but the last) and why it ended ("stop" or "length")."""

    prompt: list[int]
    tokens: list[int]
    logits: np.ndarray
    finish_reason: str = "length"


def decode_loop(
    decode: Callable[[list[Entry]], np.ndarray],
    histories: list[list[int]],
    rows: list[list[np.ndarray]],
    budgets: Sequence[int],
    pickers: Sequence[NextToken],
    stops: Sequence[Stop | None],
) -> list[Generation]:
    """The decode loop, written once for one sequence and for a batch: each running sequence s picks its next token
    from its last row (``pickers[s](row, history)``), then the new tokens of every running sequence are decoded in ONE
    call (sequence s at its next position). A sequence ends after ``budgets[s]`` tokens or once ``stops[s]`` says so
    of its generated tokens; the token that ends it is not decoded."""
    prompts = [list(h) for h in histories]
    reasons = ["length"] * len(histories)
    live = [s for s, n in enumerate(budgets) if n > 0]
    while live:
        entries: list[Entry] = []
        for s in live:
            h, stop = histories[s], stops[s]
            h.append(int(pickers[s](rows[s][-1], h)))
            if stop is not None and stop(h[len(prompts[s]) :]):
                reasons[s] = "stop"
            elif len(h) - len(prompts[s]) < budgets[s]:
                entries.append((h[-1], len(h) - 1, s, True))
        for (*_, s, _), row in zip(entries, decode(entries) if entries else [], strict=True):
            rows[s].append(row)
        live = [e[2] for e in entries]
    return [
        Generation(p, h[len(p) :], np.stack(r), why)
        for p, h, r, why in zip(prompts, histories, rows, reasons, strict=True)
    ]


def greedy_picker(ban_ids: Sequence[int] = ()) -> NextToken:
    """``next_token`` of greedy decoding: argmax over the ids not banned (ties: the lowest id)."""
    banned = np.array(sorted({int(b) for b in ban_ids}), dtype=np.int64)

    def pick(row: np.ndarray, history: list[int]) -> int:
        if banned.size:
            row = row.copy()
            row[banned[banned < row.shape[0]]] = -np.inf
        return int(np.argmax(row))

    return pick


class LlamaCppBackend(Backend):
    """A :class:`LlamaCppModel` as a :class:`~genprobe.engine.backend.Backend`: token-id prompts, greedy, every
    position's whole distribution (``Response.rows``), the ``Llama`` object's prompt cache (one prompt deep, token by
    token; a request that does not read it starts from an empty KV cache), the requests of one call as sequences of
    one context (:meth:`LlamaCppModel.generate_batch`). ``own_prefill`` is the floor of a quantized file: llama.cpp's
    one-call prefill of the same tokens."""

    def __init__(self, model: LlamaCppModel, label: str = "", exact: bool | None = None):
        self.model = model
        self.model_name = model.path.name
        self._prefill: dict[tuple[int, ...], Any] = {}
        self.capabilities = Capabilities(
            server="llama.cpp",
            max_top_k=model.vocab_size,
            prompt_logprobs=True,
            concurrency=int(model._lib.llama_max_parallel_sequences()),
            cache_bypass=True,
            exact=exact,
            label=label,
        )

    def own_prefill(self, ids: Sequence[int]) -> Any:
        """llama.cpp's log-probabilities of ``ids`` from one fresh ``llama_decode`` call (memoised)."""
        key = tuple(int(t) for t in ids)
        if key not in self._prefill:
            self._prefill[key] = torch.from_numpy(log_softmax64(self.model.logits(key)))
        return self._prefill[key]

    def complete(self, request: Request) -> Response:
        """The prompt (through the prompt cache when ``read_cache``), then one ``llama_decode`` call per greedy token
        until ``max_tokens``, EOS or a stop string."""
        m, prompt = self.model, _greedy_prompt(request)
        if request.read_cache:
            first, cached = m.cached_prompt_logits(prompt)
        else:
            first, cached = m.logits(prompt), None
        g = m.extend(prompt, first, request.max_tokens, greedy_picker(request.sampler.ban_ids), self._stop(request))
        return self.response(g, request.stop, cached)

    def complete_many(self, requests: Sequence[Request], concurrency: int) -> list[Response]:
        """The requests as sequences of one context (:meth:`LlamaCppModel.generate_batch`: each to its own
        ``max_tokens``, bans and stops, every prompt row kept), or one after another when ``concurrency`` < 2."""
        if concurrency < 2:
            return [self.complete(r) for r in requests]
        prompts = [_greedy_prompt(r) for r in requests]
        pickers = [greedy_picker(r.sampler.ban_ids) for r in requests]
        budgets, stops = [r.max_tokens for r in requests], [self._stop(r) for r in requests]
        runs = self.model.generate_batch(prompts, budgets, pickers, keep_logits=True, stop=stops)
        return [self.response(g, r.stop) for r, g in zip(requests, runs, strict=True)]

    def _stop(self, request: Request) -> Stop:
        """EOS, or a stop string in the text so far."""
        m = self.model
        return lambda out: out[-1] == m.eos_id or any(st in m.detokenize(out) for st in request.stop)

    def response(self, g: Generation, stops: Sequence[str] = (), cached: int | None = None, at: int = 0) -> Response:
        """``g`` as a response whose ``logits`` rows start at row ``at`` of prompt + tokens (text cut at ``stops``)."""
        rows, first = torch.from_numpy(log_softmax64(g.logits)), len(g.prompt) - 1 - at
        positions = [
            Position(t, float(rows[first + s, t])) for s, t in enumerate(g.tokens) if 0 <= first + s < len(rows)
        ]
        text = stop_text(self.model.detokenize(g.tokens), stops)
        return Response(g.prompt, g.tokens, positions, g.finish_reason, text, None, cached, rows=rows, rows_from=at)

    def reset_cache(self) -> bool:
        """An empty KV cache and prompt cache."""
        self.model.reset()
        return True


def _greedy_prompt(request: Request) -> list[int]:
    if not request.sampler.greedy or isinstance(request.prompt, str):
        raise ValueError("the llama.cpp backend runs greedy requests on token ids")
    return [int(t) for t in request.prompt]


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (``-inf`` logits stay ``-inf``; a row needs one finite logit)."""
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - np.max(x, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
