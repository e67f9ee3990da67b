"""Cache equivalence, batched left padding, context limits, token-forward counts and the generate loop."""

from __future__ import annotations

import pytest
import torch

from genprobe._io import json_safe
from genprobe.engine.cache import KVCache
from genprobe.engine.generate import generate
from genprobe.engine.runner import GenerationResult, forward_step
from genprobe.engine.samplers.stages import SamplerConfig
from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT

TOL = 1e-4


def _ids(n: int, V: int, seed: int = 0, B: int = 1) -> torch.Tensor:
    return torch.randint(2, V, (B, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def default_model() -> GPT:
    """A random model with the seed's default shape (2 layers, 4 heads, d 128, vocab 1202, context 64)."""
    torch.manual_seed(1)
    return GPT(GPTConfig()).eval()


# ---- cache equivalence ---------------------------------------------------------------------
@pytest.mark.parametrize("which", ["tiny", "default"])
def test_prefill_through_cache_is_bit_identical(which, tiny_model, default_model):
    model = tiny_model if which == "tiny" else default_model
    ids = _ids(20, model.cfg.vocab_size, B=3)
    with torch.inference_mode():
        full = model(ids)
        cache = KVCache.for_model(model.cfg, 3)
        cached = forward_step(model, ids, cache)
    assert torch.equal(cached, full)
    assert cache.length == 20


def test_incremental_decoding_matches_full_recomputation_every_step(default_model, record_property):
    model = default_model
    ids = _ids(60, model.cfg.vocab_size, seed=3, B=2)
    P = 7
    worst = 0.0
    with torch.inference_mode():
        full = model(ids)
        cache = KVCache.for_model(model.cfg, 2)
        out = forward_step(model, ids[:, :P], cache)
        assert torch.equal(out, model(ids[:, :P]))  # bit-identical on the same ids
        worst = float((out - full[:, :P]).abs().max())  # a longer uncached forward blocks its matmuls differently
        for t in range(P, ids.shape[1]):
            step = forward_step(model, ids[:, t : t + 1], cache)[:, 0]
            d = float((step - full[:, t]).abs().max())
            assert d < TOL, f"step {t}: |Δlogit| {d}"
            worst = max(worst, d)
    record_property("max_abs_dlogit_incremental", worst)
    assert 0 <= worst < TOL


def test_chunked_prefill_chunks_of_four(default_model, record_property):
    model = default_model
    ids = _ids(50, model.cfg.vocab_size, seed=4, B=2)
    with torch.inference_mode():
        full = model(ids)
        cache = KVCache.for_model(model.cfg, 2)
        parts = [forward_step(model, ids[:, s : s + 4], cache) for s in range(0, 50, 4)]
    got = torch.cat(parts, dim=1)
    worst = float((got - full).abs().max())
    record_property("max_abs_dlogit_chunked", worst)
    assert worst < TOL


def test_sliding_window_at_least_as_long_as_sequence_equals_full_cache(tiny_model):
    ids = _ids(24, tiny_model.cfg.vocab_size, seed=5)
    with torch.inference_mode():
        a = KVCache.for_model(tiny_model.cfg, 1)
        b = KVCache.for_model(tiny_model.cfg, 1, window=24)
        c = KVCache.for_model(tiny_model.cfg, 1, window=20, sinks=4)

        def run(cache: KVCache) -> list[torch.Tensor]:
            first = forward_step(tiny_model, ids[:, :5], cache)  # the prompt must go in before the steps
            return [first] + [forward_step(tiny_model, ids[:, t : t + 1], cache) for t in range(5, 24)]

        ra, rb, rc = run(a), run(b), run(c)
    for x, y, z in zip(ra, rb, rc, strict=True):
        assert torch.equal(x, y) and torch.equal(x, z)


def test_window_with_sinks_keeps_sinks_plus_newest_and_attends_to_exactly_those():
    """Documented behaviour: after wrap-around the cache holds the first ``sinks`` tokens and the newest
    ``window`` ones. With one layer the keys depend only on (token, position), so the last logits must equal
    an uncached forward over exactly those tokens at their absolute positions."""
    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=40, n_layer=1, n_head=2, d_model=32, d_ff=64, block_size=64)).eval()
    ids = _ids(30, 40, seed=6)
    W, S = 8, 2
    with torch.inference_mode():
        cache = KVCache.for_model(model.cfg, 1, window=W, sinks=S)
        forward_step(model, ids[:, : S + W], cache)
        for t in range(S + W, 30):
            last = forward_step(model, ids[:, t : t + 1], cache)[0, -1]
            kept = list(range(S)) + list(range(t - W + 1, t + 1))
            assert sorted(cache.pos[0].tolist()) == kept
            assert bool(cache.valid.all())
            ref = model(ids[:, kept], positions=torch.tensor([kept]))[0, -1]
            assert float((last - ref).abs().max()) < 1e-5
            # and it really differs from full attention (the window matters)
            assert float((last - model(ids[:, : t + 1])[0, -1]).abs().max()) > 1e-4


