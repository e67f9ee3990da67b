"""Online loop monitor: detect a loop *while* a sequence is generated, then stop it, flag it or break it.

The detector is pluggable (:class:`IncrementalDetector`): anything with ``push(token) -> LoopInfo |
None`` and ``reset()``. Two are provided:

* :class:`ExactPeriodDetector` — the exact-period rule of :func:`genprobe.metrics.loop.detect_loop`
  (smallest period p whose periodic tail covers ≥ ``min_repeats`` units and ≥ ``min_tail`` tokens)
  kept up to date in O(``max_period``) per token: for every p it keeps the length of the run of
  positions with ``t[i] == t[i - p]`` ending at the newest token. At every prefix it answers exactly
  what ``detect_loop(prefix, max_period=...)`` answers (tested).
* :class:`RecomputeDetector` — wraps any offline detector ``fn(tokens)`` (e.g.
  :func:`genprobe.metrics.detect_near_loop`, which also sees loops with a substitution) and calls it
  every ``every`` tokens.

The monitor is wired into generation as a ``transformers`` :class:`LoopStoppingCriteria` (stop),
a ``transformers`` :class:`LoopBreakingLogitsProcessor` (intervene: ban the token that would
continue the loop) and a vLLM V1 logits-processor plug-in (:mod:`genprobe.serving.vllm_monitor`).
Only generated tokens are watched — a prompt that repeats itself is the user's business.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Protocol, Sequence

import numpy as np
import torch

from ..metrics.loop import DEFAULT_MIN_TAIL, LoopInfo, detect_loop

DEFAULT_MAX_PERIOD = 64


class IncrementalDetector(Protocol):
    """A loop detector fed one token at a time."""

    def push(self, token: int) -> LoopInfo | None:
        """Add the newest token; return the loop if the sequence so far ends in one, else None."""

    def reset(self) -> None:
        """Forget every token (reuse for a new sequence)."""


class ExactPeriodDetector:
    """Incremental :func:`~genprobe.metrics.loop.detect_loop`: O(max_period) work per token, same answers."""

    def __init__(self, max_period: int = DEFAULT_MAX_PERIOD, min_repeats: int = 2, min_tail: int = DEFAULT_MIN_TAIL):
        if max_period < 1 or min_repeats < 2 or min_tail < 1:
            raise ValueError(
                f"need max_period >= 1, min_repeats >= 2, min_tail >= 1; got {max_period}, {min_repeats}, {min_tail}"
            )
        self.max_period, self.min_repeats, self.min_tail = int(max_period), min_repeats, int(min_tail)
        self._periods = np.arange(1, self.max_period + 1)
        self.reset()

    def reset(self) -> None:
        """Forget every token."""
        self.tokens: list[int] = []
        self._ring = np.full(self.max_period, -1, dtype=np.int64)  # the last max_period tokens, newest at n-1 mod P
        self._run = np.zeros(self.max_period, dtype=np.int64)  # run[p-1]: positions i ending now with t[i] == t[i-p]

    def push(self, token: int) -> LoopInfo | None:
        """Add one token and report the smallest qualifying period, as ``detect_loop`` would on the whole prefix."""
        n = len(self.tokens)  # index of the new token
        P = self.max_period
        back = self._ring[(n - self._periods) % P]  # t[n - p] for p = 1..P (stale where n - p < 0)
        same = (back == token) & (self._periods <= n)
        self._run = np.where(same, self._run + 1, 0)
        self._ring[n % P] = token
        self.tokens.append(int(token))
        T = n + 1
        limit = min(int(T // self.min_repeats), P)
        if limit < 1:
            return None
        tail = self._run[:limit] + self._periods[:limit]  # periodic tail length (run + one period)
        ok = (tail >= self.min_repeats * self._periods[:limit]) & (tail >= self.min_tail)
        if not ok.any():
            return None
        p = int(np.argmax(ok)) + 1
        length = int(tail[p - 1])
        onset = T - length
        return LoopInfo(True, p, onset, tuple(self.tokens[onset : onset + p]), length / p)


class RecomputeDetector:
    """Any offline detector ``fn(tokens)`` run on the whole sequence every ``every`` tokens.

    ``fn`` may return a :class:`~genprobe.metrics.loop.LoopInfo` or anything with ``period`` and
    ``onset`` and a ``looping`` / ``near_looping`` flag (e.g. :func:`genprobe.metrics.detect_near_loop`'s
    result); it is reported as a ``LoopInfo`` over the tail from ``onset``.
    """

    def __init__(self, fn: Callable[[Sequence[Hashable]], object] = detect_loop, every: int = 1):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.fn, self.every = fn, every
        self.reset()

    def reset(self) -> None:
        """Forget every token."""
        self.tokens: list[int] = []

    def push(self, token: int) -> LoopInfo | None:
        """Add one token; every ``every`` tokens, run ``fn`` on all of them."""
        self.tokens.append(int(token))
        if len(self.tokens) % self.every:
            return None
        return as_loop_info(self.fn(self.tokens), self.tokens)


def as_loop_info(result: Any, tokens: Sequence[int]) -> LoopInfo | None:
    """A detector's result as a ``LoopInfo`` (None when it reports no loop)."""
    if isinstance(result, LoopInfo):
        return result if result.looping else None
    flag = getattr(result, "looping", None)
    if flag is None:
        flag = getattr(result, "near_looping", None)
    if flag is None:
        raise TypeError(
            f"a loop detector must return a result with .looping or .near_looping, got {type(result).__name__}"
        )
    if not flag:
        return None
    period, onset = int(result.period), int(result.onset)
    return LoopInfo(True, period, onset, tuple(tokens[onset : onset + period]), (len(tokens) - onset) / period)


