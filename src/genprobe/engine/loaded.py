"""A loaded model that generates: what ``genprobe.load`` returns.

:class:`genprobe.model.load.Model` is the model layer's record (module, tokenizer, limits, MLP sites); running it
is the engine's job, so the engine adds ``runner`` and ``generate()`` here, in a subclass, rather than the model
layer importing the engine.
"""

from __future__ import annotations

import dataclasses
import os
from functools import cached_property
from typing import Sequence

import torch

from ..model import load
from ..model.load import Model
from .runner import Runner, runner_for
from .samplers import SamplerConfig
from .text import Completion, complete


class LoadedModel(Model):
    """A :class:`~genprobe.model.load.Model` with its generation runner and text-in, text-out generation."""

    @classmethod
    def of(cls, model: Model) -> "LoadedModel":
        """``model`` itself when it already generates, else the same fields in a :class:`LoadedModel`."""
        if isinstance(model, cls):
            return model
        return cls(**{f.name: getattr(model, f.name) for f in dataclasses.fields(model)})

    @cached_property
    def runner(self) -> Runner:
        """The generation runner (:class:`~genprobe.engine.runner.Runner`) that drives this model."""
        return runner_for(self)

    def generate(
        self,
        prompts: str | Sequence[str],
        sampling: SamplerConfig | None = None,
        max_new_tokens: int = 50,
        seed: int = 0,
        stop_at_eos: bool = True,
        compile: bool = False,
    ) -> list[Completion]:
        """Continuations (:class:`~genprobe.engine.text.Completion`) of one prompt or a batch; greedy by default."""
        return complete(self, prompts, sampling, max_new_tokens, seed, stop_at_eos, compile)


def load_model(
    path: str | os.PathLike[str],
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    weight_dtype: torch.dtype | None = None,
    narrow_output: bool = False,
) -> LoadedModel:
    """:func:`genprobe.model.load.load_model` (the one loader: same arguments, same checks), ready to generate."""
    return LoadedModel.of(load.load_model(path, dtype, device, weight_dtype, narrow_output))
