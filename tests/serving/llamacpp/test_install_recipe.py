"""The llama.cpp extra's install recipe agrees with itself: one version, one sha256, one cache, no native build.

These read files only (the script itself is run by users, never by the tests), so they run with or without the
extra: the module overrides the folder's autouse skip fixture.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from genprobe.registry import cache_root
from genprobe.serving.llamacpp import LLAMA_CPP_PYTHON_VERSION

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "install_llamacpp.sh"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"  # the registry's sdist


@pytest.fixture(autouse=True)
def llama_cpp_ready() -> None:
    """Overrides the folder's skip: nothing here needs the bindings."""


def _assignment(name: str) -> str:
    m = re.search(rf"^{name}=(.*)$", SCRIPT.read_text(encoding="utf-8"), re.M)
    assert m, f"{name}= not found in {SCRIPT.name}"
    return m.group(1)


def test_one_version_everywhere():
    """pyproject's extra, the bindings check and the script pin the same llama-cpp-python."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert extras["llamacpp"] == [f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"]
    assert _assignment("VERSION") == LLAMA_CPP_PYTHON_VERSION
    assert _assignment("SDIST_SHA256") == SDIST_SHA256


def test_the_build_names_its_instruction_set():
    """GGML_NATIVE=ON crashed the quantized kernels on the test machines: the flags must turn it off, explicitly."""
    text = SCRIPT.read_text(encoding="utf-8")
    flags = " ".join(re.findall(r'^CMAKE_FLAGS="(.*)"$', text, re.M))
    assert "-DGGML_NATIVE=OFF" in flags and "-DGGML_NATIVE=ON" not in flags
    for flag in ("-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DLLAMA_CURL=OFF"):
        assert flag in flags
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)  # parses


@pytest.mark.parametrize("env", [{}, {"XDG_CACHE_HOME": "/x/cache"}, {"GENPROBE_CACHE_DIR": "/y/gp"}])
def test_the_script_uses_genprobes_cache(env, monkeypatch):
    """The script's cache directory is genprobe.registry.cache_root() under the same environment."""
    for var in ("GENPROBE_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    line = _assignment("CACHE").split("#")[0].strip()
    import os

    got = subprocess.run(["bash", "-c", f"CACHE={line}; echo $CACHE"], capture_output=True, text=True, env=os.environ)
    assert got.stdout.strip() == str(cache_root())
