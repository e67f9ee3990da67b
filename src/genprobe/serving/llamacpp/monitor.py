"""The online loop monitor for ``llama_cpp.Llama``: a stopping criterion and a loop-breaking logits processor.

Both are :class:`genprobe.serving.monitor.LoopHook` adapters fed what llama-cpp-python passes its hooks
(``f(input_ids, logits)``). A logits processor sees every token evaluated so far, so :class:`LlamaCppLoopBreaker`
bans the token that would continue a loop at the very next step. A stopping criterion is called *without* the
newest sampled token (``Llama.generate``), so :class:`LlamaCppLoopStopping` fires one token after the loop
completes: the output equals the unmonitored generation cut right after the step
:func:`genprobe.serving.monitor.replay` reports (tested). One instance per completion (or :meth:`reset`).
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
