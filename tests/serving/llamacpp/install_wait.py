"""The llama.cpp tests and the test command's background install of the extra (``scripts/test.sh``).

``scripts/test.sh`` builds llama-cpp-python (``scripts/install_llamacpp.sh``) beside lint, types and the first
tests, and tells pytest through :data:`PENDING_ENV` which file the install's exit status will be written to. A
llama.cpp test that starts before it is written waits for it (pytest's xdist scheduler runs this folder's tests
late, after the worker groups, so they seldom do); once it is written, llama.cpp must be usable: in the test
command a llama.cpp test never skips for lack of the extra, it fails, naming the install's log. Outside the test
command (the variable unset) nothing waits and a missing extra skips the test with the reason, as before.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import time
from pathlib import Path

import pytest

PENDING_ENV = "GENPROBE_LLAMACPP_INSTALL_STATUS"  # file the install's exit status goes to; its log is beside it
WAIT_S = 900.0  # the build takes ~2 min alone on 2 cores, longer beside the tests; a hung one fails the tests


def wait_for_install(timeout: float = WAIT_S) -> None:
    """Block until the test command's background install has finished (no-op outside the test command); a failed
    or hung install fails the calling test with the log to read."""
    status = os.environ.get(PENDING_ENV)
    if not status:
        return
    path = Path(status)
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if time.monotonic() > deadline:
            log = path.with_suffix(".log")
            pytest.fail(f"scripts/install_llamacpp.sh did not finish within {timeout:.0f} s: read {log}")
        time.sleep(1.0)
    code = path.read_text(encoding="utf-8").strip()
    if code != "0":
        pytest.fail(f"scripts/install_llamacpp.sh failed (exit {code}): read {path.with_suffix('.log')}")
    importlib.invalidate_caches()  # llama_cpp appeared in site-packages after this process looked there


def llama_cpp_or_skip() -> None:
    """Skip (outside the test command) or fail (inside it) when llama.cpp's bindings cannot be used here."""
    from genprobe.serving.llamacpp.engine import llama_cpp_problem

    wait_for_install()
    problem = llama_cpp_problem()
    if problem is None:
        return
    if os.environ.get(PENDING_ENV):
        pytest.fail(f"the test command installed llama.cpp's bindings, yet: {problem}")
    pytest.skip(problem)


def llama_cpp_installed() -> bool:
    """Whether the bindings are installed here, after the test command's install if one is under way."""
    wait_for_install()
    return importlib.util.find_spec("llama_cpp") is not None
