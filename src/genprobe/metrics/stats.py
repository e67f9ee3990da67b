"""Small statistics helpers for rates measured over prompt sets."""

from __future__ import annotations

import math


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (default 95%); ``(0.0, 1.0)`` when n == 0."""
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)  # exact ends, no 0.9999999 rounding
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return (lo, hi)


ALPHA = 0.05
#: the fewest paired prompts on which a change can be significant: 6 that all change the same way give a two-sided
#: sign-test p of 2 · 0.5⁶ = 0.031 < 0.05 (5 give 0.0625)
MIN_PAIRS = 6


def sign_test_p(up: int, down: int) -> float:
    """Two-sided exact sign test (McNemar's exact test) of ``up`` vs ``down`` discordant pairs (1.0 with none)."""
    if up < 0 or down < 0:
        raise ValueError(f"need counts >= 0, got {up}, {down}")
    n = up + down
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(up, down) + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)
