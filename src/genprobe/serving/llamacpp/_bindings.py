"""The one place that imports llama.cpp's Python bindings: a clear error when the optional extra is missing.

``llama-cpp-python`` ships as source only, and a default build crashed in its quantized kernels on the test
machines, so ``scripts/install_llamacpp.sh`` builds it with explicit instruction-set flags. Every llama.cpp entry
point calls :func:`require_llama_cpp` first.
"""

from __future__ import annotations

from types import ModuleType
from typing import Self

#: The version genprobe is tested against (its low-level API changes between releases: e.g. the argument order
#: of ``llama_sampler_init_penalties``).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
INSTALL_HINT = "bash scripts/install_llamacpp.sh (builds llama-cpp-python from source, ~2 min on 2 cores)"


class LlamaCppNotAvailableError(ImportError):
    """llama-cpp-python is not installed (or cannot be imported) in this environment."""


def llama_cpp_problem() -> str | None:
    """Why ``llama_cpp`` cannot be used here, or None when it can (for test skips and doctor output)."""
    try:
        import llama_cpp
    except ImportError as exc:
        return f"llama.cpp's Python bindings are not installed ({exc}); {INSTALL_HINT}"
    except OSError as exc:  # the shared library failed to load (built for another CPU, missing libgomp, ...)
        return f"llama-cpp-python is installed but its library cannot be loaded: {exc}; rebuild: {INSTALL_HINT}"
    version = getattr(llama_cpp, "__version__", "?")
    if version != LLAMA_CPP_PYTHON_VERSION:
        return f"llama-cpp-python {version} is installed; genprobe needs {LLAMA_CPP_PYTHON_VERSION}: {INSTALL_HINT}"
    return None


def require_llama_cpp() -> ModuleType:
    """Import and return ``llama_cpp``, or raise :class:`LlamaCppNotAvailableError` saying how to install it."""
    problem = llama_cpp_problem()
    if problem is not None:
        raise LlamaCppNotAvailableError(problem)
    import llama_cpp

    return llama_cpp


def llama_cpp_facts() -> dict[str, str]:
    """The bindings' version and llama.cpp's build (``llama_print_system_info``: the instruction sets it uses)."""
    lib = require_llama_cpp()
    info = lib.llama_print_system_info().decode("utf-8", errors="replace").strip()
    return {"llama_cpp_python": getattr(lib, "__version__", LLAMA_CPP_PYTHON_VERSION), "system_info": info}


class Closeable:
    """Owns llama.cpp objects that :meth:`close` frees (idempotently); as a context manager, closed on exit."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
