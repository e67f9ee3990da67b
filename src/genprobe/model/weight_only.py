"""Weight-only narrow weights: linear layers that store their weights in bfloat16 or int8 and compute in float32.

bfloat16 halves the bytes a decode step reads and widens exactly; int8 quarters them, each output row quantized
symmetrically (``W[n] ≈ scale[n] * q[n]``, q in [-127, 127], as gpt-fast's and torchao's int8 weight-only), the product
computed in float32 on the integers and scaled after. Either is an opt-in approximation: a converted model is a
*different model* with its own cache verdict. The tied embedding/output layer stays float32 unless ``narrow_output``
(then the head gets its own narrow copy; the lookup keeps float32). A GGUF file's ``Q8_0`` blocks (a scale per 32
weights) are held as they are by :meth:`WeightOnlyLinear.from_blocks`: exactly the dequantized weights. The why and
the measurements: docs/llama-fast.md.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Collection, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

#: Weight dtypes a genprobe model's linear layers can be stored in (float32: the model as trained).
WEIGHT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8}

#: The narrow ones: what the compiled path's kernels read and widen as they load.
NARROW_WEIGHT_DTYPES = (torch.bfloat16, torch.int8)

#: The integer range of an int8 weight: symmetric, so -128 is never used and a row's sign flip stays in range.
INT8_MAX = 127

#: Weights per scale of an int8 weight stored in blocks (llama.cpp's ``QK8_0``).
INT8_BLOCK = 32


class WeightOnlyLinear(nn.Module):
    """``nn.Linear`` whose weight is stored narrow (bfloat16, or int8 with a scale per output) and widened on use."""

    def __init__(self, linear: nn.Linear, weight_dtype: torch.dtype):
        super().__init__()
        w = linear.weight.detach()
        weight, scale = quantize_int8(w) if weight_dtype == torch.int8 else (w.to(weight_dtype), None)
        self._hold(weight, scale, linear.bias)

    @classmethod
    def from_blocks(cls, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None) -> WeightOnlyLinear:
        """A layer holding int8 ``q`` (N, K) with a float32 scale per 32 weights of a row, ``scales`` (N, K / 32)."""
        n, k = q.shape
        if q.dtype != torch.int8 or k % INT8_BLOCK or scales.shape != (n, k // INT8_BLOCK):
            raise ValueError(
                f"int8 blocks need an int8 (N, K) weight with K a multiple of {INT8_BLOCK} and (N, K / {INT8_BLOCK}) "
                f"scales; got {q.dtype} {tuple(q.shape)} and {tuple(scales.shape)}"
            )
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._hold(q.contiguous(), scales.float().contiguous(), bias)
        return layer

    def _hold(self, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None) -> None:
        self.out_features, self.in_features = weight.shape
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.scale = None if scale is None else nn.Parameter(scale, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @property
    def blocked(self) -> bool:
        """True for int8 with a scale per block of 32 weights (a GGUF Q8_0 tensor), False for a scale per row."""
        return self.scale is not None and self.scale.dim() == 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x W^T + b`` with ``W`` widened to ``x``'s dtype (the compiled path reads it narrow, see kernels)."""
        if self.scale is None:
            return F.linear(x, self.weight.to(x.dtype), self.bias)
        if self.blocked:  # the weight itself, exactly (q * d is exact in float32); the kernels read the blocks
            return F.linear(x, self._block_weight(x.dtype), self.bias)
        # The scale after the product, per output: the product reads only the integers (widened exactly).
        y = F.linear(x, self.weight.to(x.dtype)) * self.scale
        return y if self.bias is None else y + self.bias

    def _block_weight(self, dtype: torch.dtype) -> torch.Tensor:
        n, k = self.weight.shape
        assert self.scale is not None
        blocks = self.weight.to(dtype).view(n, k // INT8_BLOCK, INT8_BLOCK)
        return (blocks * self.scale.to(dtype).unsqueeze(-1)).view(n, k)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight this layer stands for (``scale[n] * q[n]`` for int8, per block for int8 blocks)."""
        if self.blocked:
            return self._block_weight(torch.float32)
        w = self.weight.float()
        return w if self.scale is None else w * self.scale[:, None]

    def extra_repr(self) -> str:
        """What ``print(model)`` shows for the layer."""
        kind = f"{self.weight.dtype}, blocks of {INT8_BLOCK}" if self.blocked else f"{self.weight.dtype}"
        return f"in_features={self.in_features}, out_features={self.out_features}, weight_dtype={kind}"


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale): ``w`` (N, K) float as int8 rows ``q`` in [-127, 127] and float32 ``scale`` (N,), ``w ≈ scale * q``.

    ``scale[n] = max|w[n]| / 127`` and ``q = round(w / scale)`` (half to even), so each row's largest weight is
    exact (±127) and every other is within half a step. An all-zero row gets scale 1 (its q is 0 either way).
    Refuses non-finite weights: an inf has no finite scale, and a NaN no integer.
    """
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"int8 quantization takes a 2-D float weight, got {tuple(w.shape)} {w.dtype}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("int8 quantization needs finite weights; this one holds inf or NaN")
    w = w.float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def weight_dtype_of(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (a key of :data:`WEIGHT_DTYPES`); a clear error for anything else."""
    if name not in WEIGHT_DTYPES:
        raise ValueError(f"weight dtype must be one of {sorted(WEIGHT_DTYPES)}, got {name!r}")
    return WEIGHT_DTYPES[name]


def with_weight_dtype(model: nn.Module, weight_dtype: torch.dtype, narrow_output: bool = False) -> nn.Module:
    """A copy of ``model`` whose linear layers store their weights in ``weight_dtype``.

    The output layer tied to the embedding stays float32 unless ``narrow_output`` (then it gets its own narrow copy
    and the embedding keeps the float32 one). ``float32`` returns ``model`` itself. The copy shares nothing with
    ``model``: edits to one are not seen by the other. Only float32 models are converted (the widening target is
    the activations' dtype).
    """
    if weight_dtype == torch.float32:
        if narrow_output:
            raise ValueError("a narrow output layer needs a narrow weight dtype (bfloat16 or int8), got float32")
        return model
    if weight_dtype not in NARROW_WEIGHT_DTYPES:
        raise ValueError(f"weight-only storage supports bfloat16 and int8, got {weight_dtype}")
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float32}:
        held = sorted(map(str, dtypes))
        raise ValueError(f"weight-only {weight_dtype} converts a float32 model; this one holds {held}")
    out = copy.deepcopy(model)
    every = {name for name, _ in out.named_parameters(remove_duplicate=False)}
    for parent, child_name, child, _ in linears_named_in(out, every, narrow_output):
        setattr(parent, child_name, WeightOnlyLinear(child, weight_dtype))
    return out


def _tied_ids(model: nn.Module) -> set[int]:
    """ids of the parameters used by more than one module (the embedding tied to the output layer)."""
    uses = Counter(id(p) for module in model.modules() for p in module.parameters(recurse=False))
    return {i for i, n in uses.items() if n > 1}


def linears_named_in(
    model: nn.Module, names: Collection[str], narrow_output: bool
) -> Iterator[tuple[nn.Module, str, nn.Linear, str]]:
    """``(parent, child name, layer, weight name)`` of each ``nn.Linear`` whose weight is named in ``names``; the
    output layer tied to the embedding only with ``narrow_output`` (its lookup keeps the float32 table)."""
    by_id = {id(p): n for n, p in model.named_parameters(remove_duplicate=False) if n in names}
    tied = _tied_ids(model)
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not nn.Linear or id(child.weight) not in by_id:
                continue
            if id(child.weight) in tied and not narrow_output:
                continue
            yield parent, child_name, child, by_id[id(child.weight)]
