"""User-side implementations for the ``verify-cache --impl`` tests (imported by module path).

They use nothing of genprobe's verifier: a user writes an object with reset/prefill/step.
"""

from __future__ import annotations

import torch


class Recompute:
    """Correct by construction: keeps the token history and recomputes it on every call."""

    def __init__(self, model):
        self.model = model.eval()

    def reset(self):
        self.ids = None

    @torch.no_grad()
    def prefill(self, ids, attention_mask=None):
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise NotImplementedError("no padding support")
        self.ids = ids
        return self.model(ids)

    @torch.no_grad()
    def step(self, ids):
        self.ids = torch.cat([self.ids, ids], dim=1)
        return self.model(self.ids)[:, -ids.shape[1] :]


class Forgetful(Recompute):
    """Broken: each step sees only the new tokens (a cache that is never read)."""

    @torch.no_grad()
    def step(self, ids):
        past = self.ids.shape[1]
        self.ids = torch.cat([self.ids, ids], dim=1)
        positions = torch.arange(past, past + ids.shape[1]).expand_as(ids)
        return self.model(ids, positions=positions)


def correct(model):
    """Factory of the correct implementation."""
    return Recompute(model)


def broken(model):
    """Factory of the broken implementation."""
    return Forgetful(model)


def standalone():
    """A model-less factory: the adapter brings its own model and its own reference ``full()``."""
    from genprobe.model import GPT, GPTConfig

    torch.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=40, n_layer=1, n_head=2, d_model=16, d_ff=32, block_size=24)).eval()
    impl = Recompute(model)
    impl.vocab_size = 40
    impl.max_positions = 24
    impl.full = lambda ids, attention_mask=None: model(ids, attention_mask=attention_mask)
    return impl


def not_an_impl():
    """Returns something without reset/prefill/step."""
    return object()


NOT_CALLABLE = 42


def hf_cached(model):
    """A transformers model driven through its own cache (for ``--impl ... --model HF_DIR``)."""
    from genprobe.verify import HFAdapter

    return HFAdapter(model)


def ReferenceRunLike(model, other):  # noqa: N802 — a factory with too many arguments
    """A bad factory signature."""
    raise AssertionError("never called")
