"""genprobe's small-M linear kernels (engine/fast/kernels/linear.cpp) against torch's F.linear, and the graph pass.

The kernels are opt-in native code: on a machine without a C++ compiler, without AVX2/FMA (or not x86-64), or
with ``GENPROBE_KERNELS=0``, these tests are SKIPPED with the reason :func:`kernels.load` gives (the compiled
decode path then keeps Inductor's own code). A build that fails on a machine that has a compiler and AVX2 is a
defect, not a skip: it fails here with the compiler's message.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from genprobe.engine.fast import kernels
from genprobe.engine.fast.kernels.inductor_pass import rewrite_small_linears


@pytest.fixture(scope="module")
def small_linear():
    reason = kernels.build.unsupported_reason()
    if reason is not None:
        pytest.skip(f"genprobe's kernels cannot run here: {reason}")
    status = kernels.load()
    assert status.available, f"genprobe's kernels did not build: {status.reason}"
    return torch.ops.genprobe.small_linear


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if b is None else b.double())


def _assert_close(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    """Within float32 rounding of a K-term sum: relative to sum |x||w| (+|b|), not to the result."""
    ref = _reference(x, w, b)
    scale = F.linear(x.double().abs(), w.double().abs()) + (0 if b is None else b.double().abs())
    err = (y.double() - ref).abs()
    assert y.dtype == torch.float32 and y.shape == ref.shape
    assert bool((err <= 1e-5 * scale + 1e-6).all()), float((err / (scale + 1e-6)).max())


# Rows: the one-row GEMV (1: eight rows of W at a time, or from 96K weights one row at a time, 1202 x 128 and
# 163 x 605 with its 8-wide steps after the 64-wide ones and a masked tail), the dot-product tiles (AVX2: 2-5,
# AVX-512: 2-16, in 4-row passes with 1-3-row tails: 6, 7, 13, 15), the packed outer products (AVX2: 6+, AVX-512:
# 17+, with row tails). Columns: tile tails (8-column, 4-column, 16-column panels). Depth: the masked k tail (< 8,
# not a multiple of 8) and more than one 256-deep packed block (257, 600).
SHAPES = [
    (1, 1, 1),
    (1, 13, 7),
    (1, 384, 128),
    (1, 1202, 128),
    (1, 163, 605),
    (2, 9, 9),
    (3, 5, 8),
    (4, 17, 130),
    (5, 129, 33),
    (6, 16, 1),
    (7, 31, 257),
    (13, 1202, 128),
    (16, 384, 128),
    (33, 50, 600),
    (64, 129, 64),
    (8, 32, 16),  # one whole AVX-512 block: 8 rows by a 32-column panel
    (15, 47, 9),  # a 7-row tail and a panel of 15 columns (one full vector of 16 and none of the second)
    (17, 1202, 513),  # a 1-row tail, a 18-column last panel, three 256-deep blocks
]


def _cpu_has_avx512() -> bool:
    return torch.backends.cpu.get_cpu_capability() == "AVX512"


@pytest.fixture(params=["avx2", "avx512"])
def isa(request, small_linear):
    """Run a test on the AVX2 panels and again on the AVX-512 ones (the latter where the CPU has them)."""
    if request.param == "avx512" and not _cpu_has_avx512():
        pytest.skip("this CPU has no AVX-512: only the AVX2 kernels can run here")
    chosen = torch.ops.genprobe.small_linear_isa(request.param == "avx512")
    assert chosen == request.param
    yield request.param
    torch.ops.genprobe.small_linear_isa(True)


def test_avx512_is_chosen_where_the_cpu_has_it(small_linear):
    assert torch.ops.genprobe.small_linear_isa(True) == ("avx512" if _cpu_has_avx512() else "avx2")


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_small_linear_equals_linear_on_ragged_shapes(small_linear, isa, M, N, K, with_bias):
    torch.manual_seed(M * 1000 + N + K)
    x, w = torch.randn(M, K), torch.randn(N, K)
    b = torch.randn(N) if with_bias else None
    _assert_close(small_linear(x, w, b), x, w, b)


def test_non_contiguous_and_batched_inputs(small_linear):
    torch.manual_seed(0)
    w, b = torch.randn(24, 40), torch.randn(24)
    x_t = torch.randn(40, 7).t()  # (7, 40), not contiguous
    assert not x_t.is_contiguous()
    _assert_close(small_linear(x_t, w, b), x_t, w, b)
    x3 = torch.randn(3, 2, 40)  # leading dimensions kept, as F.linear keeps them
    y3 = small_linear(x3, w, b)
    assert y3.shape == (3, 2, 24)
    _assert_close(y3.reshape(6, 24), x3.reshape(6, 40), w, b)
    w_t = torch.randn(40, 24).t()  # a transposed weight is copied to rows first
    _assert_close(small_linear(x3.reshape(6, 40), w_t, None), x3.reshape(6, 40), w_t, None)


@pytest.mark.parametrize("M", [1, 3, 8])
def test_infinities_and_nans_propagate_like_linear(small_linear, isa, M):
    """Non-finite inputs give the same non-finite outputs (inf stays inf, inf - inf and nan give nan)."""
    torch.manual_seed(M)
    K, N = 19, 21
    x, w, b = torch.randn(M, K), torch.randn(N, K), torch.randn(N)
    x[0, 3] = float("inf")
    w[5, 3] = 0.0  # inf * 0 = nan in that column
    w[6, :] = w[6, :].abs()
    x[-1, 10] = float("nan")
    if M > 1:
        x[1, :] = 1.0
        w[7, 0], w[7, 1] = float("inf"), float("-inf")  # +inf - inf: nan
    y, ref = small_linear(x, w, b), F.linear(x, w, b)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    assert torch.equal(torch.isinf(y), torch.isinf(ref)) and torch.equal(y[torch.isinf(y)], ref[torch.isinf(ref)])
    finite = torch.isfinite(ref)
    assert bool(finite.any()) == (M > 1)  # one row holds an inf in every column of a nonzero weight
    if M > 1:
        assert float((y[finite] - ref[finite]).abs().max()) < 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 1202, 128), (3, 1202, 128), (16, 384, 128), (64, 1202, 128), (7, 2304, 300)])
def test_thread_split_covers_every_column_once(small_linear, isa, M, N, K, dtype):
    """Shapes above the kernels' threading thresholds: each output's sum is the same with 1 or 2 threads, bit for bit
    (threads split columns, never a sum), so a column lost or written twice at a split boundary shows. (The one-row
    threshold is in bytes: a bfloat16 weight splits from twice the elements.)"""
    torch.manual_seed(N)
    x, w, b = torch.randn(M, K), torch.randn(N, K).to(dtype), torch.randn(N)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = small_linear(x, w, b)
        torch.set_num_threads(2)
        two = small_linear(x, w, b)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    _assert_close(two, x, w.float(), b)


def test_bad_inputs_name_the_problem(small_linear):
    with pytest.raises(RuntimeError, match="x float32 and weight float32, bfloat16 or int8, got Double and Double"):
        small_linear(torch.randn(2, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64), None)
    with pytest.raises(RuntimeError, match="weight float32, bfloat16 or int8, got Float and Half"):
        small_linear(torch.randn(2, 4), torch.randn(3, 4, dtype=torch.float16), None)
    with pytest.raises(RuntimeError, match="int8, got Float and Byte"):  # uint8: zero-extended would be wrong
        small_linear(torch.randn(2, 4), torch.zeros(3, 4, dtype=torch.uint8), None)
    with pytest.raises(RuntimeError, match="does not match weight"):
        small_linear(torch.randn(2, 5), torch.randn(3, 4), None)
    with pytest.raises(RuntimeError, match="bias must be float32 of 3 elements"):
        small_linear(torch.randn(2, 4), torch.randn(3, 4), torch.randn(4))


GLOBAL_SCOPE_PROBE = """
import ctypes, torch
scope = ctypes.CDLL(None)  # dlopen(NULL): what a library loaded later resolves its symbols against
before = hasattr(scope, "SGEMM")  # a BLAS symbol libtorch_cpu.so exports (its MKL)
from genprobe.engine.fast import kernels
assert kernels.load().available, kernels.load().reason
print(before, hasattr(scope, "SGEMM"), hasattr(scope, "aoti_torch_cpu_small_linear"))
"""


def test_loading_the_kernels_puts_only_the_shim_in_the_global_scope(small_linear):
    """Compiled programs find ``aoti_torch_cpu_small_linear`` globally, but torch's own exports must stay local:
    promoted with the kernels' library, libtorch_cpu's BLAS/oneDNN symbols took the place of CTranslate2's own
    (it then generated garbage in the same process). A fresh interpreter, so that nothing else has loaded them."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", GLOBAL_SCOPE_PROBE], capture_output=True, text=True, check=True)
    before, after, shim = out.stdout.split()
    if before == "True":
        pytest.skip("this torch build already exports its BLAS symbols globally: nothing to protect")
    assert (after, shim) == ("False", "True")


