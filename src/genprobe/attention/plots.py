"""Figures for attention diagnostics (matplotlib Agg; every file written atomically)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .._io import atomic_write  # noqa: E402
from .longrange import N_CONTENT  # noqa: E402


def save_figure(fig, path: str | Path) -> Path:
    """Save ``fig`` atomically (format from the suffix) and close it."""
    path = Path(path)
    fmt = path.suffix.lstrip(".") or "png"
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=110, bbox_inches="tight"))
    plt.close(fig)
    return path


def _cjk_font() -> None:
    # Tang characters as tick labels: use a CJK-capable font when one is installed, else boxes (harmless).
    from matplotlib import font_manager

    for name in ("Noto Sans CJK SC", "Noto Sans CJK JP", "WenQuanYi Zen Hei", "AR PL UMing CN", "SimHei"):
        if any(f.name == name for f in font_manager.fontManager.ttflist):
            plt.rcParams["font.family"] = [name, "DejaVu Sans"]
            return


def head_heatmaps(capture, out_dir: str | Path, labels: list[str] | None = None) -> list[Path]:
    """One PNG per (layer, head): ``attn_L{l}_H{h}.png``, queries as rows, keys as columns."""
    _cjk_font()
    out_dir = Path(out_dir)
    paths = []
    T = capture.probs.shape[-1]
    for layer in range(capture.n_layer):
        for head in range(capture.n_head):
            fig, ax = plt.subplots(figsize=(4.5, 4))
            im = ax.imshow(capture.probs[layer, head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer}, head {head}")
            ax.set_xlabel("key position")
            ax.set_ylabel("query position")
            if labels is not None and T <= 48:
                ax.set_xticks(range(T), labels, fontsize=6)
                ax.set_yticks(range(T), labels, fontsize=6)
            fig.colorbar(im, ax=ax, fraction=0.046)
            paths.append(save_figure(fig, out_dir / f"attn_L{layer}_H{head}.png"))
    return paths


def entropy_plot(report, path: str | Path) -> Path:
    """Per-layer attention entropy: each head's mean (dots), layer mean (line), uniform ln(N) reference."""
    if hasattr(report, "to_dict"):
        report = report.to_dict()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    layers = [row["layer"] for row in report["layers"]]
    for h in report["heads"]:
        ax.scatter(h["layer"], h["entropy"], s=18, color="tab:blue", alpha=0.6)
    ax.plot(layers, [row["entropy"] for row in report["layers"]], "-o", color="tab:blue", label="layer mean")
    ax.plot(
        layers,
        [row["max_entropy"] for row in report["layers"]],
        "--",
        color="gray",
        label="uniform: mean ln(visible keys)",
    )
    ax.set_xticks(layers)
    ax.set_xlabel("layer")
    ax.set_ylabel("attention entropy (nats)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(f"attention entropy per layer (T={report['seq_len']})")
    return save_figure(fig, path)


_PE_COLORS = {"learned": "tab:blue", "rope": "tab:orange", "alibi": "tab:green", "none": "tab:gray"}


def _present(points: dict[int, float | None]) -> list[tuple[int, float]]:
    return [(x, y) for x, y in points.items() if y is not None]


def _passkey_panel(ax, syn) -> None:
    L = syn.context
    for pe, r in syn.passkey.items():
        # Encodings often tie at 1.0: distinct markers/sizes keep every line visible.
        mk = {"learned": ("o", 7), "rope": ("s", 5), "alibi": ("^", 3)}.get(pe, ("x", 4))
        ax.plot(
            *zip(*_present(r.accuracy), strict=True),
            "-",
            marker=mk[0],
            ms=mk[1],
            color=_PE_COLORS.get(pe),
            label=pe,
            alpha=0.8,
        )
    ax.axvline(L - 1.5, color="k", ls=":", lw=1)
    ax.text(L - 1.5, 0.02, " training context", fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set(title="passkey (content suffices)", xlabel="distance value→query", ylabel="accuracy", ylim=(-0.03, 1.03))
    ax.legend(fontsize=7)


def _lag_panel(ax, syn) -> None:
    styles = ["-", "--", ":"]
    for pe, r in syn.lag.items():
        for i, (n, accs) in enumerate(r.accuracy.items()):
            pts = _present(accs)
            if pts:
                ax.plot(
                    *zip(*pts, strict=True),
                    styles[i % 3],
                    marker="o",
                    ms=3,
                    color=_PE_COLORS.get(pe),
                    label=f"{pe}, len {n}",
                )
    ax.axhline(1 / N_CONTENT, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set(
        title=f"token k back (position only), trained at len {syn.context}",
        xlabel="lag k",
        ylabel="accuracy",
        ylim=(-0.03, 1.03),
    )
    ax.legend(fontsize=6, ncol=2)


def _corpus_panel(ax, corpus) -> None:
    ctx = corpus.config.context
    for pe, r in corpus.encodings.items():
        pts = [(n, w.loss) for n, w in r.by_length.items() if w is not None]
        ax.plot(*zip(*pts, strict=True), "-o", ms=3, color=_PE_COLORS.get(pe), label=pe)
        for n in (n for n, w in r.by_length.items() if w is None):
            ax.annotate("✗", (n, pts[-1][1]), color=_PE_COLORS.get(pe), ha="center")
    ax.axvline(ctx, color="k", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set(title=f"Tang validation loss, trained at L={ctx}", xlabel="evaluation length", ylabel="loss (nats)")
    ax.legend(fontsize=7)


def longrange_plot(res, path: str | Path) -> Path:
    """Three panels of a :class:`~genprobe.attention.longrange.LongRangeResult`: passkey accuracy vs distance,
    lag accuracy vs lag (per evaluation length), validation loss vs length (refused lengths marked ✗)."""
    has_corpus = res.corpus is not None
    fig, axes = plt.subplots(1, 3 if has_corpus else 2, figsize=(15 if has_corpus else 10, 3.8))
    _passkey_panel(axes[0], res.synthetic)
    _lag_panel(axes[1], res.synthetic)
    if has_corpus:
        _corpus_panel(axes[2], res.corpus)
    fig.tight_layout()
    return save_figure(fig, path)
