"""Weight-only narrow weights: linear layers that store their weights in bfloat16 and compute in float32.

A decode step at batch 1 of a large model is bound by reading its weights (57.8M parameters: 231 MB of
float32 per token). Storing the weight matrices of the linear layers in bfloat16 halves those bytes; each
weight is widened to float32 (exactly: bfloat16 is the top half of a float32) where it is used, so the
activations, the attention, the cache and every sum stay float32. This is an approximation of the float32
model, never the default: a converted model is a *different model* (its weights are rounded to 8 significant
bits), with its own cache verdict (``genprobe verify-cache MODEL --weight-dtype bfloat16`` compares its cache
against its own full recomputation) and its own figures beside the float32 ones.

The token embedding (tied to the output layer) and the layer norms stay float32: they are a small part of the
bytes, and the embedding is also the output layer, whose rounding would move every logit directly.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

#: Weight dtypes a genprobe model's linear layers can be stored in (float32: the model as trained).
WEIGHT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class WeightOnlyLinear(nn.Module):
    """``nn.Linear`` whose weight is stored in a narrower float dtype and widened to the input's dtype on use."""

    def __init__(self, linear: nn.Linear, weight_dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach().to(weight_dtype), requires_grad=False)
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x W^T + b`` with ``W`` widened to ``x``'s dtype (the compiled path reads it narrow, see kernels)."""
        return F.linear(x, self.weight.to(x.dtype), self.bias)

    def extra_repr(self) -> str:
        """What ``print(model)`` shows for the layer."""
        return f"in_features={self.in_features}, out_features={self.out_features}, weight_dtype={self.weight.dtype}"


def weight_dtype_of(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (a key of :data:`WEIGHT_DTYPES`); a clear error for anything else."""
    if name not in WEIGHT_DTYPES:
        raise ValueError(f"weight dtype must be one of {sorted(WEIGHT_DTYPES)}, got {name!r}")
    return WEIGHT_DTYPES[name]


def with_weight_dtype(model: nn.Module, weight_dtype: torch.dtype) -> nn.Module:
    """A copy of ``model`` whose linear layers store their weights in ``weight_dtype`` (the output layer excepted).

    ``float32`` returns ``model`` itself. The copy shares nothing with ``model``: edits to one are not seen by
    the other. Only float32 models are converted (the widening target is the activations' dtype).
    """
    if weight_dtype == torch.float32:
        return model
    if weight_dtype != torch.bfloat16:
        raise ValueError(f"weight-only storage supports bfloat16, got {weight_dtype}")
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float32}:
        raise ValueError(f"weight-only bfloat16 converts a float32 model; this one holds {sorted(map(str, dtypes))}")
    out = copy.deepcopy(model)
    tied = {id(p) for p in _tied_weights(out)}
    for parent in list(out.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and id(child.weight) not in tied:
                setattr(parent, name, WeightOnlyLinear(child, weight_dtype))
    return out


def _tied_weights(model: nn.Module) -> list[nn.Parameter]:
    """Parameters used by more than one module (the embedding tied to the output layer)."""
    seen: dict[int, int] = {}
    params: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            seen[id(p)] = seen.get(id(p), 0) + 1
            params[id(p)] = p
    return [params[i] for i, n in seen.items() if n > 1]
