"""Speculative decoding (genprobe.engine.speculative): greedy output is plain greedy's, token for token, on the
trained char GPT and on a tiny transformers Llama (whose DynamicCache is cropped on rejection); the rejection rule's
pieces on hand-made distributions; bad input is a one-line error."""

from __future__ import annotations

import pytest
import torch

from genprobe.engine.cache import KVCache
from genprobe.engine.generate import generate
from genprobe.engine.hf_adapter import HFCausalLM
from genprobe.engine.speculative import SpeculativeDecoder, make_draft, speculative_generate
from genprobe.model.checkpoint import load_checkpoint
from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT

LOOPY = "春眠不覺曉，處處聞啼鳥。春眠不覺曉，處處"


@pytest.fixture(scope="module")
def char_gpt(trained_ckpt):
    model, tok, _ = load_checkpoint(trained_ckpt)
    return model.eval(), tok


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
    )
    return HFCausalLM(LlamaForCausalLM(cfg).eval())


@pytest.mark.parametrize("draft", ["lookup", "layers:1"])
def test_greedy_is_plain_greedy_on_the_char_gpt(char_gpt, draft):
    model, tok = char_gpt
    for text in (LOOPY, "白日依山盡"):
        ids = tok.encode(text)
        plain = generate(model, [ids], 30).tokens[0]
        spec = speculative_generate(model, ids, 30, draft=draft, k=3)
        assert spec.tokens == plain
        assert spec.stats.tokens == 30 and spec.stats.rounds < 30  # some drafts were kept: fewer target forwards
    assert spec.stats.drafted > spec.stats.accepted  # ... and some rejected: the rollback ran


@pytest.mark.parametrize("draft", ["lookup", "layers:1"])
def test_greedy_is_plain_greedy_on_a_transformers_llama(tiny_llama, draft):
    pattern = [5, 9, 17, 33, 2, 40]
    for ids in (pattern * 3 + pattern[:2], [7, 1, 60, 22, 13]):
        plain = generate(tiny_llama, [ids], 24).tokens[0]
        spec = speculative_generate(tiny_llama, ids, 24, draft=draft, k=4)
        assert spec.tokens == plain


def test_eos_stops_the_run(char_gpt):
    model, tok = char_gpt
    ids = tok.encode(LOOPY)
    plain = generate(model, [ids], 30).tokens[0]
    eos = plain[5]
    spec = speculative_generate(model, ids, 30, draft="lookup", k=4, eos_id=eos)
    assert spec.finished == "eos" and spec.tokens == plain[: plain.index(eos) + 1]


def test_rejection_rule_pieces():
    dec = SpeculativeDecoder(GPT(GPTConfig(vocab_size=8, n_layer=1, n_head=1, d_model=8, d_ff=8)), "lookup")
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.25, 0.6, 0.15, 0.0])
    assert dec.accept_prob(p, q, 0) == 1.0  # p >= q: always kept
    assert dec.accept_prob(p, q, 1) == pytest.approx(0.5)  # p / q
    assert dec.accept_prob(p, p, 1) == 1.0  # a tie is kept
    r = dec.residual(p, q)
    assert torch.allclose(r, torch.tensor([0.25, 0.0, 0.05, 0.0]) / 0.30)  # norm(max(0, p - q))
    assert torch.equal(dec.residual(p, p), p)  # p = q: nothing left to correct (never reached: no rejection)
    # the rejection rule's identity: q(x) min(1, p/q) + P(reject) r(x) = p(x)
    reject = sum(float(q[x]) * (1 - dec.accept_prob(p, q, x)) for x in range(4) if q[x] > 0)
    for x in range(4):
        kept = float(q[x]) * (dec.accept_prob(p, q, x) if q[x] > 0 else 0.0)
        assert kept + reject * float(r[x]) == pytest.approx(float(p[x]))


def test_kv_cache_truncate_forgets_the_dropped_slots():
    cache = KVCache(n_layer=1, batch_size=1, n_head=1, d_head=2, max_len=8)
    cache.reserve(cache.default_positions(5), None)
    cache.commit()
    cache.truncate(3)
    assert cache.seen == 3 and int(cache.next_pos) == 3 and not bool(cache.valid[0, 3:5].any())
    with pytest.raises(ValueError, match="cannot keep 4 tokens of a cache holding 3"):
        cache.truncate(4)


def test_bad_input_is_one_line(char_gpt):
    model, tok = char_gpt
    ids = tok.encode("白日")
    with pytest.raises(ValueError, match=r"k \(tokens proposed per round\) must be an integer >= 1, got 0"):
        speculative_generate(model, ids, 4, k=0)
    other = GPT(GPTConfig(vocab_size=50, n_layer=1, n_head=1, d_model=8, d_ff=8))
    with pytest.raises(ValueError, match=r"the draft's vocabulary \(50 tokens\) is not the target's \(1202\)"):
        make_draft(model, other)
    big = GPT(GPTConfig(vocab_size=1202, n_layer=3, n_head=4, d_model=128, d_ff=256, block_size=64))
    with pytest.raises(ValueError, match="is larger than the target"):
        make_draft(model, big)
    with pytest.raises(ValueError, match="keeps 1 .. 1 of the target's 2 layers, got 2"):
        make_draft(model, "layers:2")
    from genprobe.engine.samplers.stages import SamplerConfig

    with pytest.raises(ValueError, match="cannot use XTC"):
        speculative_generate(model, ids, 4, sampler=SamplerConfig(xtc_probability=0.5, xtc_threshold=0.1))
