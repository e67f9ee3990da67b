"""llama.cpp's sampler arithmetic replayed in float32 (src/llama-sampling.cpp): C's ``expf``/``logf``, the
candidate array (``llama_token_data_array``) and DRY's matching.

**expf / logf.** llama.cpp's samplers call the C library's scalar ``expf`` / ``logf``; numpy's float32 SIMD versions
differ by one ulp often enough to move an exactly-hit threshold (measured in docs/llamacpp.md). :func:`expf` takes
the float64 exponential rounded to float32 and asks the C library itself for the inputs near a rounding midpoint
(glibc's ``expf`` is within 0.502 ulp); :func:`logf` asks the C library for every element (its 0.818 ulp bound leaves
no cheap shortcut; it runs on scalars and typical-p's candidates only). Without a loadable C math library (not
expected on Linux/macOS) both take the float64 route.

**Candidates.** llama.cpp does not mask logits: each sampler shrinks or reorders an array of (id, logit, p)
candidates, and softmaxes, cumulative sums and entropies are float32 loops over that array in its current order.
:class:`Candidates` replays that with numpy float32 (``np.cumsum`` is a sequential float32 sum) and each stage's
``candidates`` method (:mod:`.stages`) does its sampler's work on it, so exactly-hit thresholds fall as in
llama.cpp. Candidates whose logit is ``-inf`` (bans, no-repeat-n-gram, top-n-σ) stay in the array with p = 0.

**DRY** ("don't repeat yourself", llama_sampler_dry_apply). For the last ``last_n`` tokens (prompt included; -1 =
the whole context) a candidate that would extend a suffix of the context already seen earlier — a repeat of length
``L >= allowed_length`` — loses ``multiplier · base^(L − allowed_length)`` from its logit, the exponent capped at
``int(88.7228391 / ln(base))`` so the power stays below FLT_MAX. Repeats are measured from the end of the context
but never reach back past the most recent *sequence breaker*: breakers cut matches (a context ending "…\\n abc" can
only repeat "abc"). A candidate that is itself a single-token breaker is never penalised. Breakers are token-id
sequences ``(head, *tail)``; :func:`breakers_from_strings` turns strings into them the way llama.cpp's
``get_overlapping_token_sequences`` does: every token whose text contains the string is a one-token breaker; a
token whose text *ends with a prefix* of the string is a head whose tail is the tokenisation of the rest (at most 20
tokens; strings are cut to 40 characters).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from functools import lru_cache, partial
from typing import Any, AnyStr, Callable, Iterable, Sequence

import numpy as np

from ...corpus.tokenizer import encode_quiet

F32 = np.float32
# |fraction of an ulp| beyond which a correctly rounded value might be rounded the other way by glibc's expf
# (its error bound is 0.502 ulp: within 0.002 of the midpoint; 0.49 leaves a margin of 5×).
_NEAR_MIDPOINT = 0.49


@lru_cache(maxsize=1)
def _libm() -> Any | None:
    name = ctypes.util.find_library("m") or "libm.so.6"
    try:
        lib = ctypes.CDLL(name)
        for fn in (lib.expf, lib.logf):
            fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    except (OSError, AttributeError):
        return None
    return lib


def expf(x: np.ndarray) -> np.ndarray:
    """Elementwise C ``expf`` of a float32 array (see the module docstring)."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        wide = np.exp(x.astype(np.float64))
        y = wide.astype(F32)
        ulp = np.spacing(np.nextafter(np.abs(y), F32(0))).astype(np.float64)  # the finer side at a power of 2
        frac = np.abs(wide - y.astype(np.float64)) / np.where(ulp > 0, ulp, 1.0)
    lib = _libm()
    if lib is None:
        return y
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    for i in np.flatnonzero((frac.reshape(-1) > _NEAR_MIDPOINT) & np.isfinite(flat_x)):
        flat_y[i] = lib.expf(float(flat_x[i]))
    return y


def logf(x: np.ndarray | np.floating | float) -> np.ndarray:
    """Elementwise C ``logf`` of float32 values (0 → -inf, as in C)."""
    arr = np.asarray(x, dtype=F32)
    lib = _libm()
    if lib is None:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(arr.astype(np.float64)).astype(F32)
    out = np.empty(arr.shape, dtype=F32)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i in range(flat_in.size):
        flat_out[i] = lib.logf(float(flat_in[i]))
    return out


class Candidates:
    """llama_token_data_array: ids, logits, probabilities and whether the array is sorted by logit."""

    def __init__(self, logits: np.ndarray):
        self.ids = np.arange(len(logits))
        self.logit = logits.astype(F32)
        self.p = np.zeros_like(self.logit)
        self.sorted = False

    def take(self, order: np.ndarray) -> None:
        """Keep (and reorder to) the candidates at ``order``."""
        self.ids, self.logit, self.p = self.ids[order], self.logit[order], self.p[order]

    def sort(self) -> None:
        """Descending by logit (stable: equal logits keep their array order)."""
        if not self.sorted:
            self.take(np.argsort(-self.logit, kind="stable"))
            self.sorted = True

    def softmax(self, do_sort: bool) -> None:
        """llama_sampler_softmax_impl: exp(logit − max) summed in array order, in float32."""
        if do_sort:
            self.sort()
        with np.errstate(invalid="ignore"):
            e = expf(self.logit - self.logit.max())  # the C library's expf, not numpy's
        self.p = e / np.cumsum(e, dtype=F32)[-1]


