"""llama.cpp's candidate array (``llama_token_data_array``), replayed in float32 (src/llama-sampling.cpp).

llama.cpp does not mask logits: each sampler shrinks or reorders an array of (id, logit, p)
candidates, and softmaxes, cumulative sums and entropies are float32 loops over that array in its
current order. :class:`Candidates` replays that with numpy float32 (``np.cumsum`` is a sequential
float32 sum) and each stage's ``candidates`` method (:mod:`.stages`) does its sampler's work on it,
so exactly-hit thresholds fall as in llama.cpp. ``expf`` / ``logf`` are the C library's
(:mod:`.cmath`): numpy's float32 ones differ by an ulp often enough to move an exactly-hit threshold.
Candidates whose logit is ``-inf`` (bans, no-repeat-n-gram, top-n-σ) stay in the array with p = 0,
as in llama.cpp.
"""

from __future__ import annotations

import numpy as np

from .cmath import expf

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