@dataclass
class Detection:
    """Where the monitor fired: after generated token ``step`` (0-based), a loop of ``period`` from ``onset``."""

    JSON_PROPERTIES = ("lag",)  # computed from the fields, kept in the JSON form

    step: int
    period: int
    onset: int  # index (in generated tokens) of the first token of the periodic tail
    unit: list[int]

    @property
    def lag(self) -> int:
        """Tokens generated after the loop's onset before it was detected (step is inclusive)."""
        return self.step + 1 - self.onset


@dataclass
class LoopMonitor:
    """One detector per sequence of a batch; records the first detection of each sequence."""

    make_detector: Callable[[], IncrementalDetector] = ExactPeriodDetector
    detectors: list[IncrementalDetector] = field(default_factory=list)
    detections: list[Detection | None] = field(default_factory=list)  # first detection per sequence
    current: list[LoopInfo | None] = field(default_factory=list)  # the detector's answer after the newest token
    lengths: list[int] = field(default_factory=list)  # generated tokens seen per sequence

    def start(self, batch_size: int) -> None:
        """Fresh state for ``batch_size`` sequences."""
        self.detectors = [self.make_detector() for _ in range(batch_size)]
        self.detections = [None] * batch_size
        self.current = [None] * batch_size
        self.lengths = [0] * batch_size

    def push(self, row: int, token: int) -> Detection | None:
        """Feed one generated token of sequence ``row``; returns its detection when it first fires."""
        info = self.detectors[row].push(int(token))
        self.current[row] = info
        self.lengths[row] += 1
        if info is None or self.detections[row] is not None:
            return None
        assert info.period is not None and info.onset is not None  # a detector's LoopInfo is looping
        self.detections[row] = Detection(self.lengths[row] - 1, int(info.period), int(info.onset), list(info.unit))
        return self.detections[row]


def replay(
    tokens: Sequence[int], make_detector: Callable[[], IncrementalDetector] = ExactPeriodDetector
) -> Detection | None:
    """Run a detector over a finished sequence token by token: where would the online monitor have fired?"""
    mon = LoopMonitor(make_detector)
    mon.start(1)
    for t in tokens:
        if mon.push(0, t) is not None:
            break
    return mon.detections[0]


# ---- transformers integration -------------------------------------------------------------------------
class _HFWatcher:
    """Feeds the newest column of ``input_ids`` to a :class:`LoopMonitor`, starting after the prompt."""

    def __init__(self, monitor: LoopMonitor | None, prompt_length: int | None):
        self.monitor = monitor or LoopMonitor()
        self.prompt_length = prompt_length
        self._seen = 0

    def observe(self, input_ids: torch.Tensor) -> None:
        B, T = input_ids.shape
        if self.prompt_length is None:  # first call happens after the first new token
            self.prompt_length = T - 1
        if not self.monitor.detectors:
            self.monitor.start(B)
        new = input_ids[:, self.prompt_length + self._seen :].tolist()
        for row, toks in enumerate(new):
            for t in toks:
                self.monitor.push(row, t)
        self._seen += len(new[0]) if new else 0


def _hf_bases():
    from transformers import LogitsProcessor, StoppingCriteria

    return StoppingCriteria, LogitsProcessor


class LoopStoppingCriteria(_hf_bases()[0]):  # type: ignore[misc]
    """``transformers`` stopping criterion: a sequence is done once the monitor sees it loop."""

    def __init__(self, monitor: LoopMonitor | None = None, prompt_length: int | None = None):
        self.watch = _HFWatcher(monitor, prompt_length)

    @property
    def monitor(self) -> LoopMonitor:
        """The monitor (its ``detections`` say period and onset per row)."""
        return self.watch.monitor

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.watch.observe(input_ids)
        return torch.tensor([d is not None for d in self.monitor.detections], dtype=torch.bool, device=input_ids.device)


class LoopBreakingLogitsProcessor(_hf_bases()[1]):  # type: ignore[misc]
    """``transformers`` logits processor: while a row loops, ban the token that would continue its loop.

    The loop of period p continues with ``t[T - p]``; setting its logit to ``-inf`` forces the model
    off the cycle at the next step (an intervention, not a repair: the weights are unchanged).
    """

    def __init__(self, monitor: LoopMonitor | None = None, prompt_length: int | None = None):
        self.watch = _HFWatcher(monitor, prompt_length)
        self.interventions = 0

    @property
    def monitor(self) -> LoopMonitor:
        """The monitor (first detection per row)."""
        return self.watch.monitor

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.watch.prompt_length is None:  # called before the first new token: the prompt is all of input_ids
            self.watch.prompt_length = input_ids.shape[1]
        self.watch.observe(input_ids)
        for row, info in enumerate(self.monitor.current):
            if info is not None:
                scores[row, loop_continuation(input_ids[row].tolist(), info)] = float("-inf")
                self.interventions += 1
        return scores


def loop_continuation(tokens: Sequence[int], info: LoopInfo) -> int:
    """The token that would continue a loop of period ``info.period`` at the end of ``tokens``."""
    if info.period is None:
        raise ValueError("loop_continuation needs a looping LoopInfo (its period is None)")
    return int(tokens[len(tokens) - info.period])
