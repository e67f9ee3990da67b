"""The model that generates: what ``genprobe.load`` returns, text in and text out.

:class:`genprobe.model.load.Model` is the model layer's record (module, tokenizer, limits, MLP sites); running it
is the engine's job, one layer up, so the engine adds ``runner`` and ``generate()`` in this subclass rather than the
model layer importing the engine. Every job takes either: the engine runs a plain ``Model`` the same way
(:func:`~genprobe.engine.runner.runner_for`, the one place a runner is chosen). :func:`complete` (``generate()``)
encodes prompts with the model's tokenizer and generates them as one left-padded batch.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

from ..model import load
from ..model.load import Model
from .generate import generate
from .runner import Runner, runner_for
from .samplers.stages import SamplerConfig


@dataclass
class Completion:
    """One prompt's continuation."""

    prompt: str
    text: str
    prompt_ids: list[int]
    token_ids: list[int]
    finished: str  # "length" | "eos"
    unknown_chars: list[str]  # prompt characters the vocabulary lacks (they became the unknown token)


def encode_prompts(model: Model, texts: Sequence[str]) -> tuple[list[list[int]], list[list[str]]]:
    """Each text's token ids and the characters of it the vocabulary lacks (encoded as the unknown token)."""
    tok = model.require_tokenizer()
    unknown = [tok.unknown_chars(t) for t in texts]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unknown characters are returned instead
        return [tok.encode(t) for t in texts], unknown


def complete(
    model: Model,
    prompts: str | Sequence[str],
    sampling: SamplerConfig | None = None,
    max_new_tokens: int = 50,
    seed: int = 0,
    stop_at_eos: bool = True,
    compile: bool = False,
) -> list[Completion]:
    """Continuations of one prompt or a batch (greedy when ``sampling`` is None), stopping at the end-of-text token
    if any."""
    texts = [prompts] if isinstance(prompts, str) else list(prompts)  # generate() refuses none and empty ones
    ids, unknown = encode_prompts(model, texts)
    eos_id = model.eos_id if stop_at_eos else None
    res = generate(model, ids, max_new_tokens, sampler=sampling, seed=seed, eos_id=eos_id, compile=compile)
    return [
        Completion(t, model.decode(new), p, new, fin, unk)
        for t, p, new, fin, unk in zip(texts, ids, res.tokens, res.finished, unknown, strict=True)
    ]


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
