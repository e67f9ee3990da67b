"""Fixtures of the llama.cpp tests: every test here is skipped, with the reason, without the optional extra."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def llama_cpp_ready() -> None:
    """Skip the test (with the reason) when llama.cpp's bindings cannot be used here."""
    from genprobe.serving.llamacpp import llama_cpp_problem

    problem = llama_cpp_problem()
    if problem:
        pytest.skip(problem)
