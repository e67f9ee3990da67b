"""The loader's errors, in a module of their own: ``load``, ``gguf`` and ``catalog`` all raise them, and ``load``
imports the other two (a shared leaf keeps the three out of an import circle)."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """A model directory cannot be loaded (missing files, pickled weights, unsupported architecture, …)."""


class UnsupportedArchitectureError(ModelLoadError):
    """The architecture lacks something a genprobe capability needs (named in the message)."""
