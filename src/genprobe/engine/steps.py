"""What each generation step chose and how sure it was: probability, entropy, kept-set size, top candidates."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch


@dataclass
class Candidate:
    """One of the most likely tokens at a step."""

    token: int
    text: str
    prob: float


@dataclass
class StepStat:
    """One step of one row: the chosen token under the sampling distribution it was drawn from."""

    step: int
    token: int
    text: str
    prob: float | None = None  # probability of the chosen token (None when probabilities were not kept)
    entropy_nats: float | None = None
    kept: int | None = None  # tokens with non-zero probability after the sampler chain
    top: list[Candidate] = field(default_factory=list)


def step_stats(
    tokens: Sequence[int],
    step_probs: Sequence[torch.Tensor] | None,
    token_str: Callable[[int], str],
    row: int = 0,
    top: int = 0,
) -> list[StepStat]:
    """Per-step statistics of row ``row`` from ``GenerationResult.step_probs`` (each (B, V))."""
    out = []
    for i, t in enumerate(tokens):
        stat = StepStat(step=i, token=int(t), text=token_str(int(t)))
        if step_probs is not None:
            p = step_probs[i][row]
            nz = p[p > 0]  # exact zeros contribute nothing to the entropy
            stat.prob, stat.entropy_nats, stat.kept = float(p[t]), float(-(nz * nz.log()).sum()), len(nz)
            if top:
                vals, idx = torch.topk(p, min(top, p.numel()))
                pairs = zip(vals.tolist(), idx.tolist(), strict=True)
                stat.top = [Candidate(j, token_str(j), v) for v, j in pairs if v > 0]
        out.append(stat)
    return out


def format_steps(steps: Sequence[StepStat]) -> str:
    """The ``--top`` table: one line per step with its candidates."""
    lines = []
    for s in steps:
        cands = "  ".join(f"{c.text}:{c.prob:.3f}" for c in s.top)
        lines.append(
            f"step {s.step:3d} → {s.text!s:6} p={s.prob:.3f}  H={s.entropy_nats:.2f} nats "
            f"({(s.entropy_nats or 0.0) / math.log(2):.2f} bits)  kept={s.kept}  | {cands}"
        )
    return "\n".join(lines)