def std_sort_equivalent(n: int) -> np.ndarray:
    """The order libstdc++'s ``std::sort`` leaves ``n`` elements in when every comparison is false (NaN keys).

    ``std::__introsort_loop``: while more than 16 (``_S_threshold``) remain, ``__move_median_to_first`` swaps the
    middle element to the front (all comparisons false take its last branch) and ``__unguarded_partition``
    swaps pairs inward from both ends (reversing the rest), then recurses on the right part and loops on the
    left; ``__final_insertion_sort`` moves nothing. Up to 16 elements the order stays. (libc++ / MSVC differ.)
    """
    a = list(range(n))

    def loop(lo: int, hi: int) -> None:
        while hi - lo > 16:
            mid = lo + (hi - lo) // 2
            a[lo], a[mid] = a[mid], a[lo]
            first, last = lo + 1, hi
            while True:
                last -= 1
                if not first < last:
                    break
                a[first], a[last] = a[last], a[first]
                first += 1
            loop(first, hi)
            hi = first

    loop(0, n)
    return np.array(a, dtype=np.int64)


FLOAT_MAX_LOG = np.float32(88.7228391)
MAX_BREAKER_CHARS = 40
MAX_BREAKER_TAIL = 20
#: llama.cpp's default breakers (common/common.h, dry_sequence_breakers)
DEFAULT_BREAKERS = ("\n", ":", '"', "*")

Breakers = dict[int, list[tuple[int, ...]]]


def breaker_table(sequences: Iterable[Sequence[int]]) -> Breakers:
    """``{head: [tail, ...]}`` from ``(head, *tail)`` sequences (duplicates dropped)."""
    table: Breakers = {}
    for s in sequences:
        tails = table.setdefault(int(s[0]), [])
        tail = tuple(int(t) for t in s[1:])
        if tail not in tails:
            tails.append(tail)
    return table


def dry_penalties(
    tokens: Sequence[int], multiplier: float, base: float, allowed_length: int, last_n: int, breakers: Breakers
) -> dict[int, np.float32]:
    """``{token: penalty}`` for one row's context ``tokens`` (oldest first), in llama.cpp's float32 arithmetic."""
    if multiplier == 0 or base < 1 or last_n == 0:
        return {}
    window = list(tokens[-last_n:] if last_n > 0 else tokens)
    N = len(window)
    if N <= allowed_length:
        return {}
    rep_limit = N  # tokens after the most recent complete breaker (all if none): the longest repeat allowed
    for i in range(N):  # i tokens from the end
        cut = -1  # the longest breaker ending here
        for tail in breakers.get(window[N - 1 - i], ()):  # the tail follows the head in time order
            if cut < len(tail) <= i and all(tail[o] == window[N - i + o] for o in range(len(tail))):
                cut = len(tail)
        if cut >= 0:
            rep_limit = i - cut
            break
    if rep_limit < allowed_length:
        return {}
    rev, z = window[::-1], [0] * N  # z[k]: longest common suffix of window and window[:-k] (Z-algorithm, reversed)
    lt = rt = 0
    for k in range(1, N):
        n = min(rt - k + 1, z[k - lt]) if k <= rt else 0
        while k + n < N and rev[n] == rev[k + n]:
            n += 1
        z[k] = n
        if k + n - 1 > rt:
            lt, rt = k, k + n - 1
    longest: dict[int, int] = {}
    for k in range(1, N):  # the earlier copy ends k tokens before the end; the token after it would repeat
        L = min(z[k], rep_limit)
        if L >= allowed_length:
            nxt = window[N - k]
            if longest.get(nxt, -1) < L:
                longest[nxt] = L
    base32, mult32 = np.float32(base), np.float32(multiplier)
    max_exp = int(FLOAT_MAX_LOG / logf(base32)) if base32 > np.float32(1.000001) else 0  # std::log(float)
    out: dict[int, np.float32] = {}
    for tok, L in longest.items():
        if () in breakers.get(tok, ()):
            continue  # a one-token breaker is never penalised
        e = L - allowed_length
        if max_exp > 0 and e > max_exp:
            e = max_exp
        out[tok] = np.float32(float(mult32) * math.pow(float(base32), e))  # std::pow(float, int) is double
    return out


def breakers_from_strings(
    strings: Iterable[AnyStr],
    vocab_size: int,
    token_text: Callable[[int], AnyStr],
    encode: Callable[[AnyStr], list[int]],
) -> tuple[tuple[int, ...], ...]:
    """Token sequences ``(head, *tail)`` for breaker strings (llama.cpp's get_overlapping_token_sequences), as
    ``str`` or, matched as llama.cpp matches them, ``bytes``."""
    seqs: list[tuple[int, ...]] = []
    for s in strings:
        if not s:
            raise ValueError("a DRY sequence breaker must not be empty")
        s = s[:MAX_BREAKER_CHARS]
        for tid in range(vocab_size):
            word = token_text(tid)
            if s in word:
                seqs.append((tid,))
                continue
            for pos in range(len(word)):
                rest = word[pos:]
                if rest[:1] == s[:1] and s.startswith(rest):  # the token ends with a prefix of the breaker
                    seqs.append((tid,) + tuple(encode(s[len(rest) :])[:MAX_BREAKER_TAIL]))
    return tuple((head,) + t for head, tails in breaker_table(seqs).items() for t in tails)


def tokenizer_breakers(tokenizer: Any, strings: Iterable[str] = DEFAULT_BREAKERS) -> tuple[tuple[int, ...], ...]:
    """:func:`breakers_from_strings` for a genprobe ``Tokenizer`` (``vocab_size``, ``token_str``, ``encode``).

    E.g. ``tokenizer_breakers(tok, ["，", "。"])`` for Tang poems; llama.cpp's defaults otherwise.
    """
    return breakers_from_strings(strings, tokenizer.vocab_size, tokenizer.token_str, partial(encode_quiet, tokenizer))
