"""Per-step L2 norms of the Q, K and V projection gradients of every layer: gradient dilution, a cause of attention
failures with long-range dependencies, shows as one projection's gradient vanishing or exploding while the others train.

:class:`QKVGradTracker` is :func:`genprobe.model.train.train`'s ``on_backward`` hook (after ``backward``, before
clipping: the raw gradients); its ``save(dir)`` writes ``qkv_grad_norms.csv`` / ``.json`` / ``.png``. Layouts: a fused
``c_attn`` — ours (``nn.Linear``, weight (3C, C): row thirds) or GPT-2's ``Conv1D`` (weight (C, 3C): column thirds) —
and separate ``q_proj``/``k_proj``/``v_proj`` (any sizes: grouped-query attention works). One norm per projection:
``sqrt(|dW|² + |db|²)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch

from .._io import atomic_write_json, atomic_write_text, json_safe


def _norm(*grads: torch.Tensor | None) -> float | None:
    """``sqrt(|dW|² + |db|²)`` over the gradients present; None when none is."""
    squares = [float(g.detach().double().pow(2).sum()) for g in grads if g is not None]
    return math.sqrt(sum(squares)) if squares else None


def _grads(m: torch.nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The weight's and the bias's gradient of a Linear or Conv1D (None where absent)."""
    bias = getattr(m, "bias", None)
    return cast(torch.Tensor, m.weight).grad, None if bias is None else bias.grad


@dataclass
class QKVGradTracker:
    """Callable ``tracker(step, model)`` recording Q/K/V gradient norms per layer; see module docstring. ``rows``:
    one dict per (step, layer), ``{step, layer, q, k, v}`` (None where a gradient was absent)."""

    layers: list[str] = field(default_factory=list)  # the attention modules' names, in layer order
    rows: list[dict] = field(default_factory=list)

    def __call__(self, step: int, model: torch.nn.Module) -> None:
        """Record the current gradients of ``model`` as training step ``step``."""
        projections = ("q_proj", "k_proj", "v_proj")
        mods = [
            (name, m)
            for name, m in model.named_modules()
            if isinstance(getattr(m, "c_attn", None), torch.nn.Module)
            and hasattr(m.c_attn, "weight")
            or all(isinstance(getattr(m, p, None), torch.nn.Module) for p in projections)
        ]
        if not mods:
            raise ValueError(
                f"{type(model).__name__} has no attention module with a fused c_attn or q_proj/k_proj/v_proj"
            )
        self.layers = [n for n, _ in mods]
        for layer, (_, m) in enumerate(mods):
            if hasattr(m, "c_attn"):
                gw, gb = _grads(fused := m.get_submodule("c_attn"))
                dim = 1 if hasattr(fused, "nf") or type(fused).__name__ == "Conv1D" else 0  # Conv1D's (in, 3C): columns
                w3 = (None,) * 3 if gw is None else gw.chunk(3, dim=dim)
                b3 = (None,) * 3 if gb is None else gb.chunk(3)
                q, k, v = (_norm(w, b) for w, b in zip(w3, b3, strict=True))
            else:
                q, k, v = (_norm(*_grads(getattr(m, p))) for p in projections)
            self.rows.append({"step": int(step), "layer": layer, "q": q, "k": k, "v": v})

    def save(self, out_dir: str | Path) -> dict:
        """Write ``qkv_grad_norms.csv``, ``.json`` and ``.png`` into ``out_dir``; return their paths + counts."""
        if not self.rows:
            raise ValueError("no gradients recorded: pass the tracker as on_backward to train() first")
        out = Path(out_dir)
        paths = {ext: out / f"qkv_grad_norms.{ext}" for ext in ("csv", "json", "png")}
        cells = [",".join("" if v is None else str(v) for v in r.values()) for r in self.rows]  # step, layer, q, k, v
        atomic_write_text(paths["csv"], "\n".join(["step,layer,q,k,v", *cells]) + "\n")
        atomic_write_json(paths["json"], json_safe(self))
        self.plot(paths["png"])
        counts = {k + "s": len({r[k] for r in self.rows}) for k in ("step", "layer")}
        return {k: str(v) for k, v in paths.items()} | counts | {"rows": len(self.rows)}

    def plot(self, path: str | Path) -> Path:
        """Log-scale gradient norm vs step: one panel per projection, one line per layer."""
        from .plots import plt, save_figure

        layers = sorted({r["layer"] for r in self.rows})
        fig, axes = plt.subplots(1, 3, figsize=(11, 3.3), sharey=True)
        for ax, proj in zip(axes, ("q", "k", "v"), strict=True):
            for layer in layers:
                pts = [(r["step"], r[proj]) for r in self.rows if r["layer"] == layer and r[proj]]
                if pts:
                    ax.plot(*zip(*pts, strict=True), label=f"layer {layer}", lw=1)
            ax.set(title=f"{proj.upper()} projection", xlabel="step", yscale="log")
        axes[0].set_ylabel("gradient L2 norm")
        axes[-1].legend(fontsize=7)
        return save_figure(fig, path)
