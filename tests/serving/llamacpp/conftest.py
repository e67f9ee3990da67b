"""Fixtures of the llama.cpp tests: every test here is skipped, with the reason, without the optional extra (in the
test command, which installs the extra, it waits for that install and fails instead: see install_wait.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from install_wait import llama_cpp_or_skip  # noqa: E402


@pytest.fixture(autouse=True)
def llama_cpp_ready() -> None:
    """Skip the test (with the reason) when llama.cpp's bindings cannot be used here."""
    llama_cpp_or_skip()
