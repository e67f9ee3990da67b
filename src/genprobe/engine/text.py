"""Text in, text out: prompts are encoded with the model's tokenizer, generated as one left-padded batch."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

from ..model.load import Model
from .generate import generate
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
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not texts or any(not t for t in texts):
        raise ValueError("prompts must be non-empty strings")
    ids, unknown = encode_prompts(model, texts)
    eos_id = model.eos_id if stop_at_eos else None
    res = generate(model, ids, max_new_tokens, sampler=sampling, seed=seed, eos_id=eos_id, compile=compile)
    return [
        Completion(t, model.decode(new), p, new, fin, unk)
        for t, p, new, fin, unk in zip(texts, ids, res.tokens, res.finished, unknown, strict=True)
    ]
