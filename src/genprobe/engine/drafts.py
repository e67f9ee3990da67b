"""What proposes tokens for speculative decoding: prompt lookup, a smaller model, or the target's own first layers.

A draft's ``propose(context, k, chooser)`` returns up to ``k`` tokens and, for a model, the distribution ``q`` each
was drawn from (the processed distribution of the same sampler chain as the target's); prompt lookup proposes
deterministically (``q`` a point mass, None). ``rollback(context)`` forgets cached tokens that are no longer the
context's (a rejected proposal). :class:`CachedModel` is a runner with its one-row cache and the tokens it holds.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Protocol, Sequence

import torch

from .runner import ModelLike, Runner, device_of, runner_for


class Chooser(Protocol):
    """How a speculative round turns logits into tokens (the decoder: sampler chain + its draws)."""

    def pick(self, logits: torch.Tensor, context: Sequence[int]) -> tuple[int, torch.Tensor | None]:
        """(token, the distribution it was drawn from or None when greedy) after ``context``."""


class Draft(Protocol):
    """What proposes tokens (:class:`PromptLookupDraft`, :class:`ModelDraft`, a verifier's mutant)."""

    name: str

    @property
    def forwards(self) -> int:
        """Forward calls so far."""

    def start(self, capacity: int) -> None:
        """Get ready for one generation of up to ``capacity`` tokens."""

    def propose(self, context: Sequence[int], k: int, chooser: Chooser) -> tuple[list[int], list[torch.Tensor] | None]:
        """Up to ``k`` tokens after ``context`` and the distributions they were drawn from (None: point masses)."""

    def rollback(self, context: Sequence[int]) -> None:
        """Forget cached tokens ``context`` does not continue."""


class CachedModel:
    """A runner driving one row of tokens through its own cache; ``tokens`` = what the cache holds."""

    def __init__(self, runner: Runner, capacity: int):
        self.runner = runner
        self.state = runner.new_state(1, capacity)
        self.tokens: list[int] = []
        self.forwards = 0  # forward calls
        self.device = device_of(runner)

    def feed(self, new: Sequence[int]) -> torch.Tensor:
        """Logits (T, V) of ``new`` appended to the cached tokens, in one forward."""
        ids = torch.tensor([list(new)], dtype=torch.long, device=self.device)
        logits: torch.Tensor = self.runner.step(ids, None, self.state)[0]
        self.tokens.extend(int(t) for t in new)
        self.forwards += 1
        return logits.float()

    def catch_up(self, context: Sequence[int], extra: Sequence[int] = ()) -> torch.Tensor:
        """Feed what ``context`` + ``extra`` holds beyond the cache; logits of those positions."""
        return self.feed([*context[len(self.tokens) :], *extra])

    def keep_for(self, context: Sequence[int]) -> int:
        """How many cached tokens stay valid for ``context``: the common prefix, short of the last (pending) one."""
        n = 0
        limit = min(len(self.tokens), len(context) - 1)
        while n < limit and self.tokens[n] == context[n]:
            n += 1
        return n

    def rollback(self, context: Sequence[int]) -> None:
        """Drop the cached tokens ``context`` does not continue (the cache truncated, the bookkeeping with it)."""
        keep = self.keep_for(context)
        if keep < len(self.tokens):
            self.state.truncate(keep)
            del self.tokens[keep:]


class PromptLookupDraft:
    """Prompt lookup decoding (transformers' ``PromptLookupCandidateGenerator``, ``prompt_lookup_num_tokens``):
    the last ``max_ngram`` .. 1 tokens are searched for earlier in the context, and the tokens that followed the
    first match are proposed. Deterministic: ``q`` is a point mass on each proposed token."""

    name = "prompt-lookup"

    def __init__(self, max_ngram: int = 2):
        if max_ngram < 1:
            raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
        self.max_ngram = max_ngram
        self.forwards = 0

    def start(self, capacity: int) -> None:
        """Nothing to allocate."""

    def propose(self, context: Sequence[int], k: int, chooser: Chooser) -> tuple[list[int], list[torch.Tensor] | None]:
        n = len(context)
        for size in range(min(self.max_ngram, n - 1), 0, -1):
            tail = list(context[n - size :])
            for start in range(n - size):  # earliest match first, as transformers' match_indices
                if list(context[start : start + size]) == tail and start + size < n:
                    return [int(t) for t in context[start + size : min(start + size + k, n)]], None
        return [], None

    def rollback(self, context: Sequence[int]) -> None:
        """Nothing cached."""


class ModelDraft:
    """A smaller model with the target's vocabulary proposes ``k`` tokens, one cached forward each."""

    def __init__(self, model: ModelLike, name: str = "model"):
        self.runner = runner_for(model)
        self.name = name
        self.cached: CachedModel | None = None

    @property
    def forwards(self) -> int:
        return 0 if self.cached is None else self.cached.forwards

    def start(self, capacity: int) -> None:
        """A fresh cache for one generation."""
        self.cached = CachedModel(self.runner, capacity)

    def propose(self, context: Sequence[int], k: int, chooser: Chooser) -> tuple[list[int], list[torch.Tensor] | None]:
        assert self.cached is not None, "start() first"
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        logits = self.cached.catch_up(context)[-1]
        for j in range(k):
            x, q = chooser.pick(logits, [*context, *tokens])
            tokens.append(x)
            if q is not None:
                qs.append(q)
            if j < k - 1:
                logits = self.cached.feed([x])[-1]
        return tokens, (qs if qs else None)

    def rollback(self, context: Sequence[int]) -> None:
        if self.cached is not None:
            self.cached.rollback(context)


def first_layers(model: ModelLike, n_layer: int) -> Runner:
    """A copy of ``model`` (a genprobe GPT or a Llama-family transformers model) keeping its first ``n_layer`` blocks
    and its final norm and head, as a runner: the self-speculative draft (an early exit)."""
    from ..model.gpt import GPT

    runner = runner_for(model)
    hf = getattr(runner, "model", None)  # GPTRunner and HFCausalLM hold the module they drive
    if isinstance(hf, GPT):
        total = hf.cfg.n_layer
        _check_layers(n_layer, total)
        out = copy.deepcopy(hf)
        out.h = out.h[:n_layer]
        out.cfg = dataclasses.replace(out.cfg, n_layer=n_layer)
        return runner_for(out.eval())
    inner = getattr(hf, "model", None)
    if hf is None or inner is None or not hasattr(inner, "layers"):
        raise ValueError(
            f"a first-layers draft needs a genprobe GPT or a Llama-family model, got {type(runner).__name__}"
        )
    _check_layers(n_layer, len(inner.layers))
    from .hf_adapter import HFCausalLM

    small = copy.deepcopy(hf)
    small.model.layers = small.model.layers[:n_layer]
    small.config.num_hidden_layers = n_layer
    if getattr(small.config, "layer_types", None):
        small.config.layer_types = small.config.layer_types[:n_layer]
    return HFCausalLM(small)


def _check_layers(n_layer: int, total: int) -> None:
    if not 1 <= n_layer < total:
        raise ValueError(f"a first-layers draft keeps 1 .. {total - 1} of the target's {total} layers, got {n_layer}")
