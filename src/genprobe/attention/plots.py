"""Figures for attention diagnostics (matplotlib Agg; every file written atomically)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .._io import atomic_write_bytes, figure_bytes  # noqa: E402
from .longrange import N_CONTENT  # noqa: E402
from .metrics import GRID_METRICS, head_matrix, title  # noqa: E402


def save_figure(fig, path: str | Path) -> Path:
    """Save ``fig`` atomically (format from the suffix) and close it."""
    path = Path(path)
    atomic_write_bytes(path, figure_bytes(fig, path.suffix.lstrip(".") or "png", dpi=110, bbox_inches="tight"))
    return path


def head_heatmaps(
    capture, out_dir: str | Path, labels: list[str] | None = None, layers: list[int] | None = None
) -> list[Path]:
    """One PNG per (layer, head) of ``layers`` (default: all): ``attn_L{l}_H{h}.png``, queries as rows, keys as
    columns. A deep model has hundreds of heads: :func:`heads_grid_plot` is the overview, these the close-ups."""
    from matplotlib import font_manager

    for name in ("Noto Sans CJK SC", "Noto Sans CJK JP", "WenQuanYi Zen Hei", "AR PL UMing CN", "SimHei"):
        if any(f.name == name for f in font_manager.fontManager.ttflist):  # Tang characters as tick labels, else boxes
            plt.rcParams["font.family"] = [name, "DejaVu Sans"]
            break
    out_dir = Path(out_dir)
    paths = []
    T = capture.probs.shape[-1]
    chosen = range(capture.n_layer) if layers is None else layers
    if bad := [ly for ly in chosen if not 0 <= ly < capture.n_layer]:
        raise ValueError(f"layers {bad} do not exist: the model has layers 0..{capture.n_layer - 1}")
    for layer in chosen:
        for head in range(capture.n_head):
            fig, ax = plt.subplots(figsize=(4.5, 4))
            im = ax.imshow(capture.probs[layer, head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set(title=f"layer {layer}, head {head}", xlabel="key position", ylabel="query position")
            if labels is not None and T <= 48:
                ax.set_xticks(range(T), labels, fontsize=6)
                ax.set_yticks(range(T), labels, fontsize=6)
            fig.colorbar(im, ax=ax, fraction=0.046)
            paths.append(save_figure(fig, out_dir / f"attn_L{layer}_H{head}.png"))
    return paths


def _tick_step(n: int, most: int) -> int:
    """Label every k-th row/column so that at most ``most`` labels show."""
    return max(1, math.ceil(n / most))


def heads_grid_plot(rep: dict, path: str | Path) -> Path:
    """Every head of every layer in one figure: one layers × heads heatmap per grid metric (each in [0, 1]), growing
    with depth and width up to a cap (a 96-layer model stays one page); values written in the cells when few."""
    import numpy as np

    n_layer, n_head = rep["n_layer"], rep["n_head"]
    panel_w = min(8.0, max(2.4, 0.32 * n_head + 1.0))
    height = min(14.0, max(2.4, 0.2 * n_layer + 1.3))
    fig, axes = plt.subplots(1, len(GRID_METRICS), figsize=(panel_w * len(GRID_METRICS), height), squeeze=False)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgray")
    annotate = n_layer * n_head <= 64
    for ax, metric in zip(axes[0], GRID_METRICS, strict=True):
        grid = np.array([[np.nan if v is None else v for v in row] for row in head_matrix(rep, metric)], dtype=float)
        im = ax.imshow(grid, cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
        ax.set_title(title(rep, metric), fontsize=9)
        ax.set(xlabel="head", ylabel="layer")
        xs, ys = range(0, n_head, _tick_step(n_head, 24)), range(0, n_layer, _tick_step(n_layer, 40))
        ax.set_xticks(list(xs), [str(h) for h in xs], fontsize=7)
        ax.set_yticks(list(ys), [str(ly) for ly in ys], fontsize=7)
        cells = [(ly, h, v) for (ly, h), v in np.ndenumerate(grid) if annotate and not np.isnan(v)]
        for ly, h, v in cells:
            ax.text(h, ly, f"{v:.2f}", ha="center", va="center", fontsize=7, color="w" if v < 0.6 else "k")
        fig.colorbar(im, ax=ax, fraction=0.08, pad=0.03).ax.tick_params(labelsize=7)
    fig.suptitle(f"{n_layer} layers × {n_head} heads, T={rep['seq_len']}", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def entropy_plot(report: dict, path: str | Path) -> Path:
    """Per-layer attention entropy: each head's mean (dots), layer mean (line), uniform ln(N) reference."""
    rows = report["layers"]
    layers = [row["layer"] for row in rows]
    fig, ax = plt.subplots(figsize=(min(14.0, max(5.0, 0.22 * len(layers) + 1.5)), 3.5))
    for h in report["heads"]:
        ax.scatter(h["layer"], h["entropy"], s=18, color="tab:blue", alpha=0.6)
    ax.plot(layers, [row["entropy"] for row in rows], "-o", color="tab:blue", label="layer mean")
    ax.plot(layers, [row["max_entropy"] for row in rows], "--", color="gray", label="uniform: mean ln(visible keys)")
    ax.set_xticks(layers[:: _tick_step(len(layers), 48)])
    ax.set(xlabel="layer", ylabel="attention entropy (nats)", ylim=(0, None))
    ax.set_title(f"attention entropy per layer (T={report['seq_len']})")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


