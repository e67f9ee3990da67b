"""Padding-leak test: flags HF GPT-2 left padding without position_ids, passes with them; our engine passes."""

import pytest
import torch

from genprobe._io import json_safe
from genprobe.attention.leak import padding_leak

SEQS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [3, 4, 5, 6, 7, 8, 9, 10, 11]]


@pytest.fixture(scope="module")
def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=50, n_positions=32, n_embd=32, n_layer=2, n_head=2, n_inner=64, bos_token_id=None, eos_token_id=None
    )
    return GPT2LMHeadModel(cfg).eval()


def test_gpt2_left_padding_without_position_ids_leaks(tiny_gpt2):
    rep = padding_leak(tiny_gpt2, SEQS, pad_id=0, position_ids=False)
    assert rep.leak
    assert max(s.delta["left"] for s in rep.sequences) > 1e-2
    assert max(s.delta["right"] for s in rep.sequences) < 1e-4  # right padding keeps positions intact
    assert json_safe(rep)["verdict"] == "LEAK"


def test_gpt2_with_position_ids_passes(tiny_gpt2):
    rep = padding_leak(tiny_gpt2, SEQS, pad_id=0, position_ids=True)
    assert not rep.leak
    assert rep.max_delta < 1e-4


def test_our_engine_passes_either_way(tiny_model):
    for pos in (True, False):
        rep = padding_leak(tiny_model, SEQS, pad_id=0, position_ids=pos)
        assert not rep.leak and rep.max_delta < 1e-4


def test_dropping_the_mask_is_flagged(tiny_model, monkeypatch):
    """A forward that ignores the attention mask must be caught (the check is not vacuous)."""
    from genprobe.attention import leak as leak_mod

    monkeypatch.setattr(leak_mod, "_logits", lambda model, ids, mask, pos: model(ids).detach().float())
    rep = padding_leak(tiny_model, SEQS, pad_id=0)
    assert rep.leak
    assert max(s.delta["left"] for s in rep.sequences) > 1e-2


def test_bad_input(tiny_model):
    with pytest.raises(ValueError, match="empty"):
        padding_leak(tiny_model, [[1, 2], []], pad_id=0)
    with pytest.raises(ValueError, match="exceeds"):
        padding_leak(tiny_model, [list(range(1, 32))], pad_id=0)


def test_only_a_learned_position_table_limits_the_padded_width():
    """GPTConfig.max_positions: block_size for learned positions, None (no limit) for RoPE / ALiBi / none."""
    from genprobe.model.config import GPTConfig
    from genprobe.model.gpt import GPT

    seq = [list(range(1, 32))]  # 31 tokens + 2 pads = 33 > block_size 32
    for pe, limit in (("learned", 32), ("rope", None), ("alibi", None), ("none", None)):
        cfg = GPTConfig(vocab_size=50, n_layer=1, n_head=2, d_model=16, d_ff=32, block_size=32, pos_encoding=pe)
        assert cfg.max_positions == limit
        torch.manual_seed(0)
        model = GPT(cfg).eval()
        if limit is None:
            assert not padding_leak(model, seq, pad_id=0).leak
        else:
            with pytest.raises(ValueError, match="exceeds the model's 32 positions"):
                padding_leak(model, seq, pad_id=0)
