"""The online loop monitor for llama.cpp users: a stopping criterion and a loop-breaking logits processor for
``llama_cpp.Llama`` (``create_completion`` / ``__call__`` / ``generate`` take both).

The detectors and the per-sequence bookkeeping are :mod:`genprobe.serving.monitor`'s (:class:`LoopMonitor`,
:class:`ExactPeriodDetector` by default); this module only feeds them what llama-cpp-python passes its hooks
(``llama.py``: ``StoppingCriteria`` / ``LogitsProcessor`` = ``f(input_ids, logits)``):

* a **logits processor** is called before each token is sampled with ``input_ids`` = every token evaluated so far
  (the prompt, then each generated token), so :class:`LlamaCppLoopBreaker` sees the whole history and bans the token
  that would continue a detected loop (``scores[t] = -inf``) at the very next step;
* a **stopping criterion** is called after a token is sampled but with ``input_ids`` *without* that newest token
  (``Llama.generate``: ``stopping_criteria(self._input_ids[:sample_idx], ...)``, the token is evaluated only on the
  next round), so :class:`LlamaCppLoopStopping` fires one token after the loop completes and the completion ends
  with the token that completed it (the sampled one after it is dropped): the output equals the unmonitored
  generation cut right after the step :func:`genprobe.serving.monitor.replay` reports (tested).

Only generated tokens are watched: the prompt length is the length of ``input_ids`` at the first call. One
instance per completion (or :meth:`reset` between completions).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..monitor import ExactPeriodDetector, IncrementalDetector, LoopMonitor, loop_continuation


class _Watcher:
    """Feeds the tokens of ``input_ids`` after the prompt to a one-sequence :class:`LoopMonitor`."""

    def __init__(self, make_detector: Callable[[], IncrementalDetector]):
        self.monitor = LoopMonitor(make_detector)
        self.reset()

    def reset(self) -> None:
        self.monitor.start(1)
        self.prompt_length: int | None = None
        self.seen = 0

    def observe(self, input_ids: Any) -> None:
        ids = np.asarray(input_ids).reshape(-1)
        if self.prompt_length is None:
            self.prompt_length = len(ids)
        for t in ids[self.prompt_length + self.seen :]:
            self.monitor.push(0, int(t))
            self.seen += 1


class LlamaCppLoopStopping:
    """``stopping_criteria`` for ``llama_cpp.Llama``: True once the generated tokens end in a loop (see the module
    docstring for which token it sees last). ``detection`` says where, period and onset included."""

    def __init__(self, make_detector: Callable[[], IncrementalDetector] = ExactPeriodDetector):
        self.watch = _Watcher(make_detector)

    @property
    def detection(self) -> Any:
        """The :class:`~genprobe.serving.monitor.Detection`, or None while no loop was seen."""
        return self.watch.monitor.detections[0]

    def reset(self) -> None:
        """Forget the completion (reuse for the next one)."""
        self.watch.reset()

    def __call__(self, input_ids: Any, logits: Any) -> bool:
        self.watch.observe(input_ids)
        return self.detection is not None


class LlamaCppLoopBreaker:
    """``logits_processor`` for ``llama_cpp.Llama``: while the generated tokens end in a loop of period p, the token
    that would continue it (``t[T - p]``) gets ``-inf``; the model is forced off the cycle (an intervention, the
    weights are unchanged). ``interventions`` counts the bans."""

    def __init__(self, make_detector: Callable[[], IncrementalDetector] = ExactPeriodDetector):
        self.watch = _Watcher(make_detector)
        self.interventions = 0

    def reset(self) -> None:
        """Forget the completion (reuse for the next one)."""
        self.watch.reset()
        self.interventions = 0

    def __call__(self, input_ids: Any, scores: np.ndarray) -> np.ndarray:
        self.watch.observe(input_ids)
        info = self.watch.monitor.current[0]
        if info is not None:
            scores[loop_continuation([int(t) for t in np.asarray(input_ids).reshape(-1)], info)] = -np.inf
            self.interventions += 1
        return scores
