"""C's ``expf`` and ``logf`` as llama.cpp's samplers call them (the C library's, not numpy's).

llama.cpp's samplers (src/llama-sampler.cpp: ``llama_sampler_softmax_impl``, ``llama_sampler_min_p_apply``,
``llama_sampler_typical_apply``, ``llama_sampler_dry_apply``) call the C library's scalar ``expf`` / ``logf``.
numpy's float32 ``exp`` / ``log`` are its own SIMD approximations: measured against glibc's on 200,000 normal
inputs they differed by one ulp on 39% (exp) and 15% (log) of them — enough to move an exactly-hit top-p, min-p
or XTC threshold to the other side (tests/serving/llamacpp/test_sampler_chain.py found it against the real
chain). So:

* :func:`expf` takes the float64 exponential rounded to float32 (correctly rounded), and asks the C library
  itself for the inputs whose value lies near a float32 rounding midpoint — there glibc's ``expf`` (documented
  error ≤ 0.502 ulp) may round the other way;
* :func:`logf` asks the C library for every element (glibc's ``logf`` error bound, 0.818 ulp, leaves no cheap
  shortcut); it runs on scalars (min-p) and on typical-p's candidates only.

Without a loadable C math library (not expected on Linux/macOS) both fall back to the float64 route.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache
from typing import Any

import numpy as np

F32 = np.float32
# |fraction of an ulp| beyond which a correctly rounded value might be rounded the other way by glibc's expf
# (its error bound is 0.502 ulp: within 0.002 of the midpoint; 0.49 leaves a margin of 5×).
_NEAR_MIDPOINT = 0.49


@lru_cache(maxsize=1)
def _libm() -> Any | None:
    name = ctypes.util.find_library("m") or "libm.so.6"
    try:
        lib = ctypes.CDLL(name)
        for fn in (lib.expf, lib.logf):
            fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    except (OSError, AttributeError):
        return None
    return lib


def expf(x: np.ndarray) -> np.ndarray:
    """Elementwise C ``expf`` of a float32 array (see the module docstring)."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        wide = np.exp(x.astype(np.float64))
        y = wide.astype(F32)
        ulp = np.spacing(np.nextafter(np.abs(y), F32(0))).astype(np.float64)  # the finer side at a power of 2
        frac = np.abs(wide - y.astype(np.float64)) / np.where(ulp > 0, ulp, 1.0)
    lib = _libm()
    if lib is None:
        return y
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    for i in np.flatnonzero((frac.reshape(-1) > _NEAR_MIDPOINT) & np.isfinite(flat_x)):
        flat_y[i] = lib.expf(float(flat_x[i]))
    return y


def logf(x: np.ndarray | np.floating | float) -> np.ndarray:
    """Elementwise C ``logf`` of float32 values (0 → -inf, as in C)."""
    arr = np.asarray(x, dtype=F32)
    lib = _libm()
    if lib is None:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(arr.astype(np.float64)).astype(F32)
    out = np.empty(arr.shape, dtype=F32)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i in range(flat_in.size):
        flat_out[i] = lib.logf(float(flat_in[i]))
    return out