# ---- weight-only bfloat16 weights ----------------------------------------------------------------------------
def _bf16_with_hard_values(N: int, K: int) -> torch.Tensor:
    """Random bfloat16 weights plus the values whose widening is easy to get wrong: the sign bit, zero and minus
    zero, the smallest subnormal, the largest finite bfloat16, and ties (many equal weights)."""
    w = torch.randn(N, K).to(torch.bfloat16)
    specials = torch.tensor([-0.0, 0.0, 9.2e-41, -3.3895e38, 3.3895e38, 1.0, 1.0, -1.0], dtype=torch.bfloat16)
    flat = w.view(-1)
    flat[: min(flat.numel(), specials.numel())] = specials[: flat.numel()]
    return w


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_bfloat16_weights_are_widened_exactly(small_linear, isa, M, N, K):
    """A bfloat16 weight gives bit for bit what the same values in float32 give (same tiles, same sums): the
    widening is exact, every k tail is read (a lane dropped or read past the row changes a bit)."""
    torch.manual_seed(M * 1000 + N + K)
    x, w, b = torch.randn(M, K) * 1e-3, _bf16_with_hard_values(N, K), torch.randn(N)
    y = small_linear(x, w, b)
    assert torch.equal(y, small_linear(x, w.float(), b))
    _assert_close(y, x, w.float(), b)