_PE_COLORS = {"learned": "tab:blue", "rope": "tab:orange", "alibi": "tab:green", "none": "tab:gray"}


def _curve(ax, ys: dict[int, float | None], pe: str, style: str, **kw) -> None:
    """One encoding's curve through the points ``x -> y`` measured (y None: refused), in that encoding's colour."""
    if points := [(x, y) for x, y in ys.items() if y is not None]:
        ax.plot(*zip(*points, strict=True), style, color=_PE_COLORS.get(pe), **kw)


def longrange_plot(res, path: str | Path) -> Path:
    """Three panels of a :class:`~genprobe.attention.longrange.LongRangeResult`: passkey accuracy vs distance,
    lag accuracy vs lag (per evaluation length), validation loss vs length (refused lengths marked ✗)."""
    syn, corpus = res.synthetic, res.corpus
    fig, axes = plt.subplots(1, 2 if corpus is None else 3, figsize=(10 if corpus is None else 15, 3.8))
    for pe, r in syn.passkey.items():
        # Encodings often tie at 1.0: distinct markers/sizes keep every line visible.
        marker, ms = {"learned": ("o", 7), "rope": ("s", 5), "alibi": ("^", 3)}.get(pe, ("x", 4))
        _curve(axes[0], r.accuracy, pe, "-", marker=marker, ms=ms, label=pe, alpha=0.8)
    L = syn.config.context
    axes[0].axvline(L - 1.5, color="k", ls=":", lw=1)
    axes[0].text(L - 1.5, 0.02, " training context", fontsize=7)
    axes[0].set(
        title="passkey (content suffices)", xlabel="distance value→query", ylabel="accuracy", ylim=(-0.03, 1.03)
    )
    for pe, r in syn.lag.items():
        for i, (n, accs) in enumerate(r.accuracy.items()):
            _curve(axes[1], accs, pe, ("-", "--", ":")[i % 3], marker="o", ms=3, label=f"{pe}, len {n}")
    axes[1].axhline(1 / N_CONTENT, color="gray", lw=0.8)
    axes[1].set(xlabel="lag k", ylabel="accuracy", ylim=(-0.03, 1.03))
    axes[1].set_title(f"token k back (position only), trained at len {L}")
    if corpus is not None:
        ctx = corpus.config.context
        for pe, r in corpus.encodings.items():
            losses = {n: None if w is None else w.loss for n, w in r.by_length.items()}
            _curve(axes[2], losses, pe, "-o", ms=3, label=pe)
            last = [y for y in losses.values() if y is not None][-1]
            for n in (n for n, y in losses.items() if y is None):
                axes[2].annotate("✗", (n, last), color=_PE_COLORS.get(pe), ha="center")
        axes[2].axvline(ctx, color="k", ls=":", lw=1)
        axes[2].set(title=f"Tang validation loss, trained at L={ctx}", xlabel="evaluation length", ylabel="loss (nats)")
    for i, ax in enumerate(axes):  # every panel's x axis doubles: distances, lags, lengths
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=6 if i == 1 else 7, ncol=2 if i == 1 else 1)
    fig.tight_layout()
    return save_figure(fig, path)
