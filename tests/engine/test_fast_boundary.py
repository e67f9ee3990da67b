"""The fast decode path behind one boundary (genprobe.engine.fast): one import path per module (the old aliases are
gone, #45), and no global effects before the compiled path is used."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

MOVED = ["compiled", "aot", "static_cache", "kernels", "kernels.build", "kernels.inductor_pass"]


@pytest.mark.parametrize("name", MOVED)
def test_each_fast_module_has_one_import_path(name):
    importlib.import_module(f"genprobe.engine.fast.{name}")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"genprobe.engine.{name}")


def test_compile_true_selects_the_fast_runner(tiny_model):
    from genprobe.engine.fast.compiled import CompiledGPTRunner
    from genprobe.engine.generate import generate
    from genprobe.engine.runner import GPTRunner, runner_for
    from genprobe.model.load import Model

    assert isinstance(runner_for(tiny_model, compile=True), CompiledGPTRunner)
    assert runner_for(Model.from_module(tiny_model), compile=True) is CompiledGPTRunner.for_model(tiny_model)
    eager = runner_for(tiny_model)
    assert isinstance(eager, GPTRunner) and not hasattr(eager, "greedy_all")
    with pytest.raises(ValueError, match="mode='naive'"):
        generate(tiny_model, [[1, 2]], 2, mode="naive", compile=True)


IMPORT_PROBE = """
import ctypes, torch
import torch.nn.modules.module as m
import genprobe, genprobe.engine, genprobe.engine.fast.compiled, genprobe.engine.fast.aot
hooks = (m._global_module_registration_hooks, m._global_parameter_registration_hooks,
         m._global_buffer_registration_hooks)
assert not any(hooks), hooks
assert not hasattr(torch.ops.genprobe, "small_linear"), "the kernels' library was loaded at import"
assert not hasattr(ctypes.CDLL(None), "genprobe_set_small_linear"), "the shim went global at import"
print("ok")
"""


def test_importing_the_fast_path_changes_nothing_global():
    """Hooks in torch.nn, the kernels' library and its RTLD_GLOBAL shim come with first use, never with an import."""
    out = subprocess.run([sys.executable, "-c", IMPORT_PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_compile_finds_the_same_llama_view_from_a_model_its_module_or_its_runner():
    """runner_for(compile=True) takes what generate() takes: the fast path's module is one view of the weights."""
    from genprobe.engine.hf_adapter import HFCausalLM
    from genprobe.engine.runner import fast_module
    from genprobe.model.llama_family import llama_family_of
    from genprobe.model.load import Model
    from genprobe.verify.hf_matrix import tiny_model

    hf = tiny_model("llama").eval()
    view = llama_family_of(hf)
    assert fast_module(hf) is view and fast_module(HFCausalLM(hf)) is view
    assert fast_module(Model.from_module(hf)) is view
