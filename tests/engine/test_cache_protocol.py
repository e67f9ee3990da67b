"""The explicit cache contract (``CacheLike``) GPT.forward codes against, and the mask it lets a step skip."""

from __future__ import annotations

import pytest
import torch

from genprobe.engine.cache import KVCache
from genprobe.engine.fast.static_cache import StaticKVCache
from genprobe.engine.runner import forward_step
from genprobe.model.cache_protocol import CacheLike
from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT


@pytest.mark.parametrize("cls", [KVCache, StaticKVCache])
def test_both_caches_implement_the_protocol(cls, tiny_cfg):
    assert isinstance(cls.for_model(tiny_cfg, 1), CacheLike)


def test_decode_mask_free_tracks_padding_and_explicit_positions(tiny_model):
    """The flag is what lets a plain decode step skip its mask: it must drop on padding or explicit positions."""
    with torch.inference_mode():
        plain = KVCache.for_model(tiny_model.cfg, 1)
        forward_step(tiny_model, torch.tensor([[1, 2, 3]]), plain)
        assert plain.decode_mask_free
        padded = KVCache.for_model(tiny_model.cfg, 1)
        forward_step(tiny_model, torch.tensor([[0, 2, 3]]), padded, attention_mask=torch.tensor([[0, 1, 1]]))
        assert not padded.decode_mask_free
        explicit = KVCache.for_model(tiny_model.cfg, 1)
        forward_step(tiny_model, torch.tensor([[1, 2, 3]]), explicit, positions=torch.tensor([[0, 1, 2]]))
        assert not explicit.decode_mask_free
        plain.reset()
        assert plain.decode_mask_free
    assert not StaticKVCache.for_model(tiny_model.cfg, 1).decode_mask_free  # unwritten slots: always masked


def test_decode_after_explicit_later_positions_masks_the_later_key():
    """Keys written at explicit positions later than the next default one must stay invisible to it.

    Prefill at positions [0, 1, 2, 10]; the next default position is 4 (the cache counts tokens). Full
    recomputation with positions [0, 1, 2, 10, 4] hides the key at 10 from the query at 4; a cache that
    skipped the mask (because it ignored ``explicit_positions``) would let it see that key.
    """
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=32)).eval()
    with torch.no_grad():  # trained-scale logits, so a visible extra key shows (see tests/verify/conftest.py)
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    pos = torch.tensor([[0, 1, 2, 10, 4]])

    def decode(cache: KVCache, forget_explicit: bool) -> torch.Tensor:
        forward_step(model, ids[:, :4], cache, positions=pos[:, :4])
        if forget_explicit:  # the bug this guards against: a cache that ignores explicit_positions
            cache.default_positions_only = True
        return forward_step(model, ids[:, 4:], cache)[:, -1]  # default position: 4

    with torch.inference_mode():
        full = model(ids, positions=pos)[:, -1]
        step = decode(KVCache.for_model(model.cfg, 1), forget_explicit=False)
        leaky = decode(KVCache.for_model(model.cfg, 1), forget_explicit=True)
    assert float((step - full).abs().max()) < 1e-4
    assert float((leaky - full).abs().max()) > 1e-2  # skipping the mask would be caught