@pytest.mark.parametrize("M", [1, 3, 8])
def test_bfloat16_infinities_and_nans_propagate_like_linear(small_linear, isa, M):
    torch.manual_seed(M)
    K, N = 37, 21
    x, w = torch.randn(M, K), torch.randn(N, K)
    w[2, 5], w[3, 36], w[4, 0] = float("inf"), float("-inf"), float("nan")  # k 36: in the masked tail
    w = w.to(torch.bfloat16)
    y, ref = small_linear(x, w, None), F.linear(x, w.float())
    assert torch.equal(torch.isnan(y), torch.isnan(ref)) and bool(torch.isnan(y).any())
    assert torch.equal(torch.isinf(y), torch.isinf(ref)) and torch.equal(y[torch.isinf(y)], ref[torch.isinf(ref)])
    assert bool(torch.isinf(y).any())


def _int8_with_hard_values(N: int, K: int) -> torch.Tensor:
    """Random int8 weights plus the extremes whose sign extension is easy to get wrong (-128, -127, 127, -1, 0)."""
    q = torch.randint(-128, 128, (N, K), dtype=torch.int8)
    specials = torch.tensor([-128, 127, -127, -1, 0, 1, -128, 127], dtype=torch.int8)
    flat = q.view(-1)
    flat[: min(flat.numel(), specials.numel())] = specials[: flat.numel()]
    if K % 8:  # an extreme in the masked k tail of the first row
        q[0, -1] = -128
    return q


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_int8_weights_are_widened_exactly(small_linear, isa, M, N, K):
    """An int8 weight gives bit for bit what the same integers in float32 give: sign-extended, not zero-extended
    (-128 read as 128 would change the sum), and every k tail is read."""
    torch.manual_seed(M * 1000 + N + K + 1)
    x, q, b = torch.randn(M, K), _int8_with_hard_values(N, K), torch.randn(N)
    y = small_linear(x, q, b)
    assert torch.equal(y, small_linear(x, q.float(), b))
    _assert_close(y, x, q.float(), b)


# Shapes whose depth is whole 32-weight blocks: the one-row tile and row stream (1 x 384 x 128, 1 x 1202 x 128, and
# 1 x 163 x 608 whose 8-wide steps follow the 64-wide ones), the dot tiles, the packed panels (a 256-deep block
# ending inside a block of scales: 33 x 50 x 608), ragged columns.
BLOCK_SHAPES = [
    (1, 13, 32),
    (1, 384, 128),
    (1, 1202, 128),
    (1, 163, 608),
    (2, 9, 96),
    (4, 17, 160),
    (5, 129, 32),
    (7, 31, 288),
    (16, 384, 128),
    (33, 50, 608),
    (64, 129, 64),
]


