"""Per-layer/per-head attention statistics: entropy, normalised entropy, far / sink / diagonal / local mass.

Conventions (one query row = one probability distribution over its visible keys: causal attention over one unpadded
sequence, query t sees keys 0 … t):

* entropy ``H = -Σ p ln p`` in nats, with ``0 ln 0 = 0``; it lies in ``[0, ln n]`` for ``n`` visible keys.
* normalised entropy ``H / ln n``; a row with a single visible key has no choice to make (``ln 1 = 0``),
  so it is *undefined* there (``None`` per position) and excluded from the normalised mean.
* far mass: probability on keys with ``pos_q - pos_k > distance``; sink mass: on the first token; diagonal mass:
  on the query itself; local mass: on keys with ``0 <= pos_q - pos_k <= local_window``.
* means are over query positions (rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

#: Each metric's name in figures and grids, and what it measures (``{d}``: the far distance, ``{w}``: the local window).
DESCRIPTIONS = {
    "entropy": ("entropy (nats)", "-sum p ln p over visible keys (nats), mean over query positions"),
    "norm_entropy": ("entropy / ln(visible keys)", "entropy / ln(visible keys); rows with one visible key excluded"),
    "far_mass": ("far mass (keys > {d} back)", "mass on keys more than {d} positions before the query"),
    "sink_mass": ("mass on the first token", "mass on the first token"),
    "diag_mass": ("mass on the query itself", "mass on the query's own position"),
    "local_mass": ("local mass (keys 0..{w} back)", "mass on keys 0..{w} positions back"),
}
METRICS = tuple(DESCRIPTIONS)


@dataclass
class HeadStats:
    """Averages over query positions for one (layer, head); ``head`` None: the layer's mean over its heads."""

    layer: int
    head: int | None
    # Each a mean over the query positions where it is defined; None when it is defined at none.
    entropy: float | None
    norm_entropy: float | None
    far_mass: float | None
    sink_mass: float | None
    diag_mass: float | None
    local_mass: float | None
    max_entropy: float | None  # mean of ln(visible keys): the uniform-attention reference


def _rows(probs: torch.Tensor) -> torch.Tensor:
    if not 2 <= probs.dim() <= 4 or probs.shape[-1] != probs.shape[-2]:
        raise ValueError(f"attention probabilities must be (T,T), (H,T,T) or (L,H,T,T); got shape {tuple(probs.shape)}")
    return probs.reshape((1,) * (4 - probs.dim()) + tuple(probs.shape))


def per_position(probs: torch.Tensor, distance: int = 8, local_window: int = 2) -> dict[str, torch.Tensor]:
    """Per-query statistics of causal attention over positions 0 … T-1, each (L, H, T) float tensors (NaN where
    undefined), plus ``n_visible`` (T,)."""
    if distance < 0 or local_window < 0:
        raise ValueError(f"distance ({distance}) and local_window ({local_window}) must be >= 0")
    p = _rows(probs)
    T = p.shape[-1]
    pos = torch.arange(T)
    dist = pos[:, None] - pos[None, :]  # (Tq, Tk): how far back each key is
    vis = dist >= 0
    n_vis = vis.sum(-1)  # (Tq,)
    log_n = n_vis.double().log()
    # Key masks of each mass, (Tq, Tk) in double, shared by every layer.
    masks = {
        "far_mass": (dist > distance).double(),
        "sink_mass": (pos == 0)[None, :].expand(T, T).double(),
        "diag_mass": (dist == 0).double(),
        "local_mass": (vis & (dist <= local_window)).double(),
    }
    per_layer = []
    for layer in p:  # one layer at a time in double: a (L, H, T, T) copy in double would be twice the maps again
        q = layer.double() * vis  # mass on invisible keys would be a masking bug: the validator reports it, not this
        ent = -torch.where(q > 0, q * q.clamp_min(1e-300).log(), torch.zeros_like(q)).sum(-1)
        norm = torch.where(n_vis > 1, ent / log_n.clamp_min(1e-12), torch.full_like(ent, float("nan")))
        per_layer.append({"entropy": ent, "norm_entropy": norm} | {k: (q * m).sum(-1) for k, m in masks.items()})
    out = {k: torch.stack([row[k] for row in per_layer]) for k in per_layer[0]}
    out["max_entropy"] = log_n.expand_as(out["entropy"])
    out["n_visible"] = n_vis
    return out