# ---- batched left padding ------------------------------------------------------------------
def test_left_padded_batch_matches_each_prompt_alone(trained):
    model, tok, _ = trained
    texts = ["明月光", "白日依山盡，黃河入海流", "春風"]
    prompts = [tok.encode(t) for t in texts]
    batch = generate(model, prompts, 20, return_logits=True)
    for b, p in enumerate(prompts):
        alone = generate(model, [p], 20, return_logits=True)
        assert alone.tokens[0] == batch.tokens[b]
        assert tok.decode(alone.tokens[0]) == tok.decode(batch.tokens[b])
        worst = max(float((x[0] - y[b]).abs().max()) for x, y in zip(alone.step_logits, batch.step_logits, strict=True))
        assert worst < 1e-5, (texts[b], worst)


def test_left_padded_batch_naive_mode_and_sampling_rows_match(tiny_model):
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    cfg = SamplerConfig(temperature=0.9, top_k=10, repetition_penalty=1.2, no_repeat_ngram=2)
    a = generate(tiny_model, prompts, 12, mode="naive", return_logits=True)
    b = generate(tiny_model, prompts, 12, mode="cached", return_logits=True)
    assert a.tokens == b.tokens
    assert max(float((x - y).abs().max()) for x, y in zip(a.step_logits, b.step_logits, strict=True)) < TOL
    # penalties see only real tokens: a padded row draws like the row alone with the same greedy history
    g = SamplerConfig(greedy=True, repetition_penalty=1.5, no_repeat_ngram=2)
    batch = generate(tiny_model, prompts, 12, sampler=g)
    for i, p in enumerate(prompts):
        assert generate(tiny_model, [p], 12, sampler=g).tokens[0] == batch.tokens[i]
    first, again = (generate(tiny_model, prompts, 12, sampler=cfg, seed=3) for _ in range(2))
    assert first.tokens == again.tokens


# ---- limits and validation -----------------------------------------------------------------
def test_context_overflow_raises_before_generating_naming_the_limit(tiny_model):
    calls = []
    with pytest.raises(ValueError, match=r"context length 32") as exc:
        generate(tiny_model, [[3] * 10], 23, on_token=lambda i, t: calls.append(i))
    assert "block_size" in str(exc.value) and "22" in str(exc.value)  # says how many new tokens would fit
    assert calls == []
    assert len(generate(tiny_model, [[3] * 10], 22).tokens[0]) == 22  # exactly at the limit is fine


