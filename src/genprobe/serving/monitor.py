"""Online loop monitor: detect a loop *while* a sequence is generated, then stop it, flag it or break it.

The detector is pluggable (:class:`IncrementalDetector`: ``push(token) -> LoopInfo | None`` and ``reset()``):
:class:`ExactPeriodDetector` answers at every prefix what :func:`genprobe.metrics.degeneracy.detect_loop` answers
in O(``max_period``) per token (tested); :class:`RecomputeDetector` runs any offline detector every ``every`` tokens.
The monitor's logic is written once (:class:`LoopWatch`); each engine's hook is a thin adapter that feeds it
(:class:`LoopHook`: ``transformers`` and ``llama_cpp.Llama`` here, :mod:`genprobe.serving.vllm_monitor`), and
:func:`monitor_backend` runs it over any :class:`~genprobe.engine.backend.Backend`. Only generated tokens are watched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Protocol, Sequence

import numpy as np
import torch
from transformers import LogitsProcessor, StoppingCriteria

from ..engine.backend import Backend, Request
from ..engine.generate import GREEDY
from ..engine.samplers.stages import SamplerConfig
from ..metrics.degeneracy import DEFAULT_MIN_TAIL, LoopInfo, detect_loop

DEFAULT_MAX_PERIOD = 64


class IncrementalDetector(Protocol):
    """A loop detector fed one token at a time."""

    def push(self, token: int) -> LoopInfo | None:
        """Add the newest token; return the loop if the sequence so far ends in one, else None."""

    def reset(self) -> None:
        """Forget every token (reuse for a new sequence)."""


class ExactPeriodDetector:
    """Incremental :func:`~genprobe.metrics.degeneracy.detect_loop`: O(max_period) work per token, same answers."""

    def __init__(self, max_period: int = DEFAULT_MAX_PERIOD, min_repeats: int = 2, min_tail: int = DEFAULT_MIN_TAIL):
        if max_period < 1 or min_repeats < 2 or min_tail < 1:
            raise ValueError(
                f"need max_period >= 1, min_repeats >= 2, min_tail >= 1; got {max_period}, {min_repeats}, {min_tail}"
            )
        self.max_period, self.min_repeats, self.min_tail = int(max_period), min_repeats, int(min_tail)
        self._periods = np.arange(1, self.max_period + 1)
        self.reset()

    def reset(self) -> None:
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
    """Any offline detector ``fn(tokens)`` run on the whole sequence every ``every`` tokens: a
    :class:`~genprobe.metrics.degeneracy.LoopInfo`, or anything with ``period``, ``onset`` and a ``looping`` /
    ``near_looping`` flag (e.g. ``detect_near_loop``'s result), reported as a ``LoopInfo`` over the tail from onset."""

    def __init__(self, fn: Callable[[Sequence[Hashable]], object] = detect_loop, every: int = 1):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.fn, self.every = fn, every
        self.reset()

    def reset(self) -> None:
        self.tokens: list[int] = []

    def push(self, token: int) -> LoopInfo | None:
        """Add one token; every ``every`` tokens, run ``fn`` on all of them."""
        self.tokens.append(int(token))
        if len(self.tokens) % self.every:
            return None
        result: Any = self.fn(self.tokens)
        if isinstance(result, LoopInfo):
            return result if result.looping else None
        flag = getattr(result, "looping", getattr(result, "near_looping", None))
        if flag is None:
            raise TypeError(
                f"a loop detector must return a result with .looping or .near_looping, got {type(result).__name__}"
            )
        if not flag:
            return None
        period, onset, toks = int(result.period), int(result.onset), self.tokens
        return LoopInfo(True, period, onset, tuple(toks[onset : onset + period]), (len(toks) - onset) / period)


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


class LoopWatch:
    """One sequence watched while it grows, the monitor's logic written once for every engine: ``loop`` is the
    detector's answer after the newest token (what the break action acts on), ``detection`` the first time it fired
    (what the stop action stops at); an engine's hook hands it the generated tokens so far (:meth:`catch_up`)."""

    def __init__(self, make_detector: Callable[[], IncrementalDetector] = ExactPeriodDetector):
        self.detector = make_detector()
        self.seen = 0  # generated tokens fed so far
        self.loop: LoopInfo | None = None
        self.detection: Detection | None = None

    def push(self, token: int) -> Detection | None:
        """Feed the next generated token; returns the detection when it first fires."""
        self.loop = self.detector.push(int(token))
        self.seen += 1
        if self.loop is None or self.detection is not None:
            return None
        assert self.loop.period is not None and self.loop.onset is not None  # a detector's LoopInfo is looping
        self.detection = Detection(self.seen - 1, int(self.loop.period), int(self.loop.onset), list(self.loop.unit))
        return self.detection

    def catch_up(self, generated: Sequence[int]) -> None:
        """Feed the tokens of ``generated`` (every token generated so far) not fed yet."""
        for t in generated[self.seen :]:
            self.push(t)

    def continuation(self, tokens: Sequence[int]) -> int | None:
        """The token that would continue the current loop at the end of ``tokens`` (None while none)."""
        return None if self.loop is None else loop_continuation(tokens, self.loop)


def loop_continuation(tokens: Sequence[int], info: LoopInfo) -> int:
    """The token that would continue a loop of period ``info.period`` at the end of ``tokens``."""
    if info.period is None:
        raise ValueError("loop_continuation needs a looping LoopInfo (its period is None)")
    return int(tokens[len(tokens) - info.period])


def replay(
    tokens: Sequence[int], make_detector: Callable[[], IncrementalDetector] = ExactPeriodDetector
) -> Detection | None:
    """Run a detector over a finished sequence token by token: where would the online monitor have fired?"""
    watch = LoopWatch(make_detector)
    watch.catch_up(tokens)  # the detection is the first time it fired
    return watch.detection


class LoopHook:
    """What every engine's generation hook shares: one :class:`LoopWatch` per row of ids that hold the prompt and
    then the tokens generated so far (only those are watched: a prompt that repeats itself is the user's business).
    The prompt's length is the row length at the first call less ``generated_at_first_call``."""

    def __init__(self, make_detector: Callable[[], IncrementalDetector] = ExactPeriodDetector):
        self.make_detector = make_detector
        self.reset()

    def reset(self) -> None:
        """Forget the generation (reuse the hook for the next one)."""
        self.prompt_length: int | None = None
        self.watches: list[LoopWatch] = []
        self.interventions = 0

    @property
    def detections(self) -> list[Detection | None]:
        """The first detection per row (period, onset, unit and step)."""
        return [w.detection for w in self.watches]

    def observe(self, rows: list[list[int]], generated_at_first_call: int = 0) -> None:
        """Feed each row's generated tokens to its watch."""
        if self.prompt_length is None:
            self.prompt_length = len(rows[0]) - generated_at_first_call
        if not self.watches:
            self.watches = [LoopWatch(self.make_detector) for _ in rows]
        for watch, row in zip(self.watches, rows, strict=True):
            watch.catch_up(row[self.prompt_length :])

    def ban(self, rows: list[list[int]], scores: Any) -> Any:
        """Feed ``rows``, then for each row that loops now set the token that would continue its loop to ``-inf`` in
        its row of ``scores`` (counted as interventions). The loop of period p continues with ``t[T - p]``; banning it
        forces the model off the cycle at the next step (an intervention, not a repair: the weights are unchanged)."""
        self.observe(rows)
        for i, (w, row) in enumerate(zip(self.watches, rows, strict=True)):
            if (token := w.continuation(row)) is not None:
                scores[i, token] = float("-inf")
                self.interventions += 1
        return scores


# ---- transformers integration -------------------------------------------------------------------------
class LoopStoppingCriteria(LoopHook, StoppingCriteria):
    """``transformers`` stopping criterion: a sequence is done once its generated tokens end in a loop."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.observe(input_ids.tolist(), generated_at_first_call=1)  # first called after the first new token
        return torch.tensor([d is not None for d in self.detections], dtype=torch.bool, device=input_ids.device)


class LoopBreakingLogitsProcessor(LoopHook, LogitsProcessor):
    """``transformers`` logits processor: while a row loops, ban the token that would continue its loop."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # first called before the first new token: the prompt is all of input_ids
        return self.ban(input_ids.tolist(), scores)


# ---- llama-cpp-python integration (its hooks are ``f(input_ids, logits)``, input_ids one flat row) ------------
class LlamaCppLoopStopping(LoopHook):
    """``stopping_criteria`` for ``llama_cpp.Llama``: True once the generated tokens end in a loop. llama-cpp-python
    calls it *without* the newest sampled token (``Llama.generate``), so it fires one token after the loop completes
    and the completion ends right after the token that completed it: the step :func:`replay` reports (tested).
    ``detection`` says where. One instance per completion (or :meth:`reset`)."""

    @property
    def detection(self) -> Detection | None:
        """The :class:`Detection`, or None while no loop was seen."""
        return self.watches[0].detection if self.watches else None

    def __call__(self, input_ids: Any, logits: Any) -> bool:
        self.observe([np.asarray(input_ids).reshape(-1).tolist()])
        return self.detection is not None


class LlamaCppLoopBreaker(LoopHook):
    """``logits_processor`` for ``llama_cpp.Llama`` (called with every token evaluated so far): while the generated
    tokens end in a loop, the token that would continue it gets ``-inf`` at the very next step."""

    def __call__(self, input_ids: Any, scores: np.ndarray) -> np.ndarray:
        self.ban([np.asarray(input_ids).reshape(-1).tolist()], scores[None])  # a view: the ban lands in scores
        return scores


# ---- any Backend: generate in chunks, stop at the first loop -------------------------------------------
@dataclass
class MonitoredCompletion:
    """One prompt's completion watched through a :class:`~genprobe.engine.backend.Backend`."""

    tokens: list[int]  # generated tokens, up to and including the one that completed the loop
    detection: Detection | None = None
    generated: int = 0  # tokens the backend generated (the rest of the chunk in which the loop was seen included)
    requests: int = 0
    finish_reason: str | None = None  # "loop" (cut after the loop) or the backend's last reason


@dataclass
class MonitorReport:
    """The monitor over a backend: each completion, how many looped, the tokens stopping saved, what was not
    checked (and why)."""

    JSON_PROPERTIES = ("looped", "tokens_saved")

    server: str
    max_tokens: int
    chunk: int  # tokens asked per request
    completions: list[MonitoredCompletion]
    not_checked: list[str]

    @property
    def looped(self) -> int:
        """Completions in which a loop was seen."""
        return sum(c.detection is not None for c in self.completions)

    @property
    def tokens_saved(self) -> int:
        """Tokens never generated because the monitor stopped a looping completion early."""
        return sum(self.max_tokens - c.generated for c in self.completions if c.finish_reason == "loop")


def monitor_backend(
    backend: Backend,
    prompts: Sequence[Sequence[int] | str],
    max_tokens: int,
    sampler: SamplerConfig = GREEDY,
    *,
    seed: int | None = None,
    chunk: int = 16,
    concurrency: int = 1,
    make_detector: Callable[[], IncrementalDetector] = ExactPeriodDetector,
) -> MonitorReport:
    """The online monitor over any backend, so a new engine gets it by its adapter alone: each prompt is continued
    ``chunk`` tokens per request (the prompt's ids then the tokens so far; request ``k`` seeded ``seed + k``), the
    detector fed after every chunk, and a completion stops at its first loop, cut right after the token that
    completed it as the engines' stop hooks cut it. A backend that takes text prompts only cannot be continued from
    token ids: each completion is then one request with the detector replayed over it (the loop is found; the early
    stop is reported not checked)."""
    if chunk < 1 or max_tokens < 1:
        raise ValueError(f"chunk and max_tokens must be >= 1, got {chunk}, {max_tokens}")
    caps = backend.capabilities
    not_checked = []
    if not caps.token_prompts:
        not_checked.append(
            f"early stop: the {caps.server} server takes text prompts, so a completion cannot be continued from its "
            "token ids; each was generated whole and the detector replayed over it"
        )
        chunk = max_tokens
    if not sampler.greedy and not caps.seed:
        not_checked.append(f"reproducibility: the {caps.server} server does not honour per-request seeds")
    starts = _backend_prompts(backend, prompts)
    runs = [MonitoredCompletion([]) for _ in prompts]
    watches = [LoopWatch(make_detector) for _ in prompts]
    live = list(range(len(prompts)))
    while live:
        # each completion's next chunk: its prompt then the tokens so far (request k seeded seed + k)
        requests = [
            Request(
                starts[i] if isinstance(starts[i], str) else (*starts[i], *runs[i].tokens),
                min(chunk, max_tokens - runs[i].generated),
                sampler,
                None if seed is None else seed + runs[i].requests,
            )
            for i in live
        ]
        going = []
        for i, out in zip(live, backend.complete_many(requests, concurrency), strict=True):
            run = runs[i]
            run.requests, run.generated, run.finish_reason = run.requests + 1, run.generated + len(out.token_ids), None
            for t in out.token_ids:
                run.tokens.append(int(t))
                if watches[i].push(t) is not None:
                    run.detection, run.finish_reason = watches[i].detection, "loop"
                    break
            run.finish_reason = run.finish_reason or out.finish_reason
            if run.finish_reason not in ("loop", "stop") and out.token_ids and run.generated < max_tokens:
                going.append(i)
        live = going
    return MonitorReport(caps.server, max_tokens, chunk, runs, not_checked)


def _backend_prompts(backend: Backend, prompts: Sequence[Sequence[int] | str]) -> list[tuple[int, ...] | str]:
    """Each prompt as the backend takes it: token ids (text tokenized by the backend) where it takes ids, else text."""
    caps = backend.capabilities
    starts: list[tuple[int, ...] | str] = []
    for p in prompts:
        if not isinstance(p, str) and not caps.token_prompts:
            raise ValueError(f"the {caps.server} server takes text prompts: give the prompts as text")
        if isinstance(p, str) and caps.token_prompts:  # tokenized by the backend
            if (ids := backend.tokenize(p)) is None:
                raise ValueError(f"the {caps.server} server cannot say how it tokenizes: give token ids")
            p = ids
        starts.append(p if isinstance(p, str) else tuple(p))
    return starts
