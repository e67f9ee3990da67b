"""A GGUF file's Q8_0 tensors read as int8 blocks (``load(file, weight_dtype=int8)``): the file's integers and scales
as they are, named and ordered as transformers' dequantization names and orders them, the same weights (so the
same logits, bit for bit), a quarter of the bytes, and the compiled fast path's kernels reading the blocks."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

gguf = pytest.importorskip("gguf", reason="the gguf extra is not installed (pip install 'genprobe[gguf]')")

sys.path.insert(0, str(Path(__file__).parent))
from gguf_tiny import write_tiny_gguf  # noqa: E402

import genprobe  # noqa: E402
from genprobe.model.errors import ModelLoadError  # noqa: E402
from genprobe.model.gguf_blocks import with_gguf_blocks  # noqa: E402
from genprobe.model.weight_only import WeightOnlyLinear  # noqa: E402

PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
EVERY_MATRIX = (*(f"blk.{i}.{p}.weight" for i in range(2) for p in PROJECTIONS), "token_embd.weight")
SOME = ("blk.0.ffn_down.weight", "blk.1.attn_q.weight", "blk.1.attn_k.weight")  # q/k: rows reordered by the converter
IDS = [5, 17, 40, 41, 99, 3, 250, 7]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf-int8")
    write_tiny_gguf(d / "some.gguf", q8_names=SOME)
    write_tiny_gguf(d / "every.gguf", q8_names=EVERY_MATRIX)
    write_tiny_gguf(d / "float.gguf")
    # Q8_0 beside the 4/5-bit types (tests/model/test_gguf_blocks.py): one compiled test covers both kinds of blocks
    mixed = dict(zip(EVERY_MATRIX, ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1") * 3, strict=True))
    write_tiny_gguf(d / "mixed.gguf", quant=mixed)
    return d


def _logits(module: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return module(torch.tensor([IDS])).logits[0]


def _raw_q8_0(path: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The file's own int8 values and float16 scales of a Q8_0 tensor, in its row order."""
    (tensor,) = [t for t in gguf.GGUFReader(path).tensors if t.name == name]
    blocks = np.asarray(tensor.data).reshape(tensor.data.shape[0], -1, 34)
    q = blocks[..., 2:].copy().view(np.int8).reshape(blocks.shape[0], -1)
    return q, blocks[..., :2].copy().view(np.float16)[..., 0]


def test_q8_0_tensors_are_held_as_the_files_int8_blocks(files):
    path = files / "some.gguf"
    model = genprobe.load(path, weight_dtype=torch.int8)
    layers = model.module.model.layers
    down, q_proj = layers[0].mlp.down_proj, layers[1].self_attn.q_proj
    assert isinstance(down, WeightOnlyLinear) and down.blocked and isinstance(q_proj, WeightOnlyLinear)
    assert type(layers[0].mlp.up_proj) is nn.Linear  # an F32 tensor stays float32
    q, d = _raw_q8_0(path, "blk.0.ffn_down.weight")
    assert torch.equal(down.weight, torch.from_numpy(q)) and torch.equal(down.scale, torch.from_numpy(d).float())
    q, _ = _raw_q8_0(path, "blk.1.attn_q.weight")  # attn_q's rows come back in transformers' order, the same rows
    assert not torch.equal(q_proj.weight, torch.from_numpy(q))
    assert sorted(map(bytes, q_proj.weight.numpy())) == sorted(map(bytes, q))


def test_the_int8_model_gives_the_float_models_logits_bit_for_bit_in_fewer_bytes(files):
    path = files / "every.gguf"
    float_model = genprobe.load(path)
    int8 = genprobe.load(path, weight_dtype=torch.int8, narrow_output=True)
    assert torch.equal(_logits(int8.module), _logits(float_model.module))
    assert isinstance(int8.module.lm_head, WeightOnlyLinear) and int8.module.lm_head.blocked
    assert int8.module.model.embed_tokens.weight.dtype == torch.float32  # the lookup stays float32
    linear_bytes = sum(m.weight.numel() * 4 for m in float_model.module.modules() if type(m) is nn.Linear)
    block_bytes = sum(
        m.weight.numel() + m.scale.numel() * 4 for m in int8.module.modules() if isinstance(m, WeightOnlyLinear)
    )
    assert block_bytes * 3.5 < linear_bytes  # 1 + 4/32 bytes per weight against 4
    kept = genprobe.load(path, weight_dtype=torch.int8)  # without narrow_output the tied head stays the embedding
    assert kept.module.lm_head.weight is kept.module.model.embed_tokens.weight


