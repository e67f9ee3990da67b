"""The kernels' llama.cpp blocks (engine/fast/kernels/ggml.cpp): each type dequantizes to exactly what gguf-py's
``gguf.quants.dequantize`` (the reference transformers loads GGUF files with) gives; a product over blocks of up to
4 rows of x on AVX-512 (fused: blocks decoded in registers) multiplies exactly those weights, its sums within
float32's rounding bound of the exact product; every other product is the float32 kernels' product on the
dequantized weights, bit for bit, in both instruction sets, at every row count's tile shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf extra is not installed (pip install 'genprobe[gguf]')")

from genprobe.engine.fast import kernels  # noqa: E402
from genprobe.model.gguf_blocks import BLOCK_TYPES, dequantize_blocks  # noqa: E402

# Where each type keeps its float16 scale (and minimum) inside a block (ggml-common.h).
HALF_OFFSETS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
# float16 bit patterns: the largest finite, the smallest subnormal (both signs), zero, one, the smallest normal
HARD_HALVES = np.array([0x7BFF, 0x0001, 0x8001, 0x0000, 0x3C00, 0xFBFF, 0x0400, 0x8000], dtype=np.uint16)


@pytest.fixture(scope="module")
def ops():
    status = kernels.load()
    if not status.available:
        pytest.skip(f"genprobe's kernels cannot run here: {status.reason}")
    yield torch.ops.genprobe
    torch.ops.genprobe.small_linear_isa(True)


def hard_blocks(type_name: str, rows: int, blocks_per_row: int, seed: int = 0) -> torch.Tensor:
    """uint8 (rows, blocks, bytes): random integers and sub-block scales, the float16 fields cycling through the
    extreme values, and the last row all zero bytes."""
    _, _, nbytes = BLOCK_TYPES[type_name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, blocks_per_row, nbytes), dtype=np.uint8)
    count = rows * blocks_per_row
    for i, at in enumerate(HALF_OFFSETS[type_name]):
        halves = np.roll(HARD_HALVES, 3 * i)[np.arange(count) % len(HARD_HALVES)].reshape(rows, blocks_per_row)
        raw[..., at : at + 2] = halves.view(np.uint8).reshape(rows, blocks_per_row, 2)
    raw[-1] = 0
    return torch.from_numpy(raw)


def per_block(type_name: str) -> int:
    return BLOCK_TYPES[type_name][1]


@pytest.mark.parametrize("type_name", list(BLOCK_TYPES))
def test_every_type_dequantizes_to_gguf_pys_values_bit_for_bit(ops, type_name):
    ggml_type = BLOCK_TYPES[type_name][0]
    w = hard_blocks(type_name, rows=7, blocks_per_row=3)
    reference = dequantize_blocks(w, ggml_type)  # gguf.quants.dequantize
    assert torch.isfinite(reference).all() and (reference[-1] == 0).all()
    for avx512 in (True, False):  # the 16-lane forms and the plain ones
        ops.small_linear_isa(avx512)
        got = ops.ggml_dequantize(w, ggml_type)
        assert got.shape == reference.shape and torch.equal(got, reference), (type_name, avx512)


FUSED_MAX_ROWS = 4  # linear.cpp kFusedMaxRows


def fused(m: int, avx512: bool) -> bool:
    return (
        avx512
        and m <= FUSED_MAX_ROWS
        and kernels.status().available
        and torch.backends.cpu.get_cpu_capability() == "AVX512"
    )


def assert_within_float32_bound(got, x, dense, bias, where):
    """|got - exact| <= (K + 2) u sum |x_k w_k| (+ |b|): float32 summation in any order, u = 2^-24 (Higham's gamma)."""
    exact = x.double() @ dense.double().T + bias.double()
    scale = x.double().abs() @ dense.double().abs().T + bias.double().abs()
    bound = (x.shape[1] + 2) * 2.0**-24 * scale * 1.01
    assert ((got.double() - exact).abs() <= bound).all(), where


@pytest.mark.parametrize("type_name", list(BLOCK_TYPES))
def test_products_over_blocks_multiply_the_dequantized_weights(ops, type_name):
    """Every tile shape (1, 2, 3, 4, 5, 6-16 rows; packed panels from 17) and the one-row weight stream (N x K from
    96K weights), odd output counts (a ragged last tile), an odd block count, a bias, both instruction sets. The fused
    rows: one-hot rows of x read back each weight bit for bit (the decoding is exact), random rows are within the
    rounding bound of the float64 product (a skipped block or a wrong scale is far outside it)."""
    ggml_type = BLOCK_TYPES[type_name][0]
    K = per_block(type_name) * (2 if per_block(type_name) == 256 else 5)
    torch.manual_seed(0)
    for n in (37, 96 * 1024 // K + 5):  # cache-resident tiles; the streamed rows (and two threads)
        w = hard_blocks(type_name, rows=n, blocks_per_row=K // per_block(type_name), seed=n)
        dense = dequantize_blocks(w, ggml_type)
        bias = torch.randn(n)
        for avx512 in (True, False):
            ops.small_linear_isa(avx512)
            for m in (1, 2, 3, 4, 5, 9, 17, 20):
                x = torch.randn(m, K)
                got = ops.small_linear_ggml(x, w, bias, ggml_type)
                where = (type_name, n, avx512, m)
                if not fused(m, avx512):
                    assert torch.equal(got, ops.small_linear(x, dense, bias)), where
                    continue
                assert_within_float32_bound(got, x, dense, bias, where)
                columns = torch.randint(0, K, (m,))
                one_hot = torch.nn.functional.one_hot(columns, K).float()
                picked = ops.small_linear_ggml(one_hot, w, None, ggml_type)
                assert torch.equal(picked, dense[:, columns].T), where


def test_a_fused_product_is_not_the_dequantized_float32_product_bit_for_bit_but_close(ops):
    """Guard of the test above: on AVX-512 the fused path really runs (its sums are in another order, so some
    output differs in its last bits from the float32 kernels'), and it is within the rounding bound."""
    if not fused(1, True):
        pytest.skip("the fused products need AVX-512")
    ops.small_linear_isa(True)
    w = hard_blocks("Q4_0", rows=256, blocks_per_row=18, seed=3)
    dense = dequantize_blocks(w, 2)
    x = torch.randn(1, 576)
    got = ops.small_linear_ggml(x, w, None, 2)
    assert not torch.equal(got, ops.small_linear(x, dense, None))
    assert_within_float32_bound(got, x, dense, torch.zeros(256), "Q4_0 fused")


def test_weights_the_kernels_cannot_read_are_refused(ops):
    w = hard_blocks("Q4_0", rows=4, blocks_per_row=2)
    with pytest.raises(RuntimeError, match="ggml type 1 is not one the kernels read"):
        ops.small_linear_ggml(torch.randn(1, 64), w, None, 1)
    with pytest.raises(RuntimeError, match=r"ggml type 12 is uint8 \(out_features, blocks, 144\)"):
        ops.small_linear_ggml(torch.randn(1, 64), w, None, 12)
    with pytest.raises(RuntimeError, match="does not match 64 in_features"):
        ops.small_linear_ggml(torch.randn(1, 32), w, None, 2)
