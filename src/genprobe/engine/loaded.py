"""The model that generates: what ``genprobe.load`` returns.

:class:`genprobe.model.load.Model` is the model layer's record (module, tokenizer, limits, MLP sites); running it
is the engine's job, one layer up, so the engine adds ``runner`` and ``generate()`` in this subclass rather than the
model layer importing the engine. Every job takes either: the engine runs a plain ``Model`` the same way
(:func:`~genprobe.engine.runner.runner_for`, the one place a runner is chosen).
"""

from __future__ import annotations

import dataclasses
import os
from functools import cached_property
from typing import Any

from ..model import load
from ..model.load import Model
from .runner import Runner, runner_for
from .text import complete


class LoadedModel(Model):
    """A :class:`~genprobe.model.load.Model` with its eager runner and text-in, text-out ``generate()``."""

    @cached_property
    def runner(self) -> Runner:
        """The eager :class:`~genprobe.engine.runner.Runner` that drives this model."""
        return runner_for(self)

    generate = complete  # model.generate(prompts, sampling, max_new_tokens, ...) -> list[Completion]


def load_model(path: str | os.PathLike[str], **options: Any) -> LoadedModel:
    """:func:`genprobe.model.load.load_model` (the one loader: same options, same checks), ready to generate."""
    model = load.load_model(path, **options)
    return LoadedModel(**{f.name: getattr(model, f.name) for f in dataclasses.fields(model)})
