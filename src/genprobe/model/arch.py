"""Where the MLPs are: one :class:`MLPSite` per layer, for our GPT and the common ``transformers`` families.

The loop repair edits the MLP down-projection W, thought of as the (d_model × d_ff) map from unit activations to the
residual stream (column ``c`` is what unit ``c`` writes). ``nn.Linear`` stores it as (d_model, d_ff), GPT-2's
``Conv1D`` as (d_ff, d_model), so every read/write of columns goes through :func:`get_columns` / :func:`set_columns`.
Layer lists are looked for at :data:`LAYER_PATHS` (GPT-2, Llama/Qwen2/Mistral/Gemma/Phi-3, GPT-NeoX, Gemma 3's
multimodal wrapper), down-projections under :data:`DOWN_NAMES`; anything else (a mixture-of-experts block, an unknown
projection) is refused with :class:`UnsupportedArchitectureError` naming what is missing. Gemma's normalised MLP
output is still W's output space, so edits and ablations stay consistent.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import reduce
from typing import Any, cast

import torch
import torch.nn as nn

from .errors import UnsupportedArchitectureError
from .gpt import GPT

LAYER_PATHS = (
    "transformer.h",
    "model.layers",
    "gpt_neox.layers",
    "model.language_model.layers",
    "language_model.layers",
)
DOWN_NAMES = ("down_proj", "c_proj", "dense_4h_to_h")


@dataclass
class MLPSite:
    """One layer's MLP: the module whose output joins the residual, its down-projection and block."""

    layer: int
    mlp: nn.Module
    down: nn.Module
    block: nn.Module
    weight_name: str  # state-dict name of the down-projection weight
    layout: str  # "linear": weight (d_model, d_ff); "conv1d": weight (d_ff, d_model)

    @property
    def weight(self) -> torch.Tensor:
        """The down-projection's weight parameter (``nn.Linear`` and ``Conv1D`` both name it ``weight``)."""
        return cast(torch.Tensor, self.down.weight)  # nn.Module attributes are typed Tensor | Module

    @property
    def d_model(self) -> int:
        w = self.weight
        return w.shape[0] if self.layout == "linear" else w.shape[1]

    @property
    def d_ff(self) -> int:
        w = self.weight
        return w.shape[1] if self.layout == "linear" else w.shape[0]


def unwrap(model: Any) -> nn.Module:
    """The ``nn.Module`` behind a model or a runner/adapter wrapping one (``.hf_model``, ``.model``, ``.module``,
    ``.hf``): a genprobe GPT, a transformers model, a loaded :class:`genprobe.model.load.Model`."""
    if isinstance(model, nn.Module):
        return model
    for attr in ("hf_model", "model", "module", "hf"):
        inner = getattr(model, attr, None)
        if isinstance(inner, nn.Module):
            return inner
    raise TypeError(f"cannot find an nn.Module inside {type(model).__name__}")


def _down_projection(i: int, block: nn.Module, arch: str) -> tuple[nn.Module, nn.Module, str, str]:
    mlp = getattr(block, "mlp", None)
    if mlp is None:
        moe = [n for n in ("block_sparse_moe", "moe", "experts", "feed_forward") if hasattr(block, n)]
        found = f" (found {moe[0]}: mixture-of-experts MLPs have no single down-projection to edit)" if moe else ""
        raise UnsupportedArchitectureError(f"{arch} layer {i} has no dense 'mlp' module{found}")
    for dname in DOWN_NAMES:
        down = getattr(mlp, dname, None)
        if down is None:
            continue
        layout = "linear" if isinstance(down, nn.Linear) else "conv1d" if type(down).__name__ == "Conv1D" else None
        if layout is None:
            raise UnsupportedArchitectureError(
                f"{arch} layer {i}: down-projection {dname} is a {type(down).__name__}, not an nn.Linear or Conv1D"
            )
        return mlp, down, dname, layout
    moe_note = (
        " — it is a mixture-of-experts block, whose experts have no single down-projection to edit"
        if any(hasattr(mlp, n) for n in ("experts", "gate", "router")) and not hasattr(mlp, "up_proj")
        else ""
    )
    raise UnsupportedArchitectureError(
        f"{arch} layer {i}: MLP {type(mlp).__name__} has no down-projection (looked for {', '.join(DOWN_NAMES)})"
        f"{moe_note}"
    )


def mlp_sites(model: Any) -> list[MLPSite]:
    """One site per layer, in order; :class:`UnsupportedArchitectureError` names what is missing."""
    m = unwrap(model)
    found = [(m.h, "h")] if isinstance(m, GPT) else []
    for path in LAYER_PATHS:
        layers = reduce(lambda obj, part: getattr(obj, part, None), path.split("."), cast(Any, m))
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            found.append((layers, path))
    if not found:
        raise UnsupportedArchitectureError(
            f"unsupported architecture {type(m).__name__}: no decoder layer list found (looked for "
            f"{', '.join(LAYER_PATHS)}); loop repair supports our GPT, GPT-2, Llama, Qwen2, Mistral, Gemma 2/3, "
            "Phi-3 and GPT-NeoX"
        )
    blocks, prefix = found[0]
    sites = []
    for i, block in enumerate(blocks):
        mlp, down, dname, layout = _down_projection(i, block, type(m).__name__)
        sites.append(MLPSite(i, mlp, down, block, f"{prefix}.{i}.mlp.{dname}.weight", layout))
    return sites


def get_columns(site: MLPSite, cols: torch.Tensor) -> torch.Tensor:
    """Columns ``cols`` of W (d_model × d_ff) as rows of a (k, d_model) tensor (a copy)."""
    w = site.weight
    return (w[:, cols].T if site.layout == "linear" else w[cols, :]).detach().clone()


@torch.no_grad()
def set_columns(site: MLPSite, cols: torch.Tensor, values: torch.Tensor) -> None:
    """Write (k, d_model) ``values`` into columns ``cols`` of W, in place."""
    w = site.weight
    values = values.to(dtype=w.dtype, device=w.device)
    if site.layout == "linear":
        w[:, cols] = values.T
    else:
        w[cols, :] = values


def all_columns(site: MLPSite) -> torch.Tensor:
    """W's columns as a (d_ff, d_model) float tensor (row c = what unit c writes)."""
    w = site.weight.detach().float()
    return w.T if site.layout == "linear" else w


def state_sha256(model: Any) -> str:
    """sha256 of the full state dict: sorted names, each with dtype, shape and raw bytes."""
    m = unwrap(model)
    h = hashlib.sha256()
    for name, t in sorted(m.state_dict().items()):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        flat = t.detach().cpu().contiguous().reshape(-1)
        h.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return h.hexdigest()


def count_parameters(model: Any) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in unwrap(model).parameters())
