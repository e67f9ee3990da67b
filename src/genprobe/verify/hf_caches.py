"""``transformers``' own cache classes, probed at run time: which exist in the installed version, and how to build one.

Kinds (``--hf-cache``): :data:`CACHE_KINDS`, tabled in docs/verify-cache.md ("transformers' cache classes"). The API
moved between versions, so every kind is probed, never assumed. Importing this module imports no torch: the CLI's
parser offers :data:`CACHE_KINDS`.
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

CACHE_KINDS = ("dynamic", "static", "sliding", "quantized", "offloaded")


def _cache_utils() -> Any:  # transformers.cache_utils, probed by hasattr across versions (>= 4.40: DynamicCache)
    from transformers import cache_utils

    return cache_utils


def _params(cls: Any) -> set[str]:  # a transformers cache class, whichever this version has
    try:
        return set(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        return set()


def model_window(hf_model: torch.nn.Module) -> int | None:
    """The sliding window of ``hf_model``'s config (None when it has none)."""
    w = getattr(hf_model.config, "sliding_window", None)
    return int(w) if isinstance(w, int) and w > 0 else None


def quantized_backend() -> str | None:
    """The first quantized-cache backend usable here: ``fp8`` (no extra package), ``quanto``, ``hqq``."""
    cu = _cache_utils()
    if not hasattr(cu, "QuantizedCache"):
        return None
    if hasattr(cu, "Fp8QuantizedLayer") and "backend" in _params(cu.QuantizedCache):
        return "fp8"
    if importlib.util.find_spec("optimum") is not None and importlib.util.find_spec("optimum.quanto") is not None:
        return "quanto"
    if importlib.util.find_spec("hqq") is not None:
        return "hqq"
    return None


def unavailable_reason(hf_model: torch.nn.Module, kind: str) -> str | None:
    """Why cache ``kind`` cannot be used with ``hf_model`` here (None when it can)."""
    import torch
    import transformers

    if kind not in CACHE_KINDS:
        raise ValueError(f"unknown cache kind {kind!r}; choose from {list(CACHE_KINDS)}")
    cu = _cache_utils()
    version = f"transformers {transformers.__version__}"
    if kind == "static" and not hasattr(cu, "StaticCache"):
        return f"{version} has no StaticCache"
    if kind == "sliding" and model_window(hf_model) is None:
        return (
            "the model's config has no sliding_window: DynamicCache(config=...) would hold the same "
            "full-attention layers as 'dynamic'"
        )
    if kind == "sliding" and "config" not in _params(cu.DynamicCache):
        return f"{version}: DynamicCache takes no config, so it cannot build sliding-window layers"
    if kind == "quantized":
        # the model's own reason first: it holds whatever transformers version and backends are installed
        if model_window(hf_model) is not None:
            return "QuantizedCache supports full-attention layers only; this model has a sliding window"
        if quantized_backend() is None:
            return f"{version} offers no quantized-cache backend here (fp8 absent; optimum-quanto / hqq not installed)"
    if kind == "offloaded":
        if not hasattr(cu, "OffloadedCache") and "offloading" not in _params(cu.DynamicCache):
            return f"{version} has neither OffloadedCache nor DynamicCache(offloading=True)"
        if not torch.cuda.is_available():
            return f"{version} offloads through CUDA streams and this torch has no CUDA device"
        if next(hf_model.parameters()).device.type != "cuda":
            return "offloading moves a CUDA cache to CPU memory; the model is not on a CUDA device"
    return None


def describe(kind: str) -> str:
    """The class a kind builds, for reports (e.g. ``QuantizedCache(fp8)``)."""
    return {
        "dynamic": "DynamicCache()",
        "static": "StaticCache(config, max_cache_len)",
        "sliding": "DynamicCache(config) [sliding layers]",
        "quantized": f"QuantizedCache({quantized_backend() or 'none'})",
        "offloaded": "DynamicCache(offloading=True)",
    }[kind]


def make_cache(hf_model: torch.nn.Module, kind: str, batch_size: int, max_cache_len: int) -> Any:
    """A fresh, empty cache of ``kind`` for ``hf_model`` (call :func:`unavailable_reason` first)."""
    cu = _cache_utils()
    config = hf_model.config
    if kind == "dynamic":
        return cu.DynamicCache()
    if kind == "sliding":
        return cu.DynamicCache(config=config)
    if kind == "static":
        kw: dict[str, Any] = {"config": config, "max_cache_len": max_cache_len}
        params = _params(cu.StaticCache)
        if "max_batch_size" in params:  # transformers 4.x
            kw["max_batch_size"] = batch_size
        if "dtype" in params:
            kw["dtype"] = hf_model.dtype
        return cu.StaticCache(**kw)
    if kind == "quantized":
        backend = quantized_backend()
        if "backend" in _params(cu.QuantizedCache):
            return cu.QuantizedCache(backend, config)
        return cu.QuantizedCache(cache_config=cu.QuantizedCacheConfig(backend=backend))  # pragma: no cover — 4.x
    if kind == "offloaded":
        if "offloading" in _params(cu.DynamicCache):
            return cu.DynamicCache(offloading=True)
        return cu.OffloadedCache()  # pragma: no cover — older versions
    raise ValueError(f"unknown cache kind {kind!r}; choose from {list(CACHE_KINDS)}")
