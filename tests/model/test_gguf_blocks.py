"""A GGUF file's 4/5/6-bit matrices kept as their blocks (``load(file, weight_dtype=int8)``): the file's bytes as they
are, in transformers' row order, standing for exactly the dequantized weights (same logits, bit for bit), the tensors
that stayed float32 named, and the compiled fast path's kernels reading the blocks."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

gguf = pytest.importorskip("gguf", reason="the gguf extra is not installed (pip install 'genprobe[gguf]')")

sys.path.insert(0, str(Path(__file__).parent))
from gguf_tiny import write_tiny_gguf  # noqa: E402

import genprobe  # noqa: E402
from genprobe.model.gguf_blocks import BlockLinear, with_gguf_blocks  # noqa: E402

PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
# the 32-weight types (the tiny model's rows, 64 and 96 weights, are too short for the 256-weight K-quants, whose
# kernels tests/engine/test_ggml_blocks.py checks on their own), every layer a different mix; one matrix left F32
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_0", "Q5_0", "Q4_1")
MIXED = {f"blk.{i}.{p}.weight": TYPES[(j + 3 * i) % len(TYPES)] for i in range(2) for j, p in enumerate(PROJECTIONS)}
MIXED["token_embd.weight"] = "Q4_0"
del MIXED["blk.1.ffn_up.weight"]
IDS = [5, 17, 40, 41, 99, 3, 250, 7]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("gguf-blocks") / "mixed.gguf"
    write_tiny_gguf(p, quant=MIXED)
    return p


def _logits(module: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return module(torch.tensor([IDS])).logits[0]


def test_quantized_matrices_are_held_as_the_files_blocks_and_the_rest_named(path):
    model = genprobe.load(path, weight_dtype=torch.int8, narrow_output=True)
    layers = model.module.model.layers
    down = layers[0].mlp.down_proj
    assert isinstance(down, BlockLinear) and down.type_name == MIXED["blk.0.ffn_down.weight"]
    (tensor,) = [t for t in gguf.GGUFReader(path).tensors if t.name == "blk.0.ffn_down.weight"]
    assert torch.equal(down.weight.reshape(down.out_features, -1), torch.from_numpy(np.array(tensor.data)))
    q_proj = layers[1].self_attn.q_proj  # attn_q's rows come back in transformers' order, the same rows
    (tensor,) = [t for t in gguf.GGUFReader(path).tensors if t.name == "blk.1.attn_q.weight"]
    rows = q_proj.weight.reshape(q_proj.out_features, -1).numpy()
    assert not np.array_equal(rows, np.asarray(tensor.data))
    assert sorted(map(bytes, rows)) == sorted(map(bytes, np.asarray(tensor.data)))
    assert type(layers[1].mlp.up_proj) is nn.Linear  # an F32 tensor stays float32, and the loader says so
    kept = model.meta["weight_blocks"]
    assert kept["float32_linear_layers"] == ["model.layers.1.mlp.up_proj"]
    assert sum(kept["blocks"].values()) == 14 and kept["blocks"]["Q4_0"] >= 2  # 13 matrices + the output layer
    assert isinstance(model.module.lm_head, BlockLinear)
    assert model.module.model.embed_tokens.weight.dtype == torch.float32  # the lookup stays float32


def test_the_block_model_gives_the_dequantized_models_logits_bit_for_bit(path):
    float_model = genprobe.load(path)
    blocks = genprobe.load(path, weight_dtype=torch.int8, narrow_output=True)
    assert torch.equal(_logits(blocks.module), _logits(float_model.module))
    kept = genprobe.load(path, weight_dtype=torch.int8)  # without narrow_output the tied head stays the embedding
    assert kept.module.lm_head.weight is kept.module.model.embed_tokens.weight


def test_blocks_that_do_not_give_the_layers_weights_are_refused(path):
    """The check behind the loader: blocks on the wrong layer or in the wrong row order never load silently."""
    from genprobe.model.gguf import gguf_blocks

    model = genprobe.load(path).module
    found = gguf_blocks(path, model, {"Q4_0", "Q4_1", "Q5_0", "Q5_1"})
    name = "model.layers.1.self_attn.q_proj.weight"
    kind, rows = found[name]
    with pytest.raises(ValueError, match=f"q_proj.weight: the {kind} blocks do not give the layer's float weights"):
        with_gguf_blocks(model, {name: (kind, rows.flip(0))})


def test_the_kernels_pass_hands_block_layers_to_the_block_kernel(path):
    """In a compiled graph a block layer is one op, which the kernels' Inductor pass replaces by
    ``genprobe::small_linear_ggml`` at any row count (the compiled model itself: tests/model/test_gguf_int8.py)."""
    from genprobe.engine.fast import kernels

    if not kernels.load().available:
        pytest.skip(f"genprobe's kernels cannot run here: {kernels.load().reason}")
    from genprobe.engine.fast.kernels.inductor_pass import rewrite_small_linears

    layer = genprobe.load(path, weight_dtype=torch.int8).module.model.layers[0].mlp.down_proj
    x = torch.randn(3, 7, layer.in_features)
    graph = torch.export.export(layer, (x,)).run_decompositions().graph_module.graph
    assert rewrite_small_linears(graph, max_rows=1) == 1  # three times seven rows: more than max_rows, still taken
    (node,) = [n for n in graph.nodes if n.target == torch.ops.genprobe.small_linear_ggml.default]
    _, weight, _, ggml_type = node.args
    out = torch.ops.genprobe.small_linear_ggml(x, layer.weight, layer.bias, ggml_type)
    assert torch.equal(out, torch.ops.genprobe.small_linear(x, layer.dequantized(), layer.bias))
