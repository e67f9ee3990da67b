"""The llama.cpp extra's install recipe agrees with itself: one version, one sha256, one cache, no native build, only
the libraries the bindings load; and the test command's llama.cpp tests wait for its install, then fail, never skip.

These read files only (the script itself is run by scripts/test.sh and by users, never by a test), so they run with
or without the extra: the module overrides the folder's autouse skip fixture.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from genprobe.registry import cache_root
from genprobe.serving.llamacpp.engine import LLAMA_CPP_PYTHON_VERSION

sys.path.insert(0, str(Path(__file__).parent))
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


def _flags() -> str:
    return " ".join(re.findall(r'^CMAKE_FLAGS="(.*)"$', SCRIPT.read_text(encoding="utf-8"), re.M))


def test_the_build_names_its_instruction_set():
    """GGML_NATIVE=ON crashed the quantized kernels on the test machines: the flags must turn it off, explicitly."""
    flags = _flags()
    assert "-DGGML_NATIVE=OFF" in flags and "-DGGML_NATIVE=ON" not in flags
    for flag in ("-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DLLAMA_CURL=OFF"):
        assert flag in flags
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)  # parses


def test_the_peer_for_this_cpu_turns_on_what_the_portable_build_turns_off():
    """`--for-this-cpu DIR` (the benchmark peer, issue #49) swaps the portable wheel's -DGGML_AVX512=OFF for ON: if
    the portable flags stop saying OFF, the swap would silently build the AVX2 wheel again."""
    text = SCRIPT.read_text(encoding="utf-8")
    assert "-DGGML_AVX512=OFF" in _flags()
    assert '"${CMAKE_FLAGS/-DGGML_AVX512=OFF/-DGGML_AVX512=ON}"' in text
    assert 'WHEELS="$WHEELS/llamacpp-this-cpu"' in text  # never the cache slot of the wheel the tests install


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--bogus"], "unknown option --bogus"), (["--for-this-cpu"], "--for-this-cpu needs the directory")],
)
def test_bad_options_are_refused_before_anything_is_built(args, says):
    got = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert got.returncode != 0 and says in got.stderr


def test_the_build_makes_only_the_libraries_the_bindings_load():
    """The test command builds the extra (scripts/test.sh): no mtmd, no llama-common (patched off in the unpacked
    sdist, where llama-cpp-python's CMakeLists forces it on) and -O2 keep that build inside its ten minutes."""
    flags = _flags()
    assert "-DLLAVA_BUILD=OFF" in flags
    assert "'-DCMAKE_C_FLAGS_RELEASE=-O2 -DNDEBUG'" in flags and "'-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG'" in flags
    text = SCRIPT.read_text(encoding="utf-8")
    assert _assignment("COMMON_ON").startswith("'set(LLAMA_BUILD_COMMON ON CACHE'")
    assert _assignment("COMMON_OFF") == "'set(LLAMA_BUILD_COMMON OFF CACHE'"
    assert 'sed -i "s/$COMMON_ON/$COMMON_OFF/" "$tree/CMakeLists.txt"' in text
    assert re.search(r'pip wheel .* "\$tree" \\$', text, re.M)  # the patched tree is what pip builds


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


def test_the_test_command_hands_its_install_to_the_llama_cpp_tests():
    """scripts/test.sh builds the extra by default (issue #47: no llama.cpp test skips in the test command), the
    wheel from before setup, and writes the install's exit status where install_wait.py reads it."""
    from install_wait import PENDING_ENV

    text = (REPO / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert f'export {PENDING_ENV}="$PWD/.venv/llamacpp.status"' in text
    assert '"${GENPROBE_TEST_LLAMACPP:-1}" = "0"' in text  # an opt-out, not an opt-in
    build = text.index("bash scripts/install_llamacpp.sh --wheel-only > .venv/llamacpp.log")
    assert build < text.index("bash scripts/setup.sh --test")
    assert text.index("bash scripts/install_llamacpp.sh >> .venv/llamacpp.log") > text.index("phase setup")


def test_in_the_test_command_a_failed_install_fails_the_llama_cpp_tests(tmp_path, monkeypatch):
    import install_wait

    status = tmp_path / "llamacpp.status"
    monkeypatch.setenv(install_wait.PENDING_ENV, str(status))
    status.write_text("1\n")
    with pytest.raises(pytest.fail.Exception, match=r"install_llamacpp.sh failed \(exit 1\): read .*llamacpp.log"):
        install_wait.llama_cpp_or_skip()
    status.unlink()  # not written yet, and never: a hung install fails at the deadline, not forever
    with pytest.raises(pytest.fail.Exception, match="did not finish within 0 s"):
        install_wait.wait_for_install(timeout=0.0)


def test_in_the_test_command_a_missing_extra_fails_instead_of_skipping(tmp_path, monkeypatch):
    import install_wait

    import genprobe.serving.llamacpp.engine as pkg

    status = tmp_path / "llamacpp.status"
    status.write_text("0\n")
    monkeypatch.setattr(pkg, "llama_cpp_problem", lambda: "llama.cpp's Python bindings are not installed")
    monkeypatch.setenv(install_wait.PENDING_ENV, str(status))
    with pytest.raises(BaseException) as outcome:  # a skip, too, is an exception: it must not be the one raised
        install_wait.llama_cpp_or_skip()
    assert outcome.type is pytest.fail.Exception, outcome.value
    assert "installed llama.cpp's bindings, yet: llama.cpp's Python bindings are not installed" in str(outcome.value)
    monkeypatch.delenv(install_wait.PENDING_ENV)  # outside the test command: skipped with the reason, as before
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        install_wait.llama_cpp_or_skip()


def test_the_install_is_waited_for(tmp_path, monkeypatch):
    """A llama.cpp test that starts before the install has finished waits for its status, then goes on."""
    import threading

    import install_wait

    status = tmp_path / "llamacpp.status"
    monkeypatch.setenv(install_wait.PENDING_ENV, str(status))
    threading.Timer(1.5, lambda: status.write_text("0\n")).start()
    start = time.monotonic()
    install_wait.wait_for_install(timeout=30.0)
    assert time.monotonic() - start >= 1.4