def test_forward_step_overflow_is_a_value_error_not_index_error(tiny_model):
    cache = KVCache.for_model(tiny_model.cfg, 1, max_len=40)
    with pytest.raises(ValueError, match="context length"):
        forward_step(tiny_model, torch.ones(1, 33, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="context length.*32"):
        forward_step(tiny_model, torch.ones(1, 1, dtype=torch.long), positions=torch.tensor([[32]]))


@pytest.mark.parametrize(
    "prompts, n, kw, needle",
    [
        ([], 5, {}, "prompts is empty"),
        ([[]], 5, {}, "prompt 0 is empty"),
        ([[1, 2]], 0, {}, "max_new_tokens"),
        ([[1, 99]], 3, {}, r"outside \[0, 50\)"),
        ([[1, 2]], 3, {"mode": "fast"}, "mode"),
    ],
)
def test_bad_generate_arguments(tiny_model, prompts, n, kw, needle):
    with pytest.raises(ValueError, match=needle):
        generate(tiny_model, prompts, n, **kw)


# ---- accounting ----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["naive", "cached"])
def test_token_forward_counts_are_exact(tiny_model, mode):
    r = generate(tiny_model, [[4, 5, 6, 7, 8, 9, 10]], 20, mode=mode)
    # the seed's formulas (§3.3.2): naive Σ(P+i) = 1,060 for P=7, N=40; cached P+N−1 = 46
    expected = sum(7 + i for i in range(20)) if mode == "naive" else 7 + 20 - 1
    assert r.token_forwards == expected
    assert r.forward_calls == 20


def test_eos_stops_rows_and_streams_tokens(tiny_model):
    prompts = [[5, 6, 7], [8, 9]]
    free = generate(tiny_model, prompts, 10)
    eos = free.tokens[0][3]
    seen = []
    r = generate(tiny_model, prompts, 10, eos_id=eos, on_token=lambda i, t: seen.append((i, t)))
    first = free.tokens[0].index(eos)
    assert r.tokens[0] == free.tokens[0][: first + 1] and r.finished[0] == "eos"
    if eos not in free.tokens[1]:
        assert r.tokens[1] == free.tokens[1] and r.finished[1] == "length"
    assert [i for i, _ in seen] == list(range(len(seen)))
    assert all(t[0] == -1 for i, t in seen if i > first)  # finished rows stream -1
    assert [t[1] for _, t in seen][: len(r.tokens[1])] == r.tokens[1]


def test_step_logits_and_probs(tiny_model):
    cfg = SamplerConfig(temperature=0.7, top_p=0.8)
    r = generate(tiny_model, [[3, 4], [5, 6]], 6, sampler=cfg, return_logits=True, return_probs=True, seed=1)
    assert isinstance(r, GenerationResult)
    assert len(r.step_logits) == len(r.step_probs) == 6
    for step, (lg, pr) in enumerate(zip(r.step_logits, r.step_probs, strict=True)):
        assert lg.shape == pr.shape == (2, 50)
        assert torch.allclose(pr.sum(-1), torch.ones(2), atol=1e-5)
        for b in range(2):
            assert pr[b, r.tokens[b][step]] > 0  # every drawn token had non-zero probability
    raw = generate(tiny_model, [[3, 4]], 1, return_logits=True).step_logits[0]
    assert torch.equal(raw, tiny_model(torch.tensor([[3, 4]]))[:, -1])  # RAW model logits
    d = json_safe(r)
    assert d["tokens"] == r.tokens and d["sampler"]["top_p"] == 0.8


def test_same_seed_same_tokens_different_seed_differs(tiny_model):
    cfg = SamplerConfig(temperature=1.5)
    a = generate(tiny_model, [[3, 4, 5]], 20, sampler=cfg, seed=11).tokens
    assert a == generate(tiny_model, [[3, 4, 5]], 20, sampler=cfg, seed=11).tokens
    assert a != generate(tiny_model, [[3, 4, 5]], 20, sampler=cfg, seed=12).tokens


def test_rope_model_generates_beyond_nothing_and_matches_naive():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=30, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=16, pos_encoding="rope")
    m = GPT(cfg).eval()
    prompts = [[3, 4, 5], [6]]
    a = generate(m, prompts, 20, mode="cached", return_logits=True)  # past block_size: RoPE has no table
    b = generate(m, prompts, 20, mode="naive", return_logits=True)
    assert a.tokens == b.tokens
    assert max(float((x - y).abs().max()) for x, y in zip(a.step_logits, b.step_logits, strict=True)) < TOL


def test_decode_after_explicit_positions_still_masks_later_keys(tiny_model):
    """The mask-free decode fast path must not kick in once explicit positions were written: here the
    prefill sits at positions 10..14, so a defaulted decode step (position 5) must see none of them."""
    ids = _ids(6, tiny_model.cfg.vocab_size, seed=9)
    with torch.inference_mode():
        cache = KVCache.for_model(tiny_model.cfg, 1)
        forward_step(tiny_model, ids[:, :5], cache, positions=torch.arange(10, 15)[None])
        got = forward_step(tiny_model, ids[:, 5:], cache)  # default position = 5 real tokens so far
        alone = tiny_model(ids[:, 5:], positions=torch.tensor([[5]]))
    assert torch.allclose(got, alone, atol=1e-6)


@pytest.mark.parametrize("keep", [1, 3, 7])
def test_logits_to_keep_is_the_last_positions_of_the_full_forward(tiny_model, keep):
    """``logits_to_keep`` (transformers' argument of that name) slices before the head: same rows, same cache."""
    ids = torch.tensor([[5, 9, 2, 41, 7, 3, 8], [0, 0, 4, 4, 4, 4, 1]])
    mask = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])
    full_cache, kept_cache = KVCache.for_model(tiny_model.cfg, 2, 16), KVCache.for_model(tiny_model.cfg, 2, 16)
    full = tiny_model(ids, cache=full_cache, attention_mask=mask)
    kept = tiny_model(ids, cache=kept_cache, attention_mask=mask, logits_to_keep=keep)
    assert kept.shape == (2, keep, tiny_model.cfg.vocab_size)
    # The head's product over fewer rows may sum in another order: equal up to float32 rounding.
    torch.testing.assert_close(kept, full[:, -keep:], rtol=0, atol=1e-5)
    step = torch.tensor([[3], [4]])  # the cache holds the same keys either way
    assert torch.equal(tiny_model(step, cache=kept_cache), tiny_model(step, cache=full_cache))


def test_logits_to_keep_below_zero_is_refused(tiny_model):
    with pytest.raises(ValueError, match="logits_to_keep must be >= 0"):
        tiny_model(torch.tensor([[1, 2]]), logits_to_keep=-1)
