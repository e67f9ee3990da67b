"""The online loop monitor as a vLLM V1 logits-processor plug-in.

Registered when the engine starts (``EngineOptions(loop_monitor=True)``), it acts only on requests whose
``SamplingParams.extra_args`` carry a ``"genprobe_loop_monitor"`` entry (:func:`monitor_request_kwargs`). Before each
step it feeds every watched request's new output tokens to its :class:`~genprobe.serving.monitor.LoopWatch`; once a
loop is detected it either ``"stop"``s the request (every logit but ``stop_token_id``'s becomes ``-inf``, so vLLM
finishes it with ``stop_reason`` = that id) or ``"break"``s the loop (the token that would continue it is banned).
It runs inside vLLM's engine process, so it reports through the token stream only: :func:`monitor_result` replays
the same (deterministic) detector over the returned tokens. Interface: ``vllm/v1/sample/logits_processor``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from .monitor import Detection, ExactPeriodDetector, LoopWatch, replay

EXTRA_KEY = "genprobe_loop_monitor"
ACTIONS = ("stop", "break")


def _check(cfg: Any, stop_ids: Sequence[int] | None) -> None:
    if not isinstance(cfg, dict):
        raise ValueError(f"extra_args[{EXTRA_KEY!r}] must be a dict, got {type(cfg).__name__}")
    action = cfg.get("action", "stop")
    if action not in ACTIONS:
        raise ValueError(f"{EXTRA_KEY}.action must be one of {ACTIONS}, got {action!r}")
    if action == "stop":
        sid = cfg.get("stop_token_id")
        if not isinstance(sid, int) or sid not in (stop_ids or ()):
            raise ValueError(f"{EXTRA_KEY}: action 'stop' needs an int stop_token_id that is also in stop_token_ids")
    ExactPeriodDetector(**(cfg.get("detector_kwargs") or {}))  # fail at validation, not mid-generation


@dataclass
class _Watched:
    """One watched request: its :class:`~genprobe.serving.monitor.LoopWatch`, vLLM's live list of its output tokens
    and what to do once it loops."""

    watch: LoopWatch
    output: list[int]
    action: str
    stop_token_id: int | None


class LoopMonitorProcessor(LogitsProcessor):
    """vLLM V1 logits processor: stop or break looping requests that asked for the monitor."""

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Reject a malformed monitor request before it enters the batch."""
        cfg = (sampling_params.extra_args or {}).get(EXTRA_KEY)
        if cfg is not None:
            _check(cfg, sampling_params.stop_token_ids)

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool):
        self.rows: dict[int, _Watched] = {}

    def is_argmax_invariant(self) -> bool:
        """Stopping or banning a token changes the argmax."""
        return False

    @staticmethod
    def _new(params: Any, _prompt: list[int] | None, output: list[int]) -> _Watched | None:
        cfg = (params.extra_args or {}).get(EXTRA_KEY) if params is not None else None
        if cfg is None:
            return None
        watch = LoopWatch(lambda: ExactPeriodDetector(**(cfg.get("detector_kwargs") or {})))
        return _Watched(watch, output, cfg.get("action", "stop"), cfg.get("stop_token_id"))

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Track added/removed/moved requests, then feed each watched request its new tokens."""
        process_dict_updates(self.rows, batch_update, self._new)
        for w in self.rows.values():
            w.watch.catch_up(w.output)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Force the stop token (``stop``) or ban the loop's next token (``break``) on rows that loop now."""
        for row, w in self.rows.items():
            token = w.watch.continuation(w.output)
            if token is None or row >= logits.shape[0]:
                continue
            if w.action == "stop":
                logits[row] = float("-inf")
                logits[row, w.stop_token_id] = 0.0
            else:
                logits[row, token] = float("-inf")
        return logits


def monitor_request_kwargs(
    stop_token_id: int | None, action: str = "stop", *, stop_token_ids: Sequence[int] = (), **detector: Any
) -> dict:
    """``SamplingParams`` keyword arguments that turn the monitor on for one request (``detector``: the
    :class:`~genprobe.serving.monitor.ExactPeriodDetector`'s settings, its defaults where not given)."""
    cfg: dict[str, Any] = {"action": action, "detector_kwargs": detector}
    stops = list(stop_token_ids)
    if action == "stop" and stop_token_id is not None:  # a token the request may end with
        cfg["stop_token_id"] = int(stop_token_id)
        stops.append(int(stop_token_id))
    _check(cfg, stops)
    return {"extra_args": {EXTRA_KEY: cfg}, "stop_token_ids": stops or None}


def monitor_result(output: Any, stop_token_id: int) -> Detection | None:
    """The monitor's detection for a finished request (None when the monitor did not stop it)."""
    comp = output.outputs[0]
    toks = list(comp.token_ids)
    if comp.finish_reason != "stop" or comp.stop_reason != stop_token_id or not toks or toks[-1] != stop_token_id:
        return None
    det = replay(toks[:-1])
    return det if det is not None and det.step == len(toks) - 2 else None
