"""Contrastive activations: positions inside loops versus positions outside them (:func:`position_labels`), and
the loop direction per layer they give (:func:`loop_direction`) with how well it separates them (:func:`separation`).

The forward hooks that read activations (:func:`capture`) and remove a direction (:func:`ablate`) are context
managers: registered on entry and removed in ``finally`` — also when the body raises — so a model never keeps a
stale hook (checked by the tests).

Each scanned sequence is run once more, teacher-forced, with capture hooks on every layer; right padding keeps
real positions from seeing padding. When the generations give too few reference positions, held-out text is added
as reference and reported (docs/loop-repair.md, "How the pipeline works").
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import torch

from ..metrics.degeneracy import LoopMeasures
from ..model.arch import mlp_sites
from .arch import forward_logits, pad_right
from .scan import GenerationRecord

# ---- hooks ---------------------------------------------------------------------------------
KINDS = ("mlp_out", "resid", "units")


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


@dataclass
class Captured:
    """Per layer and kind, the tensors seen by the hooks, one entry per forward call."""

    data: dict[str, dict[int, list[torch.Tensor]]] = field(default_factory=dict)

    def get(self, kind: str, layer: int) -> list[torch.Tensor]:
        """Tensors (B, T, D) captured for ``kind`` at ``layer``, in call order."""
        return self.data.get(kind, {}).get(layer, [])


@contextlib.contextmanager
def capture(
    model: Any,
    layers: list[int] | None = None,
    kinds: tuple[str, ...] = ("mlp_out",),
) -> Iterator[Captured]:
    """Record ``mlp_out`` (MLP output added to the residual), ``resid`` (block output) and/or
    ``units`` (input of the down-projection: post-activation unit values) per layer."""
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown capture kinds {bad}; choose from {KINDS}")
    sites = mlp_sites(model)
    layers = list(range(len(sites))) if layers is None else list(layers)
    _check_layers(layers, len(sites))
    cap = Captured({k: {layer: [] for layer in layers} for k in kinds})

    def store(kind: str, layer: int, t: torch.Tensor) -> None:
        cap.data[kind][layer].append(t.detach().clone())

    handles = []
    try:
        for layer, kind in itertools.product(layers, kinds):
            s = sites[layer]
            if kind == "units":  # the down-projection's input: a pre-hook
                handles.append(s.down.register_forward_pre_hook(lambda m, i, k=kind, n=layer: store(k, n, i[0])))
            else:
                module = s.mlp if kind == "mlp_out" else s.block
                handles.append(module.register_forward_hook(lambda m, i, o, k=kind, n=layer: store(k, n, _first(o))))
        yield cap
    finally:
        for h in handles:
            h.remove()


def _check_layers(layers: Iterable[int], n_layers: int) -> None:
    for layer in layers:
        if not 0 <= layer < n_layers:
            raise ValueError(f"layer {layer} out of range: the model has {n_layers} layers")


def remove_direction(h: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """h − (h·d) d for a unit vector d, over the last dimension."""
    d = d.to(dtype=h.dtype, device=h.device)
    return h - (h @ d)[..., None] * d


@contextlib.contextmanager
def ablate(model: Any, directions: dict[int, torch.Tensor]) -> Iterator[None]:
    """While active, each listed layer's MLP output loses its component along that layer's direction."""
    sites = mlp_sites(model)
    handles = []
    try:
        _check_layers(directions, len(sites))
        for layer, d in directions.items():
            d = d / d.norm()

            def hook(m, i, o, d=d):
                if isinstance(o, (tuple, list)):
                    return (remove_direction(o[0], d), *o[1:])
                return remove_direction(o, d)

            handles.append(sites[layer].mlp.register_forward_hook(hook))
        yield
    finally:
        for h in handles:
            h.remove()


# ---- contrast ------------------------------------------------------------------------------
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


MIN_REFERENCE = 256  # fewer generated reference positions than this: held-out text is added
Rows = dict[str, dict[int, dict[str, list[torch.Tensor]]]]  # "loop"/"ref" → layer → site kind → row blocks


@torch.no_grad()
def _collect(
    model: Any, seqs: Sequence[list[int]], labels: Sequence[tuple[list[int], list[int]]], batch_size: int
) -> Rows:
    n_layers = len(mlp_sites(model))
    acc: Rows = {name: {layer: {k: [] for k in KINDS} for layer in range(n_layers)} for name in ("loop", "ref")}
    for s in range(0, len(seqs), batch_size):
        chunk, lab = seqs[s : s + batch_size], labels[s : s + batch_size]
        ids, valid = pad_right(chunk, 0)  # right padding: real positions never see it
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
    reference_text_windows: Sequence[list[int]] | None = None,
) -> Contrast:
    """Teacher-force every record (prompt + generated tokens) and split positions by its loop measures."""
    seqs, labels = [], []
    for rec in records:
        seq = list(rec.prompt_ids) + list(rec.tokens)
        seqs.append(seq)
        labels.append(position_labels(len(rec.prompt_ids), len(seq), rec.measures))
    acc = _collect(model, seqs, labels, batch_size)
    n_layers = len(acc["loop"])
    n_loop = sum(len(loop) for loop, _ in labels)
    n_ref = sum(len(r) for _, r in labels)
    counts = ContrastCounts(n_loop, n_ref, 0, len(seqs), sum(1 for r in records if r.degenerate))
    if n_loop == 0:
        raise ValueError("no loop positions: none of the scanned generations loops, so there is nothing to contrast")
    if n_ref < MIN_REFERENCE and reference_text_windows:
        text_labels: list[tuple[list[int], list[int]]] = [([], list(range(len(w) - 1))) for w in reference_text_windows]
        extra = _collect(model, list(reference_text_windows), text_labels, batch_size)
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


# ---- the loop direction ---------------------------------------------------------------------
def mean_difference(loop: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """(mean(loop) − mean(reference)) / ‖·‖ — unit vector in d_model."""
    diff = loop.float().mean(0) - reference.float().mean(0)
    n = diff.norm()
    if float(n) == 0.0:
        raise ValueError("loop and reference means are identical: no direction")
    return diff / n


def pca_of_differences(loop: torch.Tensor, reference: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """First right-singular vector of (loop_i − reference_j) over at most 4096 random pairs (repeng-style,
    uncentred), signed to agree with the mean difference."""
    g = torch.Generator().manual_seed(seed)
    n = min(loop.shape[0], reference.shape[0], 4096)
    a = loop.float()[torch.randperm(loop.shape[0], generator=g)[:n]]
    b = reference.float()[torch.randperm(reference.shape[0], generator=g)[:n]]
    d = torch.linalg.svd(a - b, full_matrices=False)[2][0]
    if float(d @ (loop.float().mean(0) - reference.float().mean(0))) < 0:
        d = -d
    return d / d.norm()


def loop_direction(
    loop: torch.Tensor, reference: torch.Tensor, method: str = "mean_diff", seed: int = 0
) -> torch.Tensor:
    """Unit loop direction by ``method`` ("mean_diff" or "pca")."""
    if method not in ("mean_diff", "pca"):
        raise ValueError(f"direction method must be one of ('mean_diff', 'pca'), got {method!r}")
    return mean_difference(loop, reference) if method == "mean_diff" else pca_of_differences(loop, reference, seed)


@dataclass(frozen=True)
class Separation:
    """Projections of loop and reference vectors on a direction: means, pooled-std effect size, AUC."""

    mean_loop: float
    mean_reference: float
    effect_size: float
    auc: float


def separation(loop: torch.Tensor, reference: torch.Tensor, d: torch.Tensor) -> Separation:
    """How well projections on ``d`` separate loop from reference: mean gap, pooled-std effect size, AUC."""
    pl, pr = loop.float() @ d.float(), reference.float() @ d.float()
    pooled = ((pl.var(unbiased=False) + pr.var(unbiased=False)) / 2).sqrt()
    # AUC = P(proj_loop > proj_ref), by ranks (ties count half)
    allv = torch.cat([pl, pr])
    ranks = allv.argsort().argsort().float() + 1
    r_loop = ranks[: pl.numel()].sum()
    auc = (r_loop - pl.numel() * (pl.numel() + 1) / 2) / (pl.numel() * pr.numel())
    effect = float((pl.mean() - pr.mean()) / pooled) if float(pooled) > 0 else 0.0
    return Separation(float(pl.mean()), float(pr.mean()), effect, float(auc))