def head_stats(probs: torch.Tensor, **options: Any) -> list[HeadStats]:
    """One :class:`HeadStats` per (layer, head), averaged over query positions (``options``: :func:`per_position`'s
    ``distance``, ``local_window``)."""
    return _stats(per_position(probs, **options))[0]


def _stats(pp: dict[str, torch.Tensor]) -> tuple[list[HeadStats], list[HeadStats]]:
    """Per-head means over the query positions where each metric is defined, and per-layer means of those."""
    keys = (*METRICS, "max_entropy")
    heads = torch.stack([pp[k].nanmean(-1) for k in keys], -1)  # (L, H, metrics); NaN: defined nowhere
    layers = heads.nanmean(1)

    def row(layer: int, head: int | None, vals: torch.Tensor) -> HeadStats:
        return HeadStats(layer, head, *(None if math.isnan(v) else v for v in vals.tolist()))

    return (
        [row(ly, h, heads[ly, h]) for ly in range(heads.shape[0]) for h in range(heads.shape[1])],
        [row(ly, None, layers[ly]) for ly in range(heads.shape[0])],
    )


@dataclass
class AttentionReport:
    """Per-head and per-layer attention statistics of one sequence, plus the per-position values behind them
    (its JSON form is ``attention.json``)."""

    JSON_PROPERTIES = ("seq_len", "definitions")  # computed from the fields, kept in the JSON form

    distance: int
    local_window: int
    n_layer: int
    n_head: int
    implementation: str
    note: str | None
    tokens: list[int]
    tokens_text: list[str] | None
    heads: list[HeadStats]
    layers: list[HeadStats]  # head None: each layer's mean over its heads
    per_position: dict[str, list]
    n_visible: list

    @property
    def seq_len(self) -> int:
        """Tokens in the sequence."""
        return len(self.tokens)

    @property
    def definitions(self) -> dict[str, str]:
        """What each metric measures, in words (shipped inside every report)."""
        return {k: d.format(d=self.distance, w=self.local_window) for k, (_, d) in DESCRIPTIONS.items()}


def title(report: dict, metric: str) -> str:
    """``metric``'s name in figures and grids, with the report's distance and local window."""
    return DESCRIPTIONS[metric][0].format(d=report["distance"], w=report["local_window"])


def attention_report(
    capture, distance: int = 8, local_window: int = 2, tokens_text: list[str] | None = None
) -> AttentionReport:
    """Per-head means, per-layer means and per-position values of an :class:`AttentionCapture`."""
    pp = per_position(capture.probs, distance=distance, local_window=local_window)
    heads, layers = _stats(pp)

    def _list(t: torch.Tensor) -> list:
        return [[[None if math.isnan(v) else round(v, 6) for v in row] for row in lay] for lay in t.tolist()]

    meta = (capture.n_layer, capture.n_head, capture.implementation, capture.note, list(capture.tokens), tokens_text)
    per_pos = {k: _list(pp[k]) for k in METRICS}
    return AttentionReport(distance, local_window, *meta, heads, layers, per_pos, pp["n_visible"].tolist())


def head_matrix(report: dict, metric: str) -> list[list[float | None]]:
    """One metric of an :class:`AttentionReport`'s JSON form as a layers × heads matrix (``matrix[layer][head]``; None
    where undefined)."""
    if metric not in (*METRICS, "max_entropy"):
        raise ValueError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}")
    grid: list[list[float | None]] = [[None] * report["n_head"] for _ in range(report["n_layer"])]
    for h in report["heads"]:
        grid[h["layer"]][h["head"]] = h[metric]
    return grid


GRID_METRICS = ("norm_entropy", "far_mass", "sink_mass")
