"""Text in, text out: prompts are encoded with the model's tokenizer, generated as one left-padded batch."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from .generate import generate
from .runner import engine_model
from .samplers import SamplerConfig

if TYPE_CHECKING:  # pragma: no cover
    from ..model.load import Model


@dataclass
class Completion:
    """One prompt's continuation."""

    prompt: str
    text: str
    prompt_ids: list[int]
    token_ids: list[int]
    finished: str  # "length" | "eos"
    unknown_chars: list[str]  # prompt characters the vocabulary lacks (they became the unknown token)


def complete(
    model: "Model",
    prompts: str | Sequence[str],
    sampling: SamplerConfig | None = None,
    max_new_tokens: int = 50,
    seed: int = 0,
    stop_at_eos: bool = True,
    compile: bool = False,
) -> list[Completion]:
    """Generate after each prompt (greedy when ``sampling`` is None); stops at the end-of-text token if any."""
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not texts or any(not t for t in texts):
        raise ValueError("prompts must be non-empty strings")
    tok = model._require_tokenizer()
    unknown = [tok.unknown_chars(t) for t in texts]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown characters are reported in Completion.unknown_chars
        ids = [tok.encode(t) for t in texts]
    res = generate(
        engine_model(model),
        ids,
        max_new_tokens,
        sampler=sampling,
        seed=seed,
        eos_id=model.eos_id if stop_at_eos else None,
        compile=compile,
    )
    return [
        Completion(t, tok.decode(new), p, new, fin, unk)
        for t, p, new, fin, unk in zip(texts, ids, res.tokens, res.finished, unknown, strict=True)
    ]
