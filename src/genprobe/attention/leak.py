"""Padding-leak test: a sequence's logits alone vs the same sequence inside a left- / right-padded batch.

A correct implementation gives the same logits on real positions (float noise, < 1e-4). Two classic
leaks: padding keys that stay visible (a broken mask), and left padding without ``position_ids`` —
HF GPT-2 then numbers positions by tensor index, so every real token sits at the wrong position
(the nnsight / GPT-2 report). Our engine derives positions from the mask, so it passes either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..model.arch import unwrap
from ..model.bpc import eval_mode
from ..model.gpt import GPT
from ..model.load import max_positions
from .capture import attn_implementation, is_hf_model

LEAK_THRESHOLD = 1e-4


@dataclass
class SequenceLeak:
    """Max |Δlogit| over the real positions of one sequence, per padding side."""

    index: int
    length: int
    delta: dict[str, float]  # side -> max |Δlogit|
    max_delta: float
    leak: bool


@dataclass
class LeakReport:
    """Result of :func:`padding_leak`."""

    JSON_PROPERTIES = ("max_delta", "leak", "verdict")  # computed from the fields, kept in the JSON form

    model: str
    position_ids: bool
    threshold: float
    sides: list[str]
    sequences: list[SequenceLeak] = field(default_factory=list)

    @property
    def max_delta(self) -> float:
        """Largest |Δlogit| over every sequence and side."""
        return max((s.max_delta for s in self.sequences), default=0.0)

    @property
    def leak(self) -> bool:
        """True when any sequence exceeds the threshold."""
        return any(s.leak for s in self.sequences)

    @property
    def verdict(self) -> str:
        """``"LEAK"`` or ``"ok"``."""
        return "LEAK" if self.leak else "ok"


@torch.no_grad()
def _logits(model, ids: torch.Tensor, mask: torch.Tensor | None, position_ids: bool) -> torch.Tensor:
    if isinstance(model, GPT):
        from ..engine.runner import forward_step

        return forward_step(model, ids, attention_mask=mask).float()
    if not is_hf_model(model):
        raise ValueError(f"padding_leak needs a genprobe GPT or a transformers causal LM, got {type(model).__name__}")
    kw = {"input_ids": ids, "use_cache": False}
    if mask is not None:
        kw["attention_mask"] = mask
        if position_ids:
            kw["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return model(**kw).logits.float()


def _pad(seqs: list[list[int]], width: int, pad_id: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        sl = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[i, sl] = torch.tensor(s, dtype=torch.long)
        mask[i, sl] = 1
    return ids, mask


def padding_leak(
    model_like,
    sequences: list[list[int]],
    pad_id: int,
    sides: tuple[str, ...] = ("left", "right"),
    position_ids: bool = True,
    extra_pad: int = 2,
    threshold: float = LEAK_THRESHOLD,
) -> LeakReport:
    """Run each sequence alone and inside padded batches; max |Δlogit| on its real positions.

    ``position_ids=True`` passes positions derived from the mask (``cumsum - 1``) to HF models;
    ``False`` passes none, leaving the model's default. Every row gets at least ``extra_pad`` pads.
    """
    model = unwrap(model_like)
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("padding_leak needs at least one sequence, and no empty sequence")
    if bad := set(sides) - {"left", "right"}:
        raise ValueError(f"sides must be 'left' and/or 'right', got {sorted(bad)}")
    if extra_pad < 0:
        raise ValueError(f"extra_pad must be >= 0, got {extra_pad}")
    width = max(len(s) for s in sequences) + extra_pad
    limit = max_positions(model) if isinstance(model, GPT) or is_hf_model(model) else None
    if limit is not None and width > limit:
        raise ValueError(
            f"padded batch width {width} (longest sequence {width - extra_pad} + {extra_pad} pads) exceeds the "
            f"model's {limit} positions; use shorter sequences"
        )
    dev = next(model.parameters()).device
    with eval_mode(model):
        alone = [_logits(model, torch.tensor([s], device=dev), None, position_ids)[0].cpu() for s in sequences]
        deltas: dict[int, dict[str, float]] = {i: {} for i in range(len(sequences))}
        for side in sides:
            ids, mask = _pad(sequences, width, pad_id, side)
            out = _logits(model, ids.to(dev), mask.to(dev), position_ids).cpu()
            for i, s in enumerate(sequences):
                real = out[i, width - len(s) :] if side == "left" else out[i, : len(s)]
                deltas[i][side] = float((real - alone[i]).abs().max())
    name = type(model).__name__ + (f" ({attn_implementation(model)})" if is_hf_model(model) else "")
    rep = LeakReport(model=name, position_ids=position_ids, threshold=threshold, sides=list(sides))
    for i, s in enumerate(sequences):
        m = max(deltas[i].values())
        rep.sequences.append(SequenceLeak(i, len(s), deltas[i], m, m > threshold))
    return rep


def format_leak(rep: LeakReport) -> str:
    """Text table: one line per sequence."""
    lines = [
        f"padding leak — {rep.model}, position_ids={'yes' if rep.position_ids else 'no'}, threshold {rep.threshold:g}",
        f"{'seq':>4} {'len':>4} " + " ".join(f"{'Δ ' + s:>10}" for s in rep.sides) + "  verdict",
    ]
    for s in rep.sequences:
        deltas = " ".join(f"{s.delta[side]:>10.2e}" for side in rep.sides)
        lines.append(f"{s.index:>4} {s.length:>4} {deltas}  {'LEAK' if s.leak else 'ok'}")
    lines.append(f"max |Δlogit| = {rep.max_delta:.3e} → {rep.verdict}")
    return "\n".join(lines)
