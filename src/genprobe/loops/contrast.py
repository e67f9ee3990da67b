"""Contrastive activations: positions inside loops versus before them (:func:`position_labels`), the loop direction
per layer (:func:`loop_direction`) and how well it separates them (:func:`separation`). The hooks (:func:`capture`,
:func:`ablate`) are context managers, removed in ``finally`` even when the body raises (docs/loop-repair.md, "How
the pipeline works").
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch

from ..metrics.degeneracy import LoopMeasures
from ..model.arch import mlp_sites
from .regress import forward_logits, pad_right
from .scan import GenerationRecord

# ---- hooks ---------------------------------------------------------------------------------
KINDS = ("mlp_out", "resid", "units")


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


Captured = dict[str, dict[int, list[torch.Tensor]]]  # kind -> layer -> the tensors (B, T, D), one per forward call


@contextlib.contextmanager
def capture(model: Any) -> Iterator[Captured]:
    """Record, on every layer, each kind of :data:`KINDS`: ``mlp_out`` (MLP output added to the residual),
    ``resid`` (block output) and ``units`` (input of the down-projection: post-activation unit values)."""
    sites = mlp_sites(model)
    cap: Captured = {k: {layer: [] for layer in range(len(sites))} for k in KINDS}
    with contextlib.ExitStack() as hooks:
        for (layer, s), kind in itertools.product(enumerate(sites), KINDS):
            keep = cap[kind][layer].append
            if kind == "units":  # the down-projection's input: a pre-hook
                h = s.down.register_forward_pre_hook(lambda m, i, keep=keep: keep(i[0].detach().clone()))
            else:
                module = s.mlp if kind == "mlp_out" else s.block
                h = module.register_forward_hook(lambda m, i, o, k=keep: k(_first(o).detach().clone()))
            hooks.callback(h.remove)
        yield cap


@contextlib.contextmanager
def ablate(model: Any, directions: dict[int, torch.Tensor]) -> Iterator[None]:
    """While active, each listed layer's MLP output loses its component along that layer's direction."""
    sites = mlp_sites(model)
    with contextlib.ExitStack() as hooks:
        for layer, d in directions.items():
            if not 0 <= layer < len(sites):
                raise ValueError(f"layer {layer} out of range: the model has {len(sites)} layers")
            d = d / d.norm()

            def hook(m, i, o, d=d):  # h − (h·d) d over the last dimension
                h = _first(o)
                h = h - (h @ d.to(h))[..., None] * d.to(h)
                return (h, *o[1:]) if isinstance(o, (tuple, list)) else h

            hooks.callback(sites[layer].mlp.register_forward_hook(hook).remove)
        yield


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
    (one full period past its onset) and those before the onset (reference); a tail without a period gives neither."""
    first = max(prompt_len - 1, 0)  # t predicts generated token j = t + 1 - prompt_len: the first with j >= 0
    if not m.any_loop:  # every generated position is reference
        return [], [] if m.degenerate else list(range(first, total - 1))
    assert m.any_onset is not None and m.any_period is not None  # any_loop: a period and its onset exist
    loop_from, ref_until = prompt_len - 1 + m.any_onset + m.any_period, prompt_len - 1 + m.any_onset
    return list(range(max(first, loop_from), total - 1)), list(range(first, min(ref_until, total - 1)))


MIN_REFERENCE = 256  # fewer generated reference positions than this: held-out text is added
Rows = dict[str, dict[int, dict[str, list[torch.Tensor]]]]  # "loop"/"ref" → layer → site kind → row blocks


