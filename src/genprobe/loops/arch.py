"""Where the MLPs are: one :class:`MLPSite` per layer for our GPT, GPT-2 and Llama/Qwen-style models.

The loop repair edits the MLP down-projection W, which we always think of as the (d_model × d_ff)
map from unit activations to the residual stream: column ``c`` is what unit ``c`` writes. Storage
differs — ``nn.Linear`` keeps ``weight`` as (d_model, d_ff), GPT-2's ``Conv1D`` as (d_ff, d_model) —
so every read/write of columns goes through :func:`get_columns` / :func:`set_columns`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ..model.gpt import GPT


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
    def d_model(self) -> int:
        w = self.down.weight
        return w.shape[0] if self.layout == "linear" else w.shape[1]

    @property
    def d_ff(self) -> int:
        w = self.down.weight
        return w.shape[1] if self.layout == "linear" else w.shape[0]


def unwrap(model: Any) -> nn.Module:
    """The ``nn.Module`` behind a model or a runner/adapter that wraps one (``.model`` / ``.hf_model``)."""
    if isinstance(model, nn.Module):
        return model
    for attr in ("hf_model", "model", "module"):
        inner = getattr(model, attr, None)
        if isinstance(inner, nn.Module):
            return inner
    raise TypeError(f"cannot find an nn.Module inside {type(model).__name__}")


def _blocks(m: nn.Module) -> tuple[nn.ModuleList, str]:
    if isinstance(m, GPT):
        return m.h, "h"
    tr = getattr(m, "transformer", None)
    if tr is not None and hasattr(tr, "h"):  # GPT-2 family
        return tr.h, "transformer.h"
    inner = getattr(m, "model", None)
    if inner is not None and hasattr(inner, "layers"):  # Llama, Qwen, Mistral, ...
        return inner.layers, "model.layers"
    if hasattr(m, "layers"):
        return m.layers, "layers"
    raise ValueError(
        f"unsupported architecture {type(m).__name__}: expected our GPT, a GPT-2 model (transformer.h[i].mlp.c_proj) "
        "or a Llama/Qwen-style model (model.layers[i].mlp.down_proj)"
    )


def mlp_sites(model: Any) -> list[MLPSite]:
    """One site per layer, in order."""
    m = unwrap(model)
    blocks, prefix = _blocks(m)
    sites = []
    for i, block in enumerate(blocks):
        mlp = block.mlp
        if hasattr(mlp, "down_proj"):
            down, dname = mlp.down_proj, "down_proj"
        elif hasattr(mlp, "c_proj"):
            down, dname = mlp.c_proj, "c_proj"
        else:
            raise ValueError(f"layer {i}: MLP {type(mlp).__name__} has neither down_proj nor c_proj")
        layout = "linear" if isinstance(down, nn.Linear) else "conv1d" if type(down).__name__ == "Conv1D" else None
        if layout is None:
            raise ValueError(f"layer {i}: unsupported down-projection type {type(down).__name__}")
        sites.append(MLPSite(i, mlp, down, block, f"{prefix}.{i}.mlp.{dname}.weight", layout))
    return sites


def get_columns(site: MLPSite, cols: torch.Tensor) -> torch.Tensor:
    """Columns ``cols`` of W (d_model × d_ff) as rows of a (k, d_model) tensor (a copy)."""
    w = site.down.weight
    return (w[:, cols].T if site.layout == "linear" else w[cols, :]).detach().clone()


@torch.no_grad()
def set_columns(site: MLPSite, cols: torch.Tensor, values: torch.Tensor) -> None:
    """Write (k, d_model) ``values`` into columns ``cols`` of W, in place."""
    w = site.down.weight
    values = values.to(dtype=w.dtype, device=w.device)
    if site.layout == "linear":
        w[:, cols] = values.T
    else:
        w[cols, :] = values


def all_columns(site: MLPSite) -> torch.Tensor:
    """W's columns as a (d_ff, d_model) float tensor (row c = what unit c writes)."""
    w = site.down.weight.detach().float()
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


def forward_logits(model: Any, ids: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Uncached logits (B, T, V) for our GPT, a runner (``.full``), or a ``transformers`` causal LM."""
    if isinstance(model, GPT):
        return model(ids, attention_mask=valid)
    if hasattr(model, "full") and not isinstance(model, nn.Module):
        v = valid if valid is not None else torch.ones_like(ids, dtype=torch.bool)
        return model.full(ids, v)
    out = model(input_ids=ids, attention_mask=None if valid is None else valid.long())
    return out.logits if hasattr(out, "logits") else out[0]
