"""User-side implementations for the ``verify-cache --impl`` tests (imported by module path).

They use nothing of genprobe's verifier: a user writes an object with reset/prefill/step.
"""

from __future__ import annotations

import math

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
    from genprobe.model.config import GPTConfig
    from genprobe.model.gpt import GPT

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
    from genprobe.verify.adapters import HFAdapter

    return HFAdapter(model)


def ReferenceRunLike(model, other):  # noqa: N802 — a factory with too many arguments
    """A bad factory signature."""
    raise AssertionError("never called")


# ---- a user's own list-and-cat cache over a genprobe GPT (learned positions), written from scratch ------
class ListCache:
    """Per-layer K/V lists grown with ``torch.cat``, keys' absolute positions kept beside them.

    ``window``/``sinks``: a sliding-window cache. After each call it evicts what no later query can
    see: ``evict="window"`` keeps the first ``sinks`` positions and the last ``window``; ``evict="fifo"``
    keeps the last ``sinks + window`` entries whatever they are — the same memory, but the sinks are
    evicted first (the wrong eviction order). ``leak=True``: ``reset()`` forgets to empty the lists.
    """

    def __init__(self, model, window=None, sinks=0, evict="window", leak=False):
        self.model, self.window, self.sinks, self.evict, self.leak = model.eval(), window, sinks, evict, leak
        self.max_positions = model.cfg.block_size
        self.k = self.v = self.kpos = None
        self.reset()

    def reset(self):
        self.past = 0
        if not self.leak or self.k is None:  # the leak: lists survive reset() after the first sequence
            n = len(self.model.h)
            self.k, self.v, self.kpos = [None] * n, [None] * n, None

    def prefill(self, ids, attention_mask=None):
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise NotImplementedError("no padding support")
        return self.step(ids)

    @torch.no_grad()
    def step(self, ids):
        m = self.model
        B, T = ids.shape
        H = m.cfg.n_head
        pos = torch.arange(self.past, self.past + T)
        kpos = pos if self.kpos is None else torch.cat([self.kpos, pos])
        dist = pos[:, None] - kpos[None, :]
        allow = dist >= 0
        if self.window is not None:
            allow &= (dist < self.window) | (kpos[None, :] < self.sinks)
        x = m.wte(ids) + m.wpe(pos.expand(B, T))
        for i, block in enumerate(m.h):
            q, k, v = block.attn.c_attn(block.ln_1(x)).split(m.cfg.d_model, dim=2)
            q, k, v = (t.view(B, T, H, -1).transpose(1, 2) for t in (q, k, v))
            K = k if self.k[i] is None else torch.cat([self.k[i], k], dim=2)
            V = v if self.v[i] is None else torch.cat([self.v[i], v], dim=2)
            self.k[i], self.v[i] = K, V
            att = (q @ K.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            y = torch.softmax(att.masked_fill(~allow, float("-inf")), dim=-1) @ V
            x = x + block.attn.c_proj(y.transpose(1, 2).reshape(B, T, -1))
            x = x + block.mlp(block.ln_2(x))
        self.kpos, self.past = kpos, self.past + T
        self._evict()
        return m.lm_head(m.ln_f(x))

    def _evict(self):
        if self.window is None:
            return
        if self.evict == "window":
            keep = (self.kpos < self.sinks) | (self.kpos > self.kpos.max() - self.window)
        else:  # fifo: the last sinks + window entries
            keep = torch.arange(len(self.kpos)) >= len(self.kpos) - (self.sinks + self.window)
        self.k = [K[:, :, keep] for K in self.k]
        self.v = [V[:, :, keep] for V in self.v]
        self.kpos = self.kpos[keep]


def list_cache(model):
    """The correct list-and-cat cache, no window."""
    return ListCache(model)


def leaky(model):
    """reset() forgets the K/V lists: the previous sequence's keys stay visible."""
    return ListCache(model, leak=True)


def window8_sinks2(model):
    """A correct sliding-window cache: window 8, 2 sinks (verify with --window 8 --sinks 2)."""
    return ListCache(model, window=8, sinks=2)


def window8_sinks2_fifo(model):
    """The same memory, wrong eviction order: the sinks are evicted first."""
    return ListCache(model, window=8, sinks=2, evict="fifo")


class Crashy(Recompute):
    """Correct, except that a multi-token step (a chunk) raises."""

    def step(self, ids):
        if ids.shape[1] > 1:
            raise RuntimeError("chunked steps are not implemented in this kernel")
        return super().step(ids)


def crashy(model):
    """Raises inside chunked steps only."""
    return Crashy(model)


def factory_raises(model):
    """The factory itself fails."""
    raise OSError("cannot open /dev/accelerator0")


class NaNSteps(Recompute):
    """Returns NaN logits from the third decode step on."""

    def step(self, ids):
        out = super().step(ids)
        return out * float("nan") if self.ids.shape[1] >= 10 else out


def nan_steps(model):
    """NaN logits at later steps."""
    return NaNSteps(model)