@torch.no_grad()
def collect_contrast(
    model: Any,
    records: Sequence[GenerationRecord],
    *,
    batch_size: int = 64,
    reference_text_windows: Sequence[list[int]] | None = None,
) -> Contrast:
    """Teacher-force every record (prompt + generation) and keep each layer's activations at its loop and reference
    positions."""
    seqs = [list(rec.prompt_ids) + list(rec.tokens) for rec in records]
    labels = [
        position_labels(len(rec.prompt_ids), len(seq), rec.measures) for rec, seq in zip(records, seqs, strict=True)
    ]
    n_loop, n_ref = sum(len(loop) for loop, _ in labels), sum(len(r) for _, r in labels)
    if n_loop == 0:
        raise ValueError("no loop positions: none of the scanned generations loops, so there is nothing to contrast")
    text = list(reference_text_windows or []) if n_ref < MIN_REFERENCE else []  # every position a reference
    counts = ContrastCounts(
        n_loop, n_ref, sum(len(w) - 1 for w in text), len(seqs), sum(r.measures.degenerate for r in records)
    )
    if n_ref + counts.reference_positions_text == 0:
        raise ValueError(
            "no reference positions: every generated position is inside a loop and no reference text was given"
        )
    seqs, labels = seqs + text, labels + [([], list(range(len(w) - 1))) for w in text]
    n_layers = len(mlp_sites(model))
    dev = next(iter(mlp_sites(model)[0].down.parameters())).device
    acc: Rows = {name: {layer: {k: [] for k in KINDS} for layer in range(n_layers)} for name in ("loop", "ref")}
    for s in range(0, len(seqs), batch_size):
        ids, valid = pad_right(seqs[s : s + batch_size], 0)  # right padding: real positions never see it
        with capture(model) as cap:
            forward_logits(model, ids.to(dev), None if bool(valid.all()) else valid.to(dev))
        for side, name in enumerate(("loop", "ref")):
            at = [(i, t) for i, lab in enumerate(labels[s : s + batch_size]) for t in lab[side]]
            if at:
                r, c = torch.tensor(at).T
                for layer, kind in itertools.product(range(n_layers), KINDS):
                    acc[name][layer][kind].append(cap[kind][layer][0][r, c].float().cpu())
    loop, ref = (
        {layer: {k: torch.cat(v) if v else torch.empty(0) for k, v in x.items()} for layer, x in acc[n].items()}
        for n in ("loop", "ref")
    )
    return Contrast(
        loop={layer: x["mlp_out"] for layer, x in loop.items()},
        reference={layer: x["mlp_out"] for layer, x in ref.items()},
        unit_mean_loop={layer: x["units"].mean(0) for layer, x in loop.items()},
        resid_mean_loop={layer: x["resid"].mean(0) for layer, x in loop.items()},
        resid_mean_reference={layer: x["resid"].mean(0) for layer, x in ref.items()},
        counts=counts,
    )


# ---- the loop direction ---------------------------------------------------------------------
def loop_direction(
    loop: torch.Tensor, reference: torch.Tensor, method: str = "mean_diff", seed: int = 0
) -> torch.Tensor:
    """Unit loop direction in d_model: ``mean_diff``, (mean(loop) − mean(reference)) / ‖·‖; or ``pca``, the first
    right-singular vector of (loop_i − reference_j) over at most 4096 random pairs (repeng-style, uncentred), signed
    to agree with the mean difference."""
    if method not in ("mean_diff", "pca"):
        raise ValueError(f"direction method must be one of ('mean_diff', 'pca'), got {method!r}")
    diff = loop.float().mean(0) - reference.float().mean(0)
    if method == "mean_diff":
        if float(diff.norm()) == 0.0:
            raise ValueError("loop and reference means are identical: no direction")
        return diff / diff.norm()
    g = torch.Generator().manual_seed(seed)
    n = min(loop.shape[0], reference.shape[0], 4096)
    a = loop.float()[torch.randperm(loop.shape[0], generator=g)[:n]]
    b = reference.float()[torch.randperm(reference.shape[0], generator=g)[:n]]
    d = torch.linalg.svd(a - b, full_matrices=False)[2][0]
    return (-d if float(d @ diff) < 0 else d) / d.norm()


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
