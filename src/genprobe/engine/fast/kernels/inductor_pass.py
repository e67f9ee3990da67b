"""The Inductor graph pass that hands the small matrix products of a compiled decode graph to ``small_linear``.

After AOT dispatch a linear layer is ``addmm(bias, x, permute(W, [1, 0]))`` (``mm`` without a bias). When ``x``
has a static number of rows no larger than ``max_rows`` (or any number, symbolic included, when ``max_rows`` is
None: a small model's prompt) and everything is float32 on the CPU, the pass replaces the product by
``genprobe.small_linear(x, W, bias)``: the same maths, summed in another order by the kernels of ``linear.cpp``.
A weight stored in bfloat16 or int8 (:mod:`genprobe.model.weight_only`) reaches the product as
``permute(convert_element_type(W, float32))``; the kernels take ``W`` itself and widen it as they read it, so
the step reads a half or a quarter of the bytes and no float32 copy of the weight is made. An int8 weight in blocks
of 32 with a scale each (a GGUF file's Q8_0 tensor) reaches it as ``reshape(mul(reshape(convert(q)), unsqueeze(d)))``;
the kernels take ``q`` and ``d`` (``block_scales``) and apply each scale as they widen. Such a product is
handed over at any row count: the alternative, Inductor's lowering, would write that float32 copy on every call.
Other products (more rows, other dtypes, a non-contiguous weight) keep Inductor's lowering. The pass runs as Inductor's
``post_grad_custom_pre_pass``, before its own passes, on the graph and on every subgraph (a ``while_loop`` body).
:func:`inductor_config` also names the op's C shim, so that the generated C++ calls the kernel directly.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from ....model import gguf_blocks as _registers_block_linear  # noqa: F401  (defines genprobe_gguf.block_linear)
from ....model.weight_only import INT8_BLOCK, NARROW_WEIGHT_DTYPES
from .build import SOURCES

aten = torch.ops.aten

#: The C declaration Inductor's C++ wrapper calls (``aoti_torch_<device>_<op name>``, defined in ``linear.cpp``).
SHIM_DECLARATION = (
    "AOTITorchError aoti_torch_cpu_small_linear(AtenTensorHandle x, AtenTensorHandle weight, "
    "AtenTensorHandle* bias, AtenTensorHandle* block_scales, AtenTensorHandle* ret0)"
)
SHIM_GGML_DECLARATION = (
    "AOTITorchError aoti_torch_cpu_small_linear_ggml(AtenTensorHandle x, AtenTensorHandle weight, "
    "AtenTensorHandle* bias, int64_t ggml_type, AtenTensorHandle* ret0)"
)
_SHIM_CONFIG_KEY = "aot_inductor.custom_ops_to_c_shims"
_BLOCK_LINEAR = torch.ops.genprobe_gguf.block_linear.default


def _float32_matrix(node: Any) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if isinstance(val, torch.Tensor) and val.dim() == 2 and val.dtype == torch.float32:
        return val
    return None


def _widened_narrow(node: Any) -> torch.fx.Node | None:
    """``W`` when ``node`` is ``convert_element_type(W, float32)`` of a contiguous bfloat16/int8 matrix, else None."""
    if not isinstance(node, torch.fx.Node) or node.target != torch.ops.prims.convert_element_type.default:
        return None
    source, dtype = node.args
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if dtype != torch.float32 or not isinstance(val, torch.Tensor) or val.dtype not in NARROW_WEIGHT_DTYPES:
        return None
    return source if val.dim() == 2 and val.is_contiguous() else None  # type: ignore[return-value]


_RESHAPES = (aten.reshape.default, aten.view.default)


def _val(node: Any) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _widened_blocks(node: Any) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """``(q, d)`` when ``node`` is an int8 weight in blocks widened (see :class:`WeightOnlyLinear`), else None.

    The pattern: ``reshape(mul(reshape(convert(q, float32), [N, K/32, 32]), unsqueeze(d, -1)), [N, K])`` with ``q``
    a contiguous int8 (N, K) matrix and ``d`` contiguous float32 (N, K / 32).
    """
    if not isinstance(node, torch.fx.Node) or node.target not in _RESHAPES:
        return None
    mul = node.args[0]
    if not isinstance(mul, torch.fx.Node) or mul.target != aten.mul.Tensor:
        return None
    for blocks, scales in (mul.args, mul.args[::-1]):
        if not (isinstance(blocks, torch.fx.Node) and blocks.target in _RESHAPES):
            continue
        q = _widened_narrow(blocks.args[0])
        if q is None or not isinstance(scales, torch.fx.Node) or scales.target != aten.unsqueeze.default:
            continue
        if scales.args[1] not in (-1, 2):
            continue
        d = scales.args[0]
        qv, dv = _val(q), _val(d)
        if qv is None or dv is None or qv.dtype != torch.int8 or dv.dtype != torch.float32 or not dv.is_contiguous():
            continue
        n, k = qv.shape
        if k % INT8_BLOCK == 0 and tuple(dv.shape) == (n, k // INT8_BLOCK):
            return q, d  # type: ignore[return-value]
    return None


def _weight_of(wt: Any, graph: torch.fx.Graph, before: torch.fx.Node) -> tuple[torch.fx.Node, Any] | None:
    """``(W, block scales or None)``: a node holding the (N, K) contiguous weight whose transpose is ``wt``
    (inserted if needed), with the int8 blocks' scales where it is one; None when it is none of these.

    ``wt`` is ``permute(W, [1, 0])`` of the layer's weight (``W`` float32, or a narrow weight widened, see
    :func:`_widened_narrow` and :func:`_widened_blocks`), or, in a frozen graph, the constant that folding made
    of that permute (a (K, N) view with strides (1, K)), whose transpose is a free view.
    """
    if isinstance(wt, torch.fx.Node) and wt.target == aten.permute.default and list(wt.args[1]) == [1, 0]:  # type: ignore[arg-type]
        blocks = _widened_blocks(wt.args[0])
        if blocks is not None:
            return blocks
        narrow = _widened_narrow(wt.args[0])
        if narrow is not None:
            return narrow, None
        w = _float32_matrix(wt.args[0])
        return (wt.args[0], None) if w is not None and w.is_contiguous() else None  # type: ignore[return-value]
    val = _float32_matrix(wt)
    if val is None or not val.t().is_contiguous():
        return None
    with graph.inserting_before(before):
        weight = graph.call_function(aten.permute.default, (wt, [1, 0]))
    weight.meta["val"] = val.t()
    return weight, None


def _small_rows(x: Any, max_rows: int | None) -> bool:
    """True when ``x`` is a float32 CPU matrix with at most ``max_rows`` rows (static), or any rows when None."""
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 2 or val.dtype != torch.float32 or val.device.type != "cpu":
        return False
    rows = val.shape[0]
    return max_rows is None or (isinstance(rows, int) and rows <= max_rows)


def _plain_bias(bias: Any) -> bool:
    val = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.dim() == 1 and val.dtype == torch.float32


def _linear_operands(node: torch.fx.Node, max_rows: int | None) -> tuple[Any, ...] | None:
    """``small_linear``'s arguments (x, W, bias or None[, block scales]) when ``node`` is a small-row linear layer
    the kernels can take, else None.

    May insert a free transposing view of a frozen weight before ``node`` (see :func:`_weight_of`).
    """
    if node.target == aten.addmm.default:
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1 or len(node.args) != 3:
            return None
        bias, x, wt = node.args
        if not _plain_bias(bias):
            return None
    elif node.target == aten.mm.default:
        (x, wt), bias = node.args, None
    else:
        return None
    if not _small_rows(x, None if _is_widened_narrow(wt) else max_rows):
        return None
    found = _weight_of(wt, node.graph, node)
    if found is None:
        return None
    weight, scales = found
    return (x, weight, bias) if scales is None else (x, weight, bias, scales)


def _is_widened_narrow(wt: Any) -> bool:
    """True when ``wt`` is the transpose of a widened narrow weight (see _widened_narrow and _widened_blocks)."""
    if not (isinstance(wt, torch.fx.Node) and wt.target == aten.permute.default):
        return False
    return _widened_narrow(wt.args[0]) is not None or _widened_blocks(wt.args[0]) is not None


def _block_operands(node: torch.fx.Node) -> tuple[Any, ...] | None:
    """``small_linear_ggml``'s arguments when ``node`` is a layer holding a GGUF file's blocks
    (``genprobe_gguf.block_linear``, :mod:`genprobe.model.gguf_blocks`) on float32 CPU rows: at any row count, since
    the alternative, the op's eager reference, dequantizes the whole weight in Python on every call."""
    if node.target != _BLOCK_LINEAR:
        return None
    val = _val(node.args[0])
    if val is None or val.dtype != torch.float32 or val.device.type != "cpu":
        return None
    return tuple(node.args)


