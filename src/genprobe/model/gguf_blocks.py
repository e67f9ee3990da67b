"""Linear layers that keep a GGUF file's quantized weight blocks as they are and compute in float32.

:class:`BlockLinear` holds a matrix's rows of llama.cpp blocks (``ggml/src/ggml-common.h``) unchanged, as uint8
``(out_features, blocks per row, bytes per block)``, and stands for exactly the float32 weight
``gguf.quants.dequantize`` gives (what ``transformers`` loads the file as): the dequantized model in 4.5-8.5 bits a
weight. Eager, the op dequantizes with ``gguf`` on every call (slow, the reference); compiled, the kernels' Inductor
pass hands it to ``genprobe::small_linear_ggml`` (the float32 kernels on dequantized rows, bit for bit). Activations
stay float32, unlike llama.cpp's (see docs/llama-fast.md).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

#: ggml type name -> (ggml type id, weights per block, bytes per block): the types the kernels read (ggml-common.h).
BLOCK_TYPES: dict[str, tuple[int, int, int]] = {
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
}


def dequantize_blocks(weight: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """The float32 (N, K) matrix that ``weight`` (uint8 (N, blocks, bytes)) in ggml type ``ggml_type`` stands for,
    by ``gguf.quants.dequantize`` (the reference: what transformers loads a GGUF file with)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = weight.detach().cpu().contiguous().numpy().reshape(weight.shape[0], -1)
    with np.errstate(invalid="ignore", over="ignore"):  # a hostile file's inf/NaN scales give NaN weights, as there
        out = dequantize(raw, GGMLQuantizationType(ggml_type))
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


def reference_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ggml_type: int) -> torch.Tensor:
    """``x W^T + b`` with ``W`` the dequantized blocks: the eager reference."""
    return F.linear(x, dequantize_blocks(weight, ggml_type).to(x.dtype), bias)


#: A product ``(x, weight, bias, ggml_type) -> x W^T + b`` that block layers call directly, set only inside
#: :func:`block_products` (the fast path's eager steps while its compiled programs build: the kernels, or the
#: reference until they are loaded).
BlockProduct = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", int], torch.Tensor]
_products: ContextVar[BlockProduct | None] = ContextVar("genprobe_block_products", default=None)


@contextlib.contextmanager
def block_products(product: BlockProduct) -> Iterator[None]:
    """Block layers call ``product`` directly in this thread inside the block, not through their op: a custom op's
    eager call writes torch.fx's global tracing annotations, which a build exporting the model in another thread
    is using at that moment."""
    token = _products.set(product)
    try:
        yield
    finally:
        _products.reset(token)


@torch.library.custom_op("genprobe_gguf::block_linear", mutates_args=())
def block_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ggml_type: int) -> torch.Tensor:
    """``x W^T + b`` with ``W`` the dequantized blocks (eager reference; the compiled path runs the kernels)."""
    return reference_product(x, weight, bias, ggml_type)


@block_linear.register_fake
def _block_linear_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ggml_type: int) -> Any:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


class BlockLinear(nn.Module):
    """``nn.Linear`` whose weight is held as a GGUF file's blocks of one ggml type (see the module docstring)."""

    def __init__(self, blocks: torch.Tensor, type_name: str, bias: torch.Tensor | None = None):
        super().__init__()
        if type_name not in BLOCK_TYPES:
            raise ValueError(f"ggml type {type_name} is not one genprobe keeps as blocks ({', '.join(BLOCK_TYPES)})")
        ggml_type, per_block, nbytes = BLOCK_TYPES[type_name]
        if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] % nbytes:
            raise ValueError(
                f"{type_name} rows are uint8 and a multiple of {nbytes} bytes; got {blocks.dtype} {tuple(blocks.shape)}"
            )
        n = blocks.shape[0]
        # (N, blocks, bytes): the shape names the type's block size, so compiled programs of two types never share
        self.weight = nn.Parameter(blocks.reshape(n, -1, nbytes).contiguous(), requires_grad=False)
        self.ggml_type, self.type_name = ggml_type, type_name
        self.in_features, self.out_features = self.weight.shape[1] * per_block, n
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone().float(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x W^T + b`` (one op: the compiled path's pass finds it and hands it to the kernels)."""
        product = _products.get()
        if product is not None:  # see block_products
            return product(x, self.weight, self.bias, self.ggml_type)
        out: torch.Tensor = torch.ops.genprobe_gguf.block_linear(x, self.weight, self.bias, self.ggml_type)
        return out

    def dequantized(self) -> torch.Tensor:
        """The float32 weight (out_features, in_features) these blocks stand for."""
        return dequantize_blocks(self.weight, self.ggml_type)

    def extra_repr(self) -> str:
        """What ``print(model)`` shows for the layer."""
        return f"in_features={self.in_features}, out_features={self.out_features}, blocks={self.type_name}"


def block_layer(type_name: str, rows: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Module:
    """The layer that holds ``rows`` (uint8, a GGUF matrix's blocks) of ``type_name``: ``Q8_0`` as int8 values and
    float32 scales (:meth:`~genprobe.model.weight_only.WeightOnlyLinear.from_blocks`, the int8 kernels' layout),
    every other type as a :class:`BlockLinear`."""
    if type_name != "Q8_0":
        return BlockLinear(rows, type_name, bias)
    from .weight_only import WeightOnlyLinear

    _, _, nbytes = BLOCK_TYPES["Q8_0"]  # block_q8_0: a float16 scale, then 32 int8 values
    if rows.dim() != 2 or rows.shape[1] % nbytes:
        raise ValueError(f"Q8_0 rows are a multiple of {nbytes} bytes; got {tuple(rows.shape)}")
    packed = rows.reshape(rows.shape[0], -1, nbytes)
    scales = packed[..., :2].contiguous().view(torch.float16)[..., 0].float()
    q = packed[..., 2:].contiguous().view(torch.int8).reshape(rows.shape[0], -1)
    return WeightOnlyLinear.from_blocks(q, scales, bias)


def with_gguf_blocks(
    model: nn.Module, blocks: dict[str, tuple[str, torch.Tensor]], narrow_output: bool = False, copy_model: bool = True
) -> nn.Module:
    """A copy of ``model`` whose linear layers named in ``blocks`` (parameter name -> (ggml type name, uint8 rows in
    the model's row order)) hold those blocks (:func:`block_layer`).

    Each layer's float weight must equal the blocks' dequantization exactly (it was dequantized from them): a
    mismatch means the name or the row order is wrong, and is refused. The output layer tied to the embedding takes
    the embedding's blocks only with ``narrow_output`` (the embedding's lookup keeps its float32 copy).
    ``copy_model=False`` replaces the layers in ``model`` itself (the loader's own fresh model: no second copy).
    """
    from .weight_only import linears_named_in

    out = copy.deepcopy(model) if copy_model else model
    for parent, child_name, child, name in linears_named_in(out, blocks, narrow_output):
        type_name, rows = blocks[name]
        layer = block_layer(type_name, rows, child.bias)
        weight = layer.dequantized()  # type: ignore[operator]  # BlockLinear and WeightOnlyLinear both have it
        if not torch.allclose(weight, child.weight.detach().float(), rtol=0, atol=0, equal_nan=True):
            raise ValueError(f"{name}: the {type_name} blocks do not give the layer's float weights")
        setattr(parent, child_name, layer)
    return out
