"""Hand-written CPU kernels for the compiled decode path: small-M float32 linear layers (``linear.cpp``).

:func:`load` builds the C++ library on first use (a C++ compiler and an AVX2 CPU are needed, as for
``torch.compile`` itself) and reports why when it cannot; :func:`inductor_config` gives the Inductor settings
that put the kernels into a compiled graph. Nothing else in genprobe calls them: the eager engine, training and
the verifier's reference all run PyTorch's own operators.
"""

from __future__ import annotations

from typing import Any

from .build import KernelStatus, load, status

# Decode steps of up to this many rows run their matrix products on these kernels; beyond it the products are
# GEMMs that oneDNN does better. Here, not in compiled.py, because both compiled.py and aot.py read it.
KERNEL_MAX_ROWS = 64


def inductor_config(max_rows: int | None) -> dict[str, Any]:
    """Inductor settings that route products of up to ``max_rows`` rows (None: any) to the kernels (after load)."""
    from .inductor_pass import inductor_config as config  # imports torch._inductor: only when compiling

    return config(max_rows)


__all__ = ["KERNEL_MAX_ROWS", "KernelStatus", "inductor_config", "load", "status"]
