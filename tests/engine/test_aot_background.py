"""A first compiled call does not wait for its programs (issue #49): the AOT programs of a shape not cached yet are
built in a background thread while that call and the next ones step eagerly, with the same tokens; once the build has
ended, calls run the programs. The suite builds in the foreground (tests/conftest.py sets
``GENPROBE_AOT_BACKGROUND=0``); this file turns the background on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from genprobe.engine.fast import compiled as compiled_mod
from genprobe.engine.fast import kernels
from genprobe.engine.fast.aot import program_path
from genprobe.engine.generate import generate
from genprobe.model.gguf_blocks import BLOCK_TYPES, BlockLinear, block_products
from genprobe.model.gpt import GPT

_NO_KERNELS = kernels.build.unsupported_reason()


FIRST_CALL = """
import json, sys, time
import torch
from genprobe.engine.fast import compiled
from genprobe.engine.generate import generate
sys.path.insert(0, sys.argv[1])
from test_aot_background import one_layer_gpt
model = one_layer_gpt()
t0 = time.perf_counter()
tokens = generate(model, [[5, 9, 2, 41, 7]], 12, compile=True).tokens
seconds = time.perf_counter() - t0
print(json.dumps({"tokens": tokens, "seconds": seconds, "building": compiled.aot_building(model, 1, 32)}))
"""


def one_layer_gpt() -> GPT:
    """A configuration of its own (one layer), so its programs are never cached by another test's build."""
    here = str(Path(__file__).parent)
    if here not in sys.path:  # the builder in tests/engine/conftest.py, here and in FIRST_CALL's process
        sys.path.insert(0, here)
    from conftest import _sharp_gpt

    return _sharp_gpt(5, n_layer=1)


@pytest.mark.skipif(_NO_KERNELS is not None, reason=f"genprobe's kernels cannot run here: {_NO_KERNELS}")
def test_a_first_call_steps_eagerly_while_its_programs_build_and_the_process_waits_for_them_at_exit():
    """A one-shot process: its call returns before the programs exist (eager tokens, equal to the reference); at exit
    it says so and waits for the build, so the next process (here, this one) runs the programs."""
    model, key = one_layer_gpt(), (1, 32)
    for kind in ("step", "prompt"):  # a run of the suite before this one left them: start from nothing
        program_path(model, *key, threads=1, kind=kind).unlink(missing_ok=True)
    env = {**os.environ, compiled_mod.AOT_BACKGROUND_ENV: "1"}
    here = str(Path(__file__).parent)
    argv = [sys.executable, "-c", FIRST_CALL, here]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first = json.loads(proc.stdout.strip().splitlines()[-1])
    eager = generate(model, [[5, 9, 2, 41, 7]], 12)
    assert first["building"] and first["tokens"] == eager.tokens
    assert first["seconds"] < 5.0, f"the first call took {first['seconds']:.1f} s: it waited for compilation"
    assert "finishing the compiled programs for the next run" in proc.stderr
    assert all(program_path(model, *key, threads=1, kind=k).exists() for k in ("step", "prompt"))
    after = generate(model, [[5, 9, 2, 41, 7]], 12, compile=True)
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
