"""The online loop monitor for llama.cpp users: a stopping criterion and a loop-breaking logits processor for
``llama_cpp.Llama`` (``create_completion`` / ``__call__`` / ``generate`` take both).

Both are :class:`genprobe.serving.monitor.LoopHook` adapters (any of its detectors, the exact-period one by default)
fed what llama-cpp-python passes its hooks (``llama.py``: ``f(input_ids, logits)``):

* a **logits processor** is called before each token is sampled with ``input_ids`` = every token evaluated so far
  (the prompt, then each generated token), so :class:`LlamaCppLoopBreaker` sees the whole history and bans the token
  that would continue a detected loop (``scores[t] = -inf``) at the very next step;
* a **stopping criterion** is called after a token is sampled but with ``input_ids`` *without* that newest token
  (``Llama.generate``: ``stopping_criteria(self._input_ids[:sample_idx], ...)``, the token is evaluated only on the
  next round), so :class:`LlamaCppLoopStopping` fires one token after the loop completes and the completion ends
  with the token that completed it (the sampled one after it is dropped): the output equals the unmonitored
  generation cut right after the step :func:`genprobe.serving.monitor.replay` reports (tested).

The prompt length is the length of ``input_ids`` at the first call. One instance per completion (or :meth:`reset`
between completions).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..monitor import Detection, LoopHook


def _row(input_ids: Any) -> list[list[int]]:
    return [np.asarray(input_ids).reshape(-1).tolist()]


class LlamaCppLoopStopping(LoopHook):
    """``stopping_criteria`` for ``llama_cpp.Llama``: True once the generated tokens end in a loop (see the module
    docstring for which token it sees last). ``detection`` says where, period and onset included."""

    @property
    def detection(self) -> Detection | None:
        """The :class:`~genprobe.serving.monitor.Detection`, or None while no loop was seen."""
        return self.watches[0].detection if self.watches else None

    def __call__(self, input_ids: Any, logits: Any) -> bool:
        self.observe(_row(input_ids))
        return self.detection is not None


class LlamaCppLoopBreaker(LoopHook):
    """``logits_processor`` for ``llama_cpp.Llama``: while the generated tokens end in a loop, the token that would
    continue it gets ``-inf``. ``interventions`` counts the bans."""

    def __call__(self, input_ids: Any, scores: np.ndarray) -> np.ndarray:
        rows = _row(input_ids)
        self.observe(rows)
        for _, token in self.continuations(rows):
            scores[token] = -np.inf
        return scores