def _blocks_with_hard_scales(N: int, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 blocks with the extremes, and scales that are float16 values (as a GGUF file holds), zero and negative."""
    q = _int8_with_hard_values(N, K)
    d = (torch.rand(N, K // 32) * 0.02).half().float()
    d.view(-1)[:3] = torch.tensor([0.0, -0.0125, 6.1e-5]).half().float()[: d.numel()]
    return q, d


@pytest.mark.parametrize("M,N,K", BLOCK_SHAPES)
def test_int8_blocks_give_bit_for_bit_their_float32_weights(small_linear, isa, M, N, K):
    """int8 in blocks of 32 with a scale each (a GGUF Q8_0 tensor): every weight widened and scaled by its own
    block's scale — bit for bit the product with the float32 matrix the blocks stand for (q * d is exact)."""
    torch.manual_seed(M * 1000 + N + K + 2)
    x, b = torch.randn(M, K), torch.randn(N)
    q, d = _blocks_with_hard_scales(N, K)
    w = (q.float().view(N, K // 32, 32) * d[:, :, None]).view(N, K)
    y = small_linear(x, q, b, d)
    assert torch.equal(y, small_linear(x, w, b))
    assert not torch.equal(y, small_linear(x, q, b))  # the scales are applied (a kernel that drops them fails)
    _assert_close(y, x, w, b)


def test_int8_blocks_refuse_what_is_not_blocks(small_linear):
    q, d = torch.zeros(3, 64, dtype=torch.int8), torch.ones(3, 2)
    with pytest.raises(RuntimeError, match="block scales go with an int8 weight, got Float"):
        small_linear(torch.randn(2, 64), q.float(), None, d)
    with pytest.raises(RuntimeError, match="needs in_features a multiple of 32, got 40"):
        small_linear(torch.randn(2, 40), q[:, :40], None, d)
    with pytest.raises(RuntimeError, match=r"block scales must be float32 of shape \(3, 2\), got Float \[3, 1\]"):
        small_linear(torch.randn(2, 64), q, None, d[:, :1])


# ---- the Inductor pass -------------------------------------------------------------------------------------
def _aten_graph(rows: int | None, dtype: torch.dtype = torch.float32) -> tuple[torch.fx.GraphModule, tuple]:
    """F.linear with and without a bias, traced to the ATen ops a post-grad graph holds (addmm/mm of a permute).

    The weights are graph inputs, as in a ``while_loop`` body; returns the graph and example inputs.
    """
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    def two_layers(x, w1, b1, w2):
        return F.linear(torch.tanh(F.linear(x, w1, b1)), w2)

    torch.manual_seed(0)
    args = tuple(torch.randn(*s, dtype=dtype) for s in ((rows or 9, 8), (12, 8), (12,), (5, 12)))
    mode = "symbolic" if rows is None else "real"
    return make_fx(two_layers, decomposition_table=core_aten_decompositions(), tracing_mode=mode)(*args), args


def _count(gm: torch.fx.GraphModule, target) -> int:
    return sum(1 for n in gm.graph.nodes if n.target == target)


def test_pass_replaces_small_row_products_and_keeps_the_values(small_linear):
    gm, args = _aten_graph(rows=3)
    expected = gm(*args)
    assert _count(gm, torch.ops.aten.addmm.default) + _count(gm, torch.ops.aten.mm.default) == 2
    assert rewrite_small_linears(gm.graph, max_rows=4) == 2
    gm.recompile()
    assert _count(gm, torch.ops.genprobe.small_linear.default) == 2
    assert _count(gm, torch.ops.aten.addmm.default) + _count(gm, torch.ops.aten.mm.default) == 0
    assert float((gm(*args) - expected).abs().max()) < 1e-5


def test_pass_hands_bfloat16_weights_to_the_kernels_unwidened(small_linear):
    """``F.linear(x, W.float())`` of a bfloat16 ``W``: the kernel gets ``W`` itself, no float32 copy is left."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    def layer(x, w, b):
        return F.linear(x, w.to(torch.float32), b)

    torch.manual_seed(0)
    args = (torch.randn(3, 40), torch.randn(24, 40).to(torch.bfloat16), torch.randn(24))
    gm = make_fx(layer, decomposition_table=select_decomp_table())(*args)  # what Inductor lowers with
    expected = gm(*args)
    assert _count(gm, torch.ops.prims.convert_element_type.default) == 1
    assert rewrite_small_linears(gm.graph, max_rows=4) == 1
    gm.recompile()
    (call,) = [n for n in gm.graph.nodes if n.target == torch.ops.genprobe.small_linear.default]
    assert call.args[1].meta["val"].dtype == torch.bfloat16
    assert _count(gm, torch.ops.prims.convert_element_type.default) == 0  # the widened copy is gone
    assert float((gm(*args) - expected).abs().max()) < 1e-5


def test_pass_hands_int8_weights_to_the_kernels_at_any_row_count(small_linear):
    """``F.linear(x, q.float()) * scale + b`` of an int8 ``q`` (genprobe.model.weight_only): the kernel gets ``q``
    itself even for a symbolic row count above ``max_rows`` (Inductor's lowering would write a float32 copy of
    the weight on every call); the scale and the bias stay in the graph."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    def layer(x, q, scale, b):
        return F.linear(x, q.to(torch.float32)) * scale + b

    torch.manual_seed(0)
    args = (torch.randn(9, 40), torch.randint(-127, 128, (24, 40), dtype=torch.int8), torch.rand(24), torch.randn(24))
    gm = make_fx(layer, decomposition_table=select_decomp_table(), tracing_mode="symbolic")(*args)
    expected = gm(*args)
    assert rewrite_small_linears(gm.graph, max_rows=4) == 1
    gm.recompile()
    (call,) = [n for n in gm.graph.nodes if n.target == torch.ops.genprobe.small_linear.default]
    assert call.args[1].meta["val"].dtype == torch.int8
    assert _count(gm, torch.ops.prims.convert_element_type.default) == 0  # the widened copy is gone
    # Sums of integers up to 127 reach the hundreds: float32 rounding, relative to that size.
    torch.testing.assert_close(gm(*args), expected, rtol=1e-5, atol=1e-4)


def test_pass_hands_int8_blocks_to_the_kernels_with_their_scales(small_linear):
    """A layer of int8 blocks (WeightOnlyLinear.from_blocks) as Inductor sees it: the kernel gets ``q`` and the scales,
    no float32 copy of the weight is left, and the values are bit for bit the float32 weights' product."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    from genprobe.model.weight_only import WeightOnlyLinear

    torch.manual_seed(0)
    q, d = _blocks_with_hard_scales(24, 64)
    bias = torch.randn(24)
    layer = WeightOnlyLinear.from_blocks(q, d, bias)

    def forward(x, q, d, b):
        return torch.func.functional_call(layer, {"weight": q, "scale": d, "bias": b}, (x,))

    args = (torch.randn(9, 64), q, d, bias)
    gm = make_fx(forward, decomposition_table=select_decomp_table(), tracing_mode="symbolic")(*args)
    expected = small_linear(args[0], layer.dequantized(), bias)
    assert rewrite_small_linears(gm.graph, max_rows=4) == 1
    gm.recompile()
    (call,) = [n for n in gm.graph.nodes if n.target == torch.ops.genprobe.small_linear.default]
    assert [a.meta["val"].dtype for a in call.args[1:]] == [torch.int8, torch.float32, torch.float32]
    assert _count(gm, torch.ops.prims.convert_element_type.default) == 0
    assert _count(gm, torch.ops.aten.mul.Tensor) == 0  # the scaled float32 weight is gone with it
    assert torch.equal(gm(*args), expected)


def test_pass_leaves_products_it_cannot_take(small_linear):
    assert rewrite_small_linears(_aten_graph(rows=5)[0].graph, max_rows=4) == 0  # more rows than allowed
    assert rewrite_small_linears(_aten_graph(rows=3, dtype=torch.float64)[0].graph, max_rows=4) == 0  # not float32
    assert rewrite_small_linears(_aten_graph(rows=None)[0].graph, max_rows=4) == 0  # a symbolic row count...
    assert rewrite_small_linears(_aten_graph(rows=None)[0].graph, max_rows=None) == 2  # ...unless any is allowed
