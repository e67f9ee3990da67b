"""Screening an edit without generating: how much less likely the model becomes to continue its own loops.

A :class:`LoopProbe` teacher-forces a few looping generations and reads log p(loop token) one period past the onset;
its change (``dlogp``) and the share of loop tokens no longer the top choice (``broken``) are a proxy that the scaled
search (:mod:`genprobe.loops.scaled`) only uses to choose which candidates to generate for.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from .arch import forward_logits, pad_right
from .contrast import position_labels
from .prefix import FrozenPrefix
from .scan import GenerationRecord


@dataclass(frozen=True)
class Pressure:
    """An edited model's pull toward the loops of the probe's sequences, against the unedited model's."""

    dlogp: float  # mean change of log p(loop token) at loop positions, nats (negative: the loop is less likely)
    broken: float  # share of loop positions whose loop token was the top choice and no longer is
    positions: int


class LoopProbe:
    """Teacher-forced loop continuations of up to ``max_seqs`` looping records; the base log-probs kept once."""

    def __init__(
        self,
        model: Any,
        records: Sequence[GenerationRecord],
        max_seqs: int = 8,
        batch_size: int = 8,
        pad_id: int = 0,
        reuse_prefix: bool = False,
    ):
        rows: list[int] = []
        cols: list[int] = []
        seqs: list[list[int]] = []
        for rec in records:
            seq = list(rec.prompt_ids) + list(rec.tokens)
            loop, _ = position_labels(len(rec.prompt_ids), len(seq), rec.measures)
            if not loop:
                continue  # a repetitive tail without a period: no position is "inside the loop"
            rows.extend([len(seqs)] * len(loop))
            cols.extend(loop)
            seqs.append(seq)
            if len(seqs) == max_seqs:
                break
        if not seqs:
            raise ValueError(
                "the scaled search needs looping generations with an onset (exact or near loops) in the search set "
                "and none has one (their tails are only repetitive): use the exhaustive search (--search exhaustive)"
            )
        self.ids, self.valid = pad_right(seqs, pad_id)
        self.rows, self.cols = torch.tensor(rows), torch.tensor(cols)
        self.targets = self.ids[self.rows, self.cols + 1]
        self.batch_size = batch_size
        self.prefix = FrozenPrefix(model) if reuse_prefix else None
        with self.prefix.recording() if self.prefix else contextlib.nullcontext():
            self.base_logp, self.base_top = self._read(model)

    @property
    def n_sequences(self) -> int:
        return int(self.ids.shape[0])

    @property
    def positions(self) -> int:
        """Loop positions read per measurement."""
        return int(self.targets.numel())

    @torch.no_grad()
    def _read(self, model: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(loop token) and whether it is the argmax, at every loop position."""
        logp, top = [], []
        for s in range(0, self.ids.shape[0], self.batch_size):
            valid = self.valid[s : s + self.batch_size]
            logits = forward_logits(model, self.ids[s : s + self.batch_size], None if bool(valid.all()) else valid)
            pick = (self.rows >= s) & (self.rows < s + self.batch_size)
            at = logits[self.rows[pick] - s, self.cols[pick]].float()
            tgt = self.targets[pick]
            logp.append(F.log_softmax(at, dim=-1).gather(-1, tgt[:, None])[:, 0])
            top.append(at.argmax(-1) == tgt)
        return torch.cat(logp), torch.cat(top)

    def measure(self, model: Any, first_layer: int = 0) -> Pressure:
        """The edited (or hooked) model's :class:`Pressure` on the probe's loop positions. ``first_layer``: the lowest
        layer the edit touches; with ``reuse_prefix`` the blocks below it are not computed again."""
        with self.prefix.skipping(first_layer) if self.prefix else contextlib.nullcontext():
            logp, top = self._read(model)
        was_top = self.base_top
        broken = float((was_top & ~top).sum()) / max(1, int(was_top.sum()))
        return Pressure(float((logp - self.base_logp).mean()), broken, int(logp.numel()))