def rewrite_small_linears(graph: torch.fx.Graph, max_rows: int | None) -> int:
    """Replace every linear layer of ``graph`` with at most ``max_rows`` rows (None: any) by ``genprobe.small_linear``
    (a layer in GGUF blocks by ``genprobe.small_linear_ggml``, at any row count).

    Returns how many were replaced.
    """
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        op, operands = torch.ops.genprobe.small_linear_ggml.default, _block_operands(node)
        if operands is None:
            op, operands = torch.ops.genprobe.small_linear.default, _linear_operands(node, max_rows)
        if operands is None:
            continue
        with graph.inserting_before(node):
            new = graph.call_function(op, operands)
        new.meta.update(node.meta)  # same value ("val"), same stack trace for Inductor's provenance
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        replaced += 1
    if replaced:
        graph.eliminate_dead_code()  # the permutes (and widened weight copies) nobody reads any more
    return replaced


class SmallLinearPass(CustomGraphPass):
    """:func:`rewrite_small_linears` as an Inductor custom pass; its uuid keys Inductor's graph cache."""

    def __init__(self, max_rows: int | None):
        self.max_rows = max_rows

    def __call__(self, graph: torch.fx.Graph) -> None:
        rewrite_small_linears(graph, self.max_rows)

    def uuid(self) -> str:
        h = hashlib.sha256(Path(__file__).read_bytes() + b"".join(src.read_bytes() for src in SOURCES))
        h.update(str(self.max_rows).encode())
        return h.hexdigest()


def inductor_config(max_rows: int | None) -> dict[str, Any]:
    """Inductor settings that route products of up to ``max_rows`` rows (None: any) to the kernels (after load)."""
    _keep_graph_cache()
    return {
        "post_grad_custom_pre_pass": SmallLinearPass(max_rows),
        _SHIM_CONFIG_KEY: {
            torch.ops.genprobe.small_linear.default: [SHIM_DECLARATION],
            torch.ops.genprobe.small_linear_ggml.default: [SHIM_GGML_DECLARATION],
        },
    }


def _keep_graph_cache() -> None:
    """Leave the shim table out of Inductor's cache key (its keys are op objects that do not pickle).

    Without this every compile bypasses Inductor's FX graph cache. The table's content is fixed by this module,
    and the pass's uuid (which covers the kernel source) is part of the key, so nothing the graph depends on
    is lost. ``_cache_config_ignore_prefix`` is private: on a torch without it the cache is bypassed, nothing worse.
    """
    ignore = getattr(torch._inductor.config, "_cache_config_ignore_prefix", None)
    if isinstance(ignore, list) and _SHIM_CONFIG_KEY not in ignore:
        ignore.append(_SHIM_CONFIG_KEY)
