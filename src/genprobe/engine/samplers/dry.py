"""DRY ("don't repeat yourself") as llama.cpp implements it (src/llama-sampling.cpp, llama_sampler_dry_apply).

For the last ``last_n`` tokens (prompt included; -1 = the whole context) a candidate that would
extend a suffix of the context already seen earlier — a repeat of length ``L >= allowed_length``
— loses ``multiplier · base^(L − allowed_length)`` from its logit, the exponent capped at
``int(88.7228391 / ln(base))`` so the power stays below FLT_MAX. Repeats are measured from the
end of the context but never reach back past the most recent *sequence breaker*: breakers cut
matches (a context ending "…\\n abc" can only repeat "abc"). A candidate that is itself a
single-token breaker is never penalised.

Breakers are token-id sequences ``(head, *tail)``; :func:`breakers_from_strings` turns strings
into them the way llama.cpp's ``get_overlapping_token_sequences`` does: every token whose text
contains the string is a one-token breaker; a token whose text *ends with a prefix* of the
string is a head whose tail is the tokenisation of the rest (at most 20 tokens; strings are cut
to 40 characters).
"""

from __future__ import annotations

import math
from typing import Any, AnyStr, Callable, Iterable, Sequence

import numpy as np

from .cmath import logf

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


def _rep_limit(window: list[int], breakers: Breakers) -> int:
    """Tokens after the most recent complete breaker (all of them if none): the longest repeat allowed."""
    N = len(window)
    for i in range(N):  # i tokens from the end
        tails = breakers.get(window[N - 1 - i])
        if not tails:
            continue
        longest = -1
        for tail in tails:  # the tail follows the head in time order
            L = len(tail)
            if longest < L <= i and all(tail[o] == window[N - i + o] for o in range(L)):
                longest = L
        if longest >= 0:
            return i - longest
    return N


def _suffix_matches(window: list[int]) -> list[int]:
    """z[k] = length of the longest common suffix of ``window`` and ``window[:-k]`` (Z-algorithm, reversed)."""
    rev = window[::-1]
    N = len(rev)
    z = [0] * N
    lt = rt = 0
    for k in range(1, N):
        n = min(rt - k + 1, z[k - lt]) if k <= rt else 0
        while k + n < N and rev[n] == rev[k + n]:
            n += 1
        z[k] = n
        if k + n - 1 > rt:
            lt, rt = k, k + n - 1
    return z


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
    rep_limit = _rep_limit(window, breakers)
    if rep_limit < allowed_length:
        return {}
    z = _suffix_matches(window)
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
    text = getattr(tokenizer, "token_str", None) or (lambda i: tokenizer.decode([i]))

    def encode(s: str) -> list[int]:
        try:
            return list(tokenizer.encode(s, warn=False))
        except TypeError:  # tokenizers without a warn flag
            return list(tokenizer.encode(s))

    return breakers_from_strings(strings, tokenizer.vocab_size, text, encode)
