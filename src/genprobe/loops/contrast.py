"""Contrastive activations: positions inside loops versus positions outside them (:func:`position_labels`).

Each scanned sequence is run once more, teacher-forced, with capture hooks on every layer; right padding keeps
real positions from seeing padding. When the generations give too few reference positions, held-out text is added
as reference and reported (docs/loop-repair.md, "How the pipeline works").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..metrics.degeneracy import LoopMeasures
from ..model.arch import mlp_sites
from .hooks import KINDS, capture
from .regress import forward_logits, pad_right
from .scan import GenerationRecord


@dataclass
class ContrastCounts:
    """How many positions each class holds, and where the reference positions came from."""

    loop_positions: int
    reference_positions_generated: int
    reference_positions_text: int
    sequences: int
    looping_sequences: int


@dataclass
class Contrast:
    """Per layer: stacked loop / reference MLP-output vectors, residual means, unit means in loops."""

    loop: dict[int, torch.Tensor]  # layer -> (N_loop, d_model) MLP outputs
    reference: dict[int, torch.Tensor]  # layer -> (N_ref, d_model)
    unit_mean_loop: dict[int, torch.Tensor]  # layer -> (d_ff,)
    resid_mean_loop: dict[int, torch.Tensor]
    resid_mean_reference: dict[int, torch.Tensor]
    counts: ContrastCounts


def position_labels(prompt_len: int, total: int, m: LoopMeasures) -> tuple[list[int], list[int]]:
    """Positions ``t`` of a sequence (prompt + generation, ``total`` tokens) whose next token continues the loop
    (one full period past its onset) and those before the onset (reference); a repetitive tail without a period
    gives neither."""
    loop: list[int] = []
    ref: list[int] = []
    looping, onset, period = m.any_loop, m.any_onset, m.any_period
    if m.degenerate and not looping:
        return loop, ref
    if looping:
        assert onset is not None and period is not None  # any_loop: a period and its onset exist
        loop_from, ref_until = onset + period, onset  # one full period past the onset loops; before it is reference
    else:
        loop_from, ref_until = total, total  # j < total always: every generated position is reference
    for t in range(total - 1):
        j = t + 1 - prompt_len
        if j < 0:
            continue
        if j >= loop_from:
            loop.append(t)
        elif j < ref_until:
            ref.append(t)
    return loop, ref


Captured = dict[str, dict[int, dict[str, list[torch.Tensor]]]]  # "loop"/"ref" → layer → site kind → row blocks


@torch.no_grad()
def _collect(
    model: Any, seqs: Sequence[list[int]], labels: Sequence[tuple[list[int], list[int]]], batch_size: int, pad_id: int
) -> Captured:
    n_layers = len(mlp_sites(model))
    acc: Captured = {name: {layer: {k: [] for k in KINDS} for layer in range(n_layers)} for name in ("loop", "ref")}
    for s in range(0, len(seqs), batch_size):
        chunk, lab = seqs[s : s + batch_size], labels[s : s + batch_size]
        ids, valid = pad_right(chunk, pad_id)
        sel: dict[str, tuple[list[int], list[int]]] = {"loop": ([], []), "ref": ([], [])}
        for i, (lp, rp) in enumerate(lab):
            for name, pos in (("loop", lp), ("ref", rp)):
                sel[name][0].extend([i] * len(pos))
                sel[name][1].extend(pos)
        dev = next(iter(mlp_sites(model)[0].down.parameters())).device
        with capture(model, kinds=KINDS) as cap:
            forward_logits(model, ids.to(dev), None if bool(valid.all()) else valid.to(dev))
        for name, (rows, cols) in sel.items():
            if not rows:
                continue
            r, c = torch.tensor(rows), torch.tensor(cols)
            for layer, kind in itertools.product(range(n_layers), KINDS):
                acc[name][layer][kind].append(cap.get(kind, layer)[0][r, c].float().cpu())
    return acc


def collect_contrast(
    model: Any,
    records: Sequence[GenerationRecord],
    *,
    batch_size: int = 64,
    pad_id: int = 0,
    reference_text_windows: Sequence[list[int]] | None = None,
    min_reference: int = 256,
) -> Contrast:
    """Teacher-force every record (prompt + generated tokens) and split positions by its loop measures."""
    seqs, labels = [], []
    for rec in records:
        seq = list(rec.prompt_ids) + list(rec.tokens)
        seqs.append(seq)
        labels.append(position_labels(len(rec.prompt_ids), len(seq), rec.measures))
    acc = _collect(model, seqs, labels, batch_size, pad_id)
    n_layers = len(acc["loop"])
    n_loop = sum(len(loop) for loop, _ in labels)
    n_ref = sum(len(r) for _, r in labels)
    counts = ContrastCounts(n_loop, n_ref, 0, len(seqs), sum(1 for r in records if r.degenerate))
    if n_loop == 0:
        raise ValueError("no loop positions: none of the scanned generations loops, so there is nothing to contrast")
    if n_ref < min_reference and reference_text_windows:
        text_labels: list[tuple[list[int], list[int]]] = [([], list(range(len(w) - 1))) for w in reference_text_windows]
        extra = _collect(model, list(reference_text_windows), text_labels, batch_size, pad_id)
        for layer, kind in itertools.product(range(n_layers), KINDS):
            acc["ref"][layer][kind].extend(extra["ref"][layer][kind])
        counts.reference_positions_text = sum(len(w) - 1 for w in reference_text_windows)
    if n_ref + counts.reference_positions_text == 0:
        raise ValueError(
            "no reference positions: every generated position is inside a loop and no reference text was given"
        )

    def cat(name: str, layer: int, kind: str) -> torch.Tensor:
        return torch.cat(acc[name][layer][kind]) if acc[name][layer][kind] else torch.empty(0)

    return Contrast(
        loop={layer: cat("loop", layer, "mlp_out") for layer in range(n_layers)},
        reference={layer: cat("ref", layer, "mlp_out") for layer in range(n_layers)},
        unit_mean_loop={layer: cat("loop", layer, "units").mean(0) for layer in range(n_layers)},
        resid_mean_loop={layer: cat("loop", layer, "resid").mean(0) for layer in range(n_layers)},
        resid_mean_reference={layer: cat("ref", layer, "resid").mean(0) for layer in range(n_layers)},
        counts=counts,
    )
