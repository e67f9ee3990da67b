"""Loop direction per layer: normalised difference of means, or the top principal axis of paired differences."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def mean_difference(loop: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """(mean(loop) − mean(reference)) / ‖·‖ — unit vector in d_model."""
    if loop.numel() == 0 or reference.numel() == 0:
        raise ValueError(f"need loop and reference vectors, got {loop.shape[0]} and {reference.shape[0]}")
    diff = loop.float().mean(0) - reference.float().mean(0)
    n = diff.norm()
    if float(n) == 0.0:
        raise ValueError("loop and reference means are identical: no direction")
    return diff / n


def pca_of_differences(
    loop: torch.Tensor, reference: torch.Tensor, seed: int = 0, max_pairs: int = 4096
) -> torch.Tensor:
    """First right-singular vector of (loop_i − reference_j) over random pairs (repeng-style, uncentred),
    signed to agree with the mean difference."""
    g = torch.Generator().manual_seed(seed)
    n = min(loop.shape[0], reference.shape[0], max_pairs)
    if n == 0:
        raise ValueError("need loop and reference vectors for PCA")
    a = loop.float()[torch.randperm(loop.shape[0], generator=g)[:n]]
    b = reference.float()[torch.randperm(reference.shape[0], generator=g)[:n]]
    diffs = a - b
    _, _, vh = torch.linalg.svd(diffs, full_matrices=False)
    d = vh[0]
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
