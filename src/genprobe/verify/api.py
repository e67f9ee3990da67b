"""``genprobe.verify_cache``: the verifier on a loaded :class:`~genprobe.model.load.Model`, one call, one report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence, cast

import torch

from .compare import Thresholds
from .mutants import DEFAULT_PROMPT
from .report import VerifyReport

if TYPE_CHECKING:  # pragma: no cover
    from ..model.gpt import GPT
    from ..model.load import Model

DEFAULT_PROMPTS = (DEFAULT_PROMPT, "白日依山盡")  # the chapter's prompt (§3.9.1) and a second of another length


def default_prompts(model: "Model", max_new_tokens: int, vocab_size: int | None = None) -> list[list[int]]:
    """Two Tang openings for a character-level genprobe model; else three random id prompts of different lengths."""
    if model is not None and model.kind == "genprobe" and model.tokenizer is not None:
        return [model.encode(t) for t in DEFAULT_PROMPTS]
    vocab = vocab_size if vocab_size is not None else model.vocab_size
    max_pos = None if model is None else model.max_positions
    return random_prompts(int(vocab), max_pos, max_new_tokens)


def random_prompts(vocab: int, max_positions: int | None, steps: int, seed: int = 0) -> list[list[int]]:
    """Up to three seeded random prompts of distinct lengths (≤ 8) that leave room for ``steps`` new tokens."""
    room = 8 if max_positions is None else max(1, min(8, max_positions - steps))
    lengths = sorted({room, max(1, room * 5 // 8), max(1, room * 3 // 8)}, reverse=True)
    g = torch.Generator().manual_seed(seed)
    lo = 1 if vocab > 2 else 0
    return [torch.randint(lo, vocab, (n,), generator=g).tolist() for n in lengths]


def _gpt(model: "Model") -> GPT:
    """The module of a ``kind == "genprobe"`` model, which :class:`Model` only gives that kind for a GPT."""
    return cast("GPT", model.module)


def reference_for(model: "Model", window: int | None = None, sinks: int = 0) -> Any:
    """Full recomputation for ``model``: windowed for a genprobe GPT when ``window`` is given."""
    from .adapters import FullRecompute, HFReference
    from .window import WindowedRecompute

    if model.kind == "genprobe":
        return FullRecompute(_gpt(model)) if window is None else WindowedRecompute(_gpt(model), window, sinks)
    if window is not None:
        raise ValueError(
            "a window applies to a genprobe model's reference; a transformers model's window comes "
            "from its config (sliding_window)"
        )
    return HFReference(model.module)


def own_cache(model: "Model", window: int | None = None, sinks: int = 0, hf_cache: str | None = None) -> Any:
    """The model's own cached path: our engine (optionally windowed), or a ``transformers`` cache class."""
    from .adapters import EngineAdapter, HFAdapter

    if model.kind == "genprobe":
        if hf_cache is not None:
            raise ValueError("hf_cache names a transformers cache class; this is a genprobe model")
        return EngineAdapter(_gpt(model), window=window, sinks=sinks)
    return HFAdapter(model.module, cache=hf_cache)


def verify_cache(
    model: "Model",
    impl: Any = None,
    *,
    prompts: Sequence[str] | Sequence[Sequence[int]] | None = None,
    max_new_tokens: int = 50,
    chunk_sizes: Sequence[int] = (1, 4),
    window: int | None = None,
    sinks: int = 0,
    hf_cache: str | None = None,
    padded_batch: bool = True,
    isolation: bool = True,
    prefix_reuse: bool = True,
    noise_floor: bool = True,
    thresholds: Thresholds | None = None,
) -> VerifyReport:
    """Verify ``impl`` (default: the model's own cache) against full recomputation of ``model``.

    ``impl`` is any object with ``reset()``, ``prefill(ids, attention_mask=None)`` and ``step(ids)``.
    ``prompts`` are texts (encoded with the model's tokenizer) or token-id lists; the default is two
    prompts of different lengths. ``window``/``sinks`` make the reference sliding-window recomputation
    (genprobe models); ``hf_cache`` picks a ``transformers`` cache class (see ``genprobe.verify.hf_caches``).
    ``prefix_reuse`` runs sequences that share prefixes (:mod:`genprobe.verify.reuse`); ``noise_floor``
    judges differences against the reference's own float noise on this model (``thresholds.floor_multiple``).
    """
    from .harness import ReferenceRun, verify_implementation
    from .reuse import REUSE_LENGTH

    if prompts is None:
        ids = default_prompts(model, max_new_tokens)
    else:
        ids = [model.encode(p) if isinstance(p, str) else [int(t) for t in p] for p in prompts]
    target = own_cache(model, window, sinks, hf_cache) if impl is None else impl
    if getattr(target, "cache_kind", None) == "static":
        target.max_cache_len = max(max(len(p) for p in ids) + max_new_tokens, REUSE_LENGTH) + 1
    run = ReferenceRun(reference_for(model, window, sinks), max_new_tokens)
    return verify_implementation(
        target,
        run,
        ids,
        steps=max_new_tokens,
        chunk_sizes=chunk_sizes,
        padded_batch=padded_batch,
        thresholds=thresholds,
        pad_id=model.pad_id,
        isolation=isolation,
        prefix_reuse=prefix_reuse,
        noise_floor=noise_floor,
    )
