"""Hand-written CPU kernels for the compiled decode path: small-M float32 linear layers (``linear.cpp``).

:func:`load` builds the C++ library on first use (a C++ compiler and an AVX2 CPU are needed, as for
``torch.compile`` itself) and reports why when it cannot; :func:`inductor_config` gives the Inductor settings
that put the kernels into a compiled graph. Nothing else in genprobe calls them: the eager engine, training and
the verifier's reference all run PyTorch's own operators.

Opt-out and fail-soft: ``GENPROBE_KERNELS=0`` turns them off; a machine that is not x86-64 with AVX2/FMA, or has
no C++ compiler, gets ``available=False`` with the reason (:func:`build.unsupported_reason` checks without
building), and the compiled path keeps Inductor's own code.

Global effects, all on first use of the kernel path, none on import: :func:`load` builds the library into the
cache directory, loads it with ``torch.ops.load_library`` (registering the ``genprobe::`` operators and the
``GreedyDecoder`` class with torch for the rest of the process) and loads the small C shim ``RTLD_GLOBAL`` (only it:
compiled programs call it by name; the kernels' library itself stays local). ``GreedyDecoder`` replaces c10's CPU
allocator with a block pool for the duration of each of its calls and puts the previous one back after it.
It is called only by the compiled decode path (:mod:`genprobe.engine.fast.compiled`, :mod:`.aot`).
"""

from __future__ import annotations

from typing import Any

from . import build as build
from .build import KernelStatus, load, status

# Decode steps of up to this many rows run their matrix products on these kernels; beyond it the products are
# GEMMs that oneDNN does better. Here, not in compiled.py, because both compiled.py and aot.py read it.
KERNEL_MAX_ROWS = 64

#: How Inductor builds every program of the compiled path (torch.compile's and the AOT ones): without line tables
#: (``-g1``), which serve profilers only and cost 7-9% of each C++ compile (an AOT program's wrapper 5.67 -> 5.18 s,
#: its kernels 1.51 -> 1.40 s); debug information does not change the generated code.
BUILD_CONFIG: dict[str, Any] = {"aot_inductor.enable_line_tables": False}


def inductor_config(max_rows: int | None) -> dict[str, Any]:
    """Inductor settings that route products of up to ``max_rows`` rows (None: any) to the kernels (after load)."""
    from .inductor_pass import inductor_config as config  # imports torch._inductor: only when compiling

    return config(max_rows)


__all__ = ["BUILD_CONFIG", "KERNEL_MAX_ROWS", "KernelStatus", "inductor_config", "load", "status"]
