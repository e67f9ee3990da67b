"""llama.cpp's truncation samplers, replayed on its candidate array in float32 (src/llama-sampling.cpp).

llama.cpp does not mask logits: each sampler shrinks or reorders an array of (id, logit, p)
candidates, and softmaxes, cumulative sums and entropies are float32 loops over that array in its
current order. :func:`apply_llama_cpp_stages` replays that with numpy float32 (``np.cumsum`` is a
sequential float32 sum), so exactly-hit thresholds fall as in llama.cpp:

* top-k keeps exactly ``k`` (ties past k dropped; which tied ids survive is left to
  ``std::partial_sort`` there — here the lower ids, from a stable sort);
* top-p keeps up to the first token whose running float32 sum is ``>= p``;
* min-p compares *logits*: ``logit >= max_logit + logf(p)``;
* ``expf`` / ``logf`` are the C library's (:mod:`.cmath`): numpy's float32 ones differ by an ulp often enough
  to move an exactly-hit threshold;
* typical-p, top-n-σ and XTC as in their ``*_apply`` functions; temperature divides last.

Candidates whose logit is ``-inf`` (bans, no-repeat-n-gram, top-n-σ) stay in the array with
p = 0, as in llama.cpp; that includes its typical-p quirk: ``0·log 0`` makes the entropy NaN, every
surprisal NaN, and typical-p cuts like a top-p with ``>`` over the order libstdc++'s ``std::sort`` leaves
all-equivalent elements in (:func:`std_sort_equivalent`; the probability order up to 16 candidates).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .cmath import expf, logf

F32 = np.float32


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
            e = expf(self.logit - self.logit.max())  # the C library's expf, not numpy's (see .cmath)
        self.p = e / np.cumsum(e, dtype=F32)[-1]


def top_k(c: Candidates, k: int) -> None:
    """llama_sampler_top_k_impl: exactly ``min(k, size)`` candidates."""
    if k and k > 0:
        c.sort()
        c.take(np.arange(min(k, len(c.ids))))


def top_p(c: Candidates, p: float) -> None:
    """llama_sampler_top_p_apply: stop at the first running float32 sum >= p (min_keep 0)."""
    if p >= 1.0:
        return
    c.softmax(do_sort=False)
    c.sort()
    reached = np.nonzero(np.cumsum(c.p, dtype=F32) >= F32(p))[0]
    if len(reached):
        c.take(np.arange(reached[0] + 1))


def min_p(c: Candidates, p: float) -> None:
    """llama_sampler_min_p_apply: keep logits >= max_logit + logf(p) (array order kept when unsorted)."""
    if p <= 0 or not len(c.ids):
        return
    with np.errstate(divide="ignore"):  # a denormal p rounds to 0 in float32: logf gives -inf, as in C
        min_logit = F32(c.logit.max() + logf(F32(p)))
    if c.sorted:
        below = np.nonzero(c.logit[1:] < min_logit)[0]
        c.take(np.arange(below[0] + 1 if len(below) else len(c.ids)))
    else:
        c.take(np.nonzero(c.logit >= min_logit)[0])


def typical(c: Candidates, p: float) -> None:
    """llama_sampler_typical_apply: nearest-to-entropy surprisals until the float32 mass exceeds p."""
    if p >= 1.0:
        return
    c.softmax(do_sort=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = logf(c.p)
        entropy = np.cumsum(-c.p * logp, dtype=F32)[-1]  # NaN when some p == 0, as in llama.cpp
        shifted = np.abs(-logp - entropy, dtype=F32)
    # All-NaN keys compare false both ways: std::sort permutes "equal" elements its own way (below).
    order = np.argsort(shifted, kind="stable") if not np.isnan(entropy) else std_sort_equivalent(len(c.ids))
    over = np.nonzero(np.cumsum(c.p[order], dtype=F32) > F32(p))[0]
    c.take(order[: over[0] + 1] if len(over) else order)
    c.sorted = False


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


def top_n_sigma(c: Candidates, n: float) -> None:
    """llama_sampler_top_n_sigma_apply: set logits below max − n·σ to -inf (population σ over finite logits)."""
    if n <= 0 or len(c.ids) <= 1:
        return
    finite = c.logit[c.logit != -np.inf]
    count = F32(max(len(finite), 1))
    mean = F32(np.cumsum(finite, dtype=F32)[-1] / count) if len(finite) else F32(0)
    acc = F32(0)
    for x in finite:  # acc (float) += pow(x − mean, 2) (a double)
        acc = F32(float(acc) + float(F32(x - mean)) ** 2)
    std = F32(np.sqrt(F32(acc / count)))
    c.logit = np.where(c.logit < F32(finite.max() - F32(F32(n) * std)), F32(-np.inf), c.logit).astype(F32)
    c.softmax(do_sort=True)


def xtc(c: Candidates, probability: float, threshold: float, chance: float) -> None:
    """llama_sample_xtc_apply: if chance <= probability, drop the above-threshold tokens but the last."""
    if probability <= 0 or threshold > 0.5 or len(c.ids) < 2 or chance > probability:
        return
    c.softmax(do_sort=True)
    below = np.nonzero(c.p < F32(threshold))[0]  # p is sorted: the above-threshold run ends here
    pos_last = (below[0] if len(below) else len(c.ids)) - 1
    if pos_last > 0:
        c.take(np.arange(pos_last, len(c.ids)))


def temperature(c: Candidates, t: float) -> None:
    """llama_sampler_temp_impl for τ > 0: logit /= τ in float32."""
    c.logit = (c.logit / F32(t)).astype(F32)


def apply_llama_cpp_stages(
    logits: torch.Tensor, stages: tuple[str, ...], cfg: Any, draws: torch.Tensor | None
) -> torch.Tensor:
    """Run ``stages`` row by row on candidate arrays; removed tokens come back as ``-inf``."""
    out = torch.full_like(logits, float("-inf"))
    for b, row in enumerate(logits.detach().float().cpu().numpy()):
        c = Candidates(row)
        for s in stages:
            if s == "top_k":
                top_k(c, cfg.top_k or 0)
            elif s == "top_p":
                top_p(c, cfg.top_p if cfg.top_p is not None else 1.0)
            elif s == "min_p":
                min_p(c, cfg.min_p or 0.0)
            elif s == "typical":
                typical(c, cfg.typical_p if cfg.typical_p is not None else 1.0)
            elif s == "top_n_sigma":
                top_n_sigma(c, cfg.top_n_sigma or 0.0)
            elif s == "xtc" and draws is not None:
                xtc(c, cfg.xtc_probability, cfg.xtc_threshold, float(draws[b]))
            elif s == "temp" and cfg.temperature != 1.0:
                temperature(c, cfg.temperature)
        out[b, torch.from_numpy(c.ids).to(out.device)] = torch.from_numpy(c.logit).to(out)
    return out
