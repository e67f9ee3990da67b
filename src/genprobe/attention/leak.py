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
SIDES = ("left", "right")
EXTRA_PAD = 2


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


def padding_leak(
    model_like, sequences: list[list[int]], pad_id: int, position_ids: bool = True, threshold: float = LEAK_THRESHOLD
) -> LeakReport:
    """Run each sequence alone and inside left- and right-padded batches (every row at least :data:`EXTRA_PAD` pads);
    max |Δlogit| on its real positions. ``position_ids=True`` passes positions derived from the mask (``cumsum - 1``)
    to HF models; ``False`` passes none, leaving the model's default."""
    model = unwrap(model_like)
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("padding_leak needs at least one sequence, and no empty sequence")
    width = max(len(s) for s in sequences) + EXTRA_PAD
    limit = max_positions(model) if isinstance(model, GPT) or is_hf_model(model) else None
    if limit is not None and width > limit:
        raise ValueError(
            f"padded batch width {width} (longest sequence {width - EXTRA_PAD} + {EXTRA_PAD} pads) exceeds the "
            f"model's {limit} positions; use shorter sequences"
        )
    dev = next(model.parameters()).device
    name = type(model).__name__ + (f" ({attn_implementation(model)})" if is_hf_model(model) else "")
    rep = LeakReport(model=name, position_ids=position_ids, threshold=threshold, sides=list(SIDES))
    with eval_mode(model):
        alone = [_logits(model, torch.tensor([s], device=dev), None, position_ids)[0].cpu() for s in sequences]
        deltas: list[dict[str, float]] = [{} for _ in sequences]
        for side in SIDES:
            ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
            mask = torch.zeros(len(sequences), width, dtype=torch.long)
            rows = [slice(width - len(s), width) if side == "left" else slice(0, len(s)) for s in sequences]
            for i, (s, real) in enumerate(zip(sequences, rows, strict=True)):
                ids[i, real], mask[i, real] = torch.tensor(s, dtype=torch.long), 1
            out = _logits(model, ids.to(dev), mask.to(dev), position_ids).cpu()
            for i, real in enumerate(rows):
                deltas[i][side] = float((out[i, real] - alone[i]).abs().max())
    for i, (s, d) in enumerate(zip(sequences, deltas, strict=True)):
        rep.sequences.append(SequenceLeak(i, len(s), d, max(d.values()), max(d.values()) > threshold))
    return rep