def test_blocks_that_do_not_give_the_layers_weights_are_refused(files):
    """The check behind the loader: blocks put on the wrong layer (or in the wrong row order) never load silently."""
    from genprobe.model.gguf import gguf_blocks

    model = genprobe.load(files / "some.gguf").module
    blocks = gguf_blocks(files / "some.gguf", model, {"Q8_0"})
    assert set(blocks) == {
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight",
    }
    kind, rows = blocks["model.layers.1.self_attn.q_proj.weight"]
    swapped = {"model.layers.1.self_attn.q_proj.weight": (kind, rows.flip(0))}
    with pytest.raises(ValueError, match="q_proj.weight: the Q8_0 blocks do not give the layer's float weights"):
        with_gguf_blocks(model, swapped)


def test_what_int8_cannot_read_is_refused_with_the_reason(files):
    with pytest.raises(ModelLoadError, match="holds no matrices in blocks genprobe keeps.*quant-compare"):
        genprobe.load(files / "float.gguf", weight_dtype=torch.int8)
    with pytest.raises(ModelLoadError, match="int8 keeps its quantized blocks"):
        genprobe.load(files / "some.gguf", weight_dtype=torch.bfloat16)
    with pytest.raises(ModelLoadError, match="float32 Llama-family models.*dtype is torch.float64"):
        genprobe.load(files / "some.gguf", dtype=torch.float64, weight_dtype=torch.int8)


def test_the_compiled_fast_path_reads_the_blocks_and_keeps_the_tokens(files):
    """Greedy tokens of the compiled path (its kernels reading int8 and scales, and the 4/5-bit blocks of
    genprobe.model.gguf_blocks) equal the eager path's, which equal the dequantized float model's."""
    from genprobe.engine.fast import kernels
    from genprobe.engine.generate import generate
    from genprobe.engine.hf_adapter import HFCausalLM

    if not kernels.load().available:
        pytest.skip(f"genprobe's kernels cannot run here: {kernels.load().reason}")
    model = genprobe.load(files / "mixed.gguf", weight_dtype=torch.int8, narrow_output=True)
    assert set(model.meta["weight_blocks"]["blocks"]) == {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"}
    runner = HFCausalLM(model.module)
    prompts = [IDS, [12, 77, 3, 56, 9]]
    eager = generate(runner, prompts, max_new_tokens=10)
    assert eager.tokens == generate(HFCausalLM(genprobe.load(files / "mixed.gguf").module), prompts, 10).tokens
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager decoding would pass unnoticed
        compiled = generate(runner, prompts, max_new_tokens=10, compile=True)
    assert compiled.tokens == eager.tokens


def test_per_row_and_block_int8_models_do_not_share_compiled_programs(files):
    """Same config, same dtypes, other scales: a program compiled for one must not be loaded for the other (the
    kernels would read a per-row scale as block scales)."""
    from genprobe.engine.fast.aot import cache_key
    from genprobe.model.llama_family import llama_family_of
    from genprobe.model.weight_only import with_weight_dtype

    path = files / "every.gguf"
    rows = with_weight_dtype(genprobe.load(path).module, torch.int8, narrow_output=True)
    blocks = genprobe.load(path, weight_dtype=torch.int8, narrow_output=True).module
    assert [p.dtype for p in rows.parameters()] == [p.dtype for p in blocks.parameters()]
    assert cache_key(llama_family_of(rows), 1, 64, 1) != cache_key(llama_family_of(blocks), 1, 64, 1)
