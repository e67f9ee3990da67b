"""genprobe's :class:`~genprobe.engine.samplers.stages.SamplerConfig` as llama.cpp's sampler chain: exact or refused.

The *real* chain of ``common_sampler_init`` (docs/llamacpp.md: its order) built from a config through the C API of
llama-cpp-python 0.3.36, so genprobe's ``engine="llama.cpp"`` replay can be held against it and the scan backend can
sample with llama.cpp itself. Each stage's ``llama_cpp`` method (:mod:`genprobe.engine.samplers.stages`) gives its
sampler and arguments or refuses by name. DRY's breakers are *strings* there, tokenized with the file's vocabulary
(:class:`LlamaVocab`). The draw is a ``std::mt19937``: same distribution as genprobe's torch generator, different
samples.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

import numpy as np

from ...engine.samplers.llama_cpp import breakers_from_strings
from ...engine.samplers.stages import (
    BANS,
    DRY,
    ORDERS,
    STAGES,
    ChainEnv,
    ChainStage,
    SamplerConfig,
    Truncation,
    UnsupportedSamplerError,
    refuse_for,
)
from .engine import Closeable, require_llama_cpp

#: The seed of ``llama_sampler_init_dist`` / ``_xtc`` when none is given (any fixed value: runs must repeat).
DEFAULT_SEED = 1234
_TOKEN_DTYPE = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # struct llama_token_data


@dataclass(frozen=True)
class KeptCandidates:
    """What llama.cpp's chain left in its candidate array for one row, in the array's order.

    ``ids`` / ``logits`` (after every stage, temperature included) hold the candidates whose logit is not
    ``-inf`` (top-n-σ and the bans leave ``-inf`` entries in the array, with p = 0); ``probs`` is the sampling
    distribution over them as ``llama_sampler_dist_apply`` computes it (``expf(logit − max)`` in float32, summed
    in double, each divided by the sum).
    """

    ids: np.ndarray
    logits: np.ndarray
    probs: np.ndarray
    sorted: bool

    def as_dict(self) -> dict[int, float]:
        """``{id: probability}``."""
        return {int(i): float(p) for i, p in zip(self.ids, self.probs, strict=True)}


def chain_stages(
    cfg: SamplerConfig,
    *,
    context_length: int,
    dry_breaker_strings: Sequence[str] = (),
    seed: int = DEFAULT_SEED,
    final: str | None = "dist",
) -> tuple[ChainStage, ...]:
    """The chain llama.cpp runs for ``cfg`` (refused with the setting's name where it has none).

    ``context_length`` stands for genprobe's ``-1`` windows (llama.cpp has no "whole history"); ``final`` is the
    selecting sampler: ``"dist"`` (``greedy`` for a greedy config), or None for the candidates only. genprobe's
    greedy is ``llama_sampler_init_greedy`` after the adjustments (the argmax of the adjusted logits); llama.cpp's
    own ``--temp 0`` is not: it keeps the truncations, then the first maximum, so typical-p and XTC can move it.
    """
    # A truncation that is off is still added with its "off" value, as common does; greedy adds none of them.
    chain = [s for s in STAGES if not isinstance(s, Truncation)] + ([] if cfg.greedy else list(ORDERS[cfg.order]))
    env = ChainEnv(context_length, seed, tuple(dry_breaker_strings))
    out = [x for s in chain if (x := s.llama_cpp(cfg, env)) is not None]
    refuse_for(cfg, "llama.cpp", "llama.cpp")
    if final is not None:
        out.append(ChainStage("greedy", ()) if cfg.greedy else ChainStage("dist", (seed,)))
    return tuple(out)


# ---- the vocabulary DRY needs ------------------------------------------------------------------------------
_QUIET_LOG: Any = None  # llama.cpp's log lines routed to nowhere; the ctypes callback must outlive every call


class LlamaVocab(Closeable):
    """A GGUF file's vocabulary only (``vocab_only=True``: no weights): what ``llama_sampler_init_dry`` needs.

    Use as a context manager (``llama_model_free`` on exit). :meth:`dry_breakers` expands breaker strings into
    the token sequences llama.cpp will use (``get_overlapping_token_sequences``, on bytes as there).
    """

    def __init__(self, gguf_path: str | Path):
        global _QUIET_LOG
        self.lc = require_llama_cpp()
        if _QUIET_LOG is None:  # model loading prints dozens of lines
            _QUIET_LOG = self.lc.llama_log_callback(lambda level, text, user_data: None)
            self.lc.llama_log_set(_QUIET_LOG, ctypes.c_void_p(0))
        self.lc.llama_backend_init()
        params = self.lc.llama_model_default_params()
        params.vocab_only = True
        path = Path(gguf_path)
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {path}")
        self._model = self.lc.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise ValueError(f"llama.cpp could not read the vocabulary of {path}")
        self.vocab = self.lc.llama_model_get_vocab(self._model)
        self.n_tokens = int(self.lc.llama_vocab_n_tokens(self.vocab))
        self._breakers: dict[tuple[str, ...], tuple[tuple[int, ...], ...]] = {}

    def tokenize(self, text: bytes) -> list[int]:
        """``vocab.tokenize(text, add_special=false, parse_special=false)``."""
        cap = len(text) + 8
        out = (self.lc.llama_token * cap)()
        n = self.lc.llama_tokenize(self.vocab, text, len(text), out, cap, False, False)
        return [int(t) for t in out[:n]]

    def dry_breakers(self, strings: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """The ``(head, *tail)`` sequences llama.cpp derives from breaker strings with this vocabulary (cached)."""
        key = tuple(strings)
        if key not in self._breakers:
            as_bytes = [s.encode() for s in key]  # llama.cpp matches bytes
            self._breakers[key] = breakers_from_strings(as_bytes, self.n_tokens, self._texts.__getitem__, self.tokenize)
        return self._breakers[key]

    @cached_property
    def _texts(self) -> list[bytes]:
        """Each token's ``vocab.detokenize({token}, special=true)``: the text DRY matches breakers against."""
        out = []
        for token in range(self.n_tokens):
            ids, buf = (self.lc.llama_token * 1)(token), ctypes.create_string_buffer(256)
            n = self.lc.llama_detokenize(self.vocab, ids, 1, buf, 256, False, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self.lc.llama_detokenize(self.vocab, ids, 1, buf, -n, False, True)
            out.append(buf.raw[:n])
        return out

    def close(self) -> None:
        """Free the model (idempotent)."""
        if self._model:
            self.lc.llama_model_free(self._model)
            self._model = None


# ---- the chain as C objects --------------------------------------------------------------------------------
def build_chain(lc: ModuleType, stages: Sequence[ChainStage], vocab: LlamaVocab | None, n_vocab: int) -> Any:
    """A ``llama_sampler`` chain owning one sampler per stage (free it with ``llama_sampler_free``)."""
    params = lc.llama_sampler_chain_default_params()
    params.no_perf = True
    chain = lc.llama_sampler_chain_init(params)
    for stage in stages:
        a = stage.args
        if stage.name == "logit_bias":
            biases = (lc.llama_logit_bias * len(a[0]))(*[lc.llama_logit_bias(t, float("-inf")) for t in a[0]])
            sampler = lc.llama_sampler_init_logit_bias(n_vocab, len(a[0]), biases)  # copies the biases
        elif stage.name == "penalties":
            sampler = lc.llama_sampler_init_penalties(n_vocab, *a)
        elif stage.name == "dry":
            assert vocab is not None  # LlamaCppSampler refused it
            strings = [s.encode() for s in a[4]]
            arr = (ctypes.c_char_p * max(len(strings), 1))(*strings)
            sampler = lc.llama_sampler_init_dry(vocab.vocab, a[0], a[1], a[2], a[3], arr, len(strings))
        else:
            sampler = getattr(lc, f"llama_sampler_init_{stage.name}")(*a)
        lc.llama_sampler_chain_add(chain, sampler)  # the chain takes ownership
    return chain


class _CandidateArray:
    """A ``llama_token_data_array`` over a buffer this object owns (alive as long as the object is)."""

    def __init__(self, lc: ModuleType, logits: np.ndarray):
        row = np.ascontiguousarray(logits, dtype=np.float32).reshape(-1)
        self.buf = (lc.llama_token_data * len(row))()
        view = np.frombuffer(self.buf, dtype=_TOKEN_DTYPE)
        view["id"], view["logit"], view["p"] = np.arange(len(row), dtype=np.int32), row, 0.0
        self.base = ctypes.addressof(self.buf)
        data = ctypes.cast(self.buf, lc.llama_token_data_p)
        self.cur = lc.llama_token_data_array(data, len(row), -1, False)

    def rows(self) -> np.ndarray:
        """The candidates now in the array (samplers may move ``data`` forward: XTC does) — a copy."""
        start = (ctypes.cast(self.cur.data, ctypes.c_void_p).value or self.base) - self.base
        view = np.frombuffer(self.buf, dtype=_TOKEN_DTYPE)
        first = start // _TOKEN_DTYPE.itemsize
        return view[first : first + int(self.cur.size)].copy()


def _history(history: Sequence[int] | np.ndarray | None) -> list[int]:
    if history is None:
        return []
    return [int(t) for t in np.asarray(history).reshape(-1) if int(t) >= 0]  # < 0 is genprobe's padding


def chain_candidates(
    logits: np.ndarray | Sequence[float],
    history: Sequence[int] | np.ndarray | None,
    cfg: SamplerConfig,
    *,
    vocab: LlamaVocab | None = None,
    dry_breaker_strings: Sequence[str] = (),
    context_length: int | None = None,
    seed: int = DEFAULT_SEED,
) -> KeptCandidates:
    """Run llama.cpp's chain for ``cfg`` (without the final draw) on one row of logits after ``history``.

    Each history token is accepted first (``llama_sampler_accept``: penalties and DRY keep their own window of
    them); ``context_length`` (default: the history's length, at least 1) stands for genprobe's ``-1`` windows.
    """
    row = np.asarray(logits, dtype=np.float32).reshape(-1)
    hist = _history(history)
    ctx = context_length if context_length is not None else max(len(hist), 1)
    with LlamaCppSampler(
        cfg,
        n_vocab=len(row),
        context_length=ctx,
        vocab=vocab,
        dry_breaker_strings=dry_breaker_strings,
        seed=seed,
        final=None,
    ) as chain:
        chain.accept_all(hist)
        arr = chain.apply(row)
    is_sorted = bool(arr.cur.sorted)
    dist = chain.lc.llama_sampler_init_dist(seed)
    try:
        chain.lc.llama_sampler_apply(dist, ctypes.byref(arr.cur))  # only for its probabilities: p = expf(...) / sum
    finally:
        chain.lc.llama_sampler_free(dist)
    kept = arr.rows()
    live = kept["logit"] != -np.inf
    return KeptCandidates(kept["id"][live], kept["logit"][live], kept["p"][live], is_sorted)


class LlamaCppSampler(Closeable):
    """llama.cpp's sampler chain for one sequence: :meth:`accept` each token, :meth:`sample` the next one.

    ``with LlamaCppSampler(cfg, n_vocab=V, context_length=C) as s: s.accept_all(prompt); t = s.sample(row)``.
    The chain (and the samplers it owns) is freed on :meth:`close`. :meth:`sample` does not accept the token
    it returns: call :meth:`accept` with what the sequence really continues with, as ``common_sampler_accept``.
    """

    def __init__(
        self,
        cfg: SamplerConfig,
        *,
        n_vocab: int,
        context_length: int,
        vocab: LlamaVocab | None = None,
        dry_breaker_strings: Sequence[str] = (),
        seed: int = DEFAULT_SEED,
        final: str | None = "dist",
    ):
        self.lc = require_llama_cpp()
        self.stages = chain_stages(
            cfg, context_length=context_length, dry_breaker_strings=dry_breaker_strings, seed=seed, final=final
        )
        if DRY.active(cfg) and vocab is None:
            raise UnsupportedSamplerError(
                "DRY (dry_multiplier > 0) needs a vocabulary in llama.cpp (llama_sampler_init_dry): pass vocab="
                "LlamaVocab(<a .gguf file>)"
            )
        if DRY.active(cfg) and vocab is not None:
            strings = dry_breaker_strings
            theirs, ours = set(vocab.dry_breakers(strings)) if strings else set(), set(cfg.dry_sequence_breakers)
            if theirs != ours:
                raise UnsupportedSamplerError(
                    f"dry_sequence_breakers: llama.cpp takes breakers as strings; dry_breaker_strings={list(strings)!r}"
                    f" expand to {len(theirs)} token sequences with this vocabulary, the config holds {len(ours)} "
                    f"(e.g. only ours: {sorted(ours - theirs)[:3]}, only theirs: {sorted(theirs - ours)[:3]}); build "
                    "the config's breakers with LlamaVocab.dry_breakers(strings)"
                )
        BANS.check_vocab(cfg, n_vocab, UnsupportedSamplerError)  # llama.cpp's logit_bias would skip them silently
        self.n_vocab = n_vocab
        self._chain = build_chain(self.lc, self.stages, vocab, n_vocab)
        self._seen = 0  # history tokens :meth:`pick` has accepted

    def accept(self, token: int) -> None:
        """Tell the chain the sequence continues with ``token`` (penalty and DRY windows, RNG-free)."""
        self._require_open()
        self.lc.llama_sampler_accept(self._chain, int(token))

    def accept_all(self, tokens: Sequence[int] | np.ndarray) -> None:
        """:meth:`accept` each token (a prompt); entries < 0 (padding) are skipped."""
        for t in _history(tokens):
            self.accept(t)

    def apply(self, logits: np.ndarray | Sequence[float]) -> _CandidateArray:
        """The candidate array the chain leaves for one row of ``n_vocab`` logits."""
        self._require_open()
        row = np.asarray(logits, dtype=np.float32).reshape(-1)
        if len(row) != self.n_vocab:
            raise ValueError(f"a row of {len(row)} logits; this sampler was built for a vocabulary of {self.n_vocab}")
        arr = _CandidateArray(self.lc, row)
        self.lc.llama_sampler_apply(self._chain, ctypes.byref(arr.cur))
        return arr

    def sample(self, logits: np.ndarray | Sequence[float]) -> int:
        """One token from a row of ``n_vocab`` logits: the whole chain, its draw (or argmax) included."""
        cur = self.apply(logits).cur
        if cur.selected < 0:
            raise ValueError("llama.cpp's chain selected no token (empty candidate array)")
        return int(cur.data[int(cur.selected)].id)  # ``data`` as the chain left it (XTC moves it)

    def pick(self, row: np.ndarray, history: list[int]) -> int:
        """``next_token`` of one sequence: :meth:`accept` each token of ``history`` not seen yet (the prompt on the
        first call, then each generated token), then :meth:`sample` the row."""
        for t in history[self._seen :]:
            self.accept(t)
        self._seen = len(history)
        return self.sample(row)

    def reset(self) -> None:
        """Forget the accepted tokens and reseed (``llama_sampler_reset``): a new sequence."""
        self._require_open()
        self.lc.llama_sampler_reset(self._chain)
        self._seen = 0

    def _require_open(self) -> None:
        if self._chain is None:
            raise ValueError("this LlamaCppSampler is closed")

    def close(self) -> None:
        """Free the chain (idempotent)."""
        if self._chain is not None:
            self.lc.llama_sampler_free(self._chain)
            self._chain = None

    def __del__(self) -> None:  # a forgotten close() must not leak the C chain
        try:
            self.close()
        except Exception:
            pass
