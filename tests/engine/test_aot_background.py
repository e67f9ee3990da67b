"""A first compiled call does not wait for its programs (issue #49): the AOT programs of a shape not cached yet are
built in a background thread while that call and the next ones step eagerly, with the same tokens; once the build has
ended, calls run the programs. The suite builds in the foreground (tests/conftest.py sets
``GENPROBE_AOT_BACKGROUND=0``); this file turns the background on."""

from __future__ import annotations

import time

import pytest
import torch

from genprobe.engine.fast import compiled as compiled_mod
from genprobe.engine.fast import kernels
from genprobe.engine.fast.aot import program_path
from genprobe.engine.generate import generate
from genprobe.model import GPT, GPTConfig
from genprobe.model.gguf_blocks import BLOCK_TYPES, BlockLinear, block_products

_NO_KERNELS = kernels.build.unsupported_reason()


@pytest.fixture
def one_layer_gpt():
    """A configuration of its own (one layer), so its programs are never cached by another test's build."""
    torch.manual_seed(5)
    m = GPT(GPTConfig(vocab_size=50, n_layer=1, n_head=2, d_model=32, d_ff=64, block_size=32))
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(10)
    return m.eval()


@pytest.mark.skipif(_NO_KERNELS is not None, reason=f"genprobe's kernels cannot run here: {_NO_KERNELS}")
def test_a_first_call_steps_eagerly_while_its_programs_build_then_runs_them(one_layer_gpt, monkeypatch):
    monkeypatch.setenv(compiled_mod.AOT_BACKGROUND_ENV, "1")
    model, key = one_layer_gpt, (1, 32)
    for kind in ("step", "prompt"):  # a run of the suite before this one left them: start from nothing
        program_path(model, *key, threads=1, kind=kind).unlink(missing_ok=True)
    prompts = [[5, 9, 2, 41, 7]]
    eager = generate(model, prompts, 12)
    t0 = time.perf_counter()
    first = generate(model, prompts, 12, compile=True)
    first_seconds = time.perf_counter() - t0
    assert compiled_mod.aot_building(model, *key)  # still building: the call did not wait for it
    assert first.tokens == eager.tokens
    assert first_seconds < 5.0, f"the first call took {first_seconds:.1f} s: it waited for compilation"
    compiled_mod.wait_for_builds()
    assert all(program_path(model, *key, threads=1, kind=k).exists() for k in ("step", "prompt"))
    after = generate(model, prompts, 12, compile=True)
    assert compiled_mod._aot_decoders[model][key] is not None  # the programs ran, not the torch.compile path
    assert after.tokens == eager.tokens


def test_eager_block_layers_use_the_product_given_inside_block_products_only():
    """What the fast path's eager steps hand the block layers (the kernels) applies inside the context alone."""
    _, per_block, nbytes = BLOCK_TYPES["Q8_0"]
    raw = torch.zeros(3, 2 * nbytes, dtype=torch.uint8)
    layer = BlockLinear(raw, "Q8_0")
    x = torch.randn(2, 2 * per_block)
    calls = []

    def product(x, weight, bias, ggml_type):
        calls.append(ggml_type)
        return torch.full((*x.shape[:-1], weight.shape[0]), 7.0)

    assert torch.equal(layer(x), torch.zeros(2, 3))  # the reference: all-zero blocks
    with block_products(product):
        assert torch.equal(layer(x), torch.full((2, 3), 7.0))
    assert torch.equal(layer(x), torch.zeros(2, 3)) and calls == [BLOCK_TYPES["Q8_0"][0]]
