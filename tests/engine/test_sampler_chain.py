"""Sampler chain: validation, semantics of each stage, order presets, and hypothesis properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genprobe.engine.samplers.chain import kept_set_size, process_logits, sample_next
from genprobe.engine.samplers.stages import ORDERS, SamplerConfig, no_repeat_ngram_mask
from genprobe.experiments.sampling import order_trap

PROPS = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])

logit_rows = st.lists(
    st.floats(min_value=-20, max_value=20, allow_nan=False, allow_infinity=False), min_size=2, max_size=24
)
temperatures = st.floats(min_value=0.05, max_value=5.0)
top_ps = st.one_of(st.none(), st.floats(min_value=1e-3, max_value=1.0))
top_ks = st.one_of(st.none(), st.integers(min_value=0, max_value=30))
min_ps = st.one_of(st.none(), st.floats(min_value=0.0, max_value=1.0))
orders = st.sampled_from(sorted(ORDERS))


@st.composite
def configs(draw, greedy: bool | None = None):
    """A valid SamplerConfig (bans restricted to ids < 2 so they always exist in the vocabulary)."""
    return SamplerConfig(
        greedy=draw(st.booleans()) if greedy is None else greedy,
        temperature=draw(temperatures),
        top_k=draw(top_ks),
        top_p=draw(top_ps),
        min_p=draw(min_ps),
        ban_ids=tuple(draw(st.lists(st.integers(0, 0), max_size=1))),
        repetition_penalty=draw(st.floats(min_value=0.5, max_value=3.0)),
        presence_penalty=draw(st.floats(min_value=-2, max_value=2)),
        frequency_penalty=draw(st.floats(min_value=-1, max_value=1)),
        no_repeat_ngram=draw(st.integers(0, 3)),
        order=draw(orders),
    )


def _history(draw_list: list[int], V: int) -> torch.Tensor:
    return torch.tensor([[t % V for t in draw_list]], dtype=torch.long).reshape(1, -1)


# ---- validation ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(min_p=-0.1), "min_p"),
        (dict(min_p=1.1), "min_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(repetition_penalty=-2.0), "repetition_penalty"),
        (dict(order="random"), "order"),
        (dict(ban_ids=(-1,)), "ban_ids"),
        (dict(no_repeat_ngram=-1), "no_repeat_ngram"),
        (dict(presence_penalty=float("inf")), "presence_penalty"),
    ],
)
def test_invalid_parameters_raise(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        SamplerConfig(**kwargs)


def test_greedy_is_explicit_and_accepts_no_temperature_hack():
    # temperature 0 is refused in sampling mode but greedy ignores temperature entirely
    with pytest.raises(ValueError, match="greedy=True"):
        SamplerConfig(temperature=0.0)
    cfg = SamplerConfig(greedy=True, temperature=0.0)
    logits = torch.tensor([[0.1, 3.0, 2.9]])
    assert sample_next(logits, None, cfg).tolist() == [1]


def test_ban_ids_outside_vocab_raise():
    with pytest.raises(ValueError, match="vocabulary of 3"):
        process_logits(torch.zeros(1, 3), None, SamplerConfig(ban_ids=(5,)))
    with pytest.raises(ValueError, match="ban all 3"):
        process_logits(torch.zeros(1, 3), None, SamplerConfig(ban_ids=(0, 1, 2)))


# ---- semantics of single stages --------------------------------------------------------------
def test_repetition_penalty_ctrl_semantics():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0]])
    hist = torch.tensor([[0, 1, 1]])
    out = process_logits(logits, hist, SamplerConfig(repetition_penalty=2.0))
    # seen positive → divided, seen negative → multiplied, unseen unchanged
    assert out.tolist() == [[1.0, -4.0, 2.0, -2.0]]


def test_presence_frequency_vllm_semantics():
    logits = torch.zeros(1, 4)
    hist = torch.tensor([[2, 2, 2, 1, -1]])  # -1 = padding, ignored
    out = process_logits(logits, hist, SamplerConfig(presence_penalty=0.5, frequency_penalty=0.25))
    assert torch.allclose(out, torch.tensor([[0.0, -0.75, -1.25, 0.0]]))


def test_presence_frequency_count_only_generated_tokens_when_told_the_prompt_length():
    hist = torch.tensor([[3, 3, 1, 2, 2]])  # prompt = first 3 tokens
    cfg = SamplerConfig(presence_penalty=1.0, frequency_penalty=0.5)
    out = process_logits(torch.zeros(1, 4), hist, cfg, prompt_len=3)
    assert out.tolist() == [[0.0, 0.0, -2.0, 0.0]]
    rep = process_logits(torch.ones(1, 4), hist, SamplerConfig(repetition_penalty=2.0), prompt_len=3)
    assert rep.tolist() == [[1.0, 0.5, 0.5, 0.5]]  # the repetition penalty still sees the prompt (HF)


def test_no_repeat_ngram_matches_transformers():
    from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 3):
        for _ in range(30):
            hist = torch.randint(0, 5, (3, 12), generator=g)
            ours = no_repeat_ngram_mask(hist, n, 5)
            theirs = NoRepeatNGramLogitsProcessor(n)(hist, torch.zeros(3, 5)) == float("-inf")
            assert torch.equal(ours, theirs), (n, hist)


def test_no_repeat_ngram_ignores_padding():
    hist = torch.tensor([[-1, -1, 3, 4, 3]])
    alone = torch.tensor([[3, 4, 3]])
    assert torch.equal(no_repeat_ngram_mask(hist, 2, 6), no_repeat_ngram_mask(alone, 2, 6))
    assert no_repeat_ngram_mask(alone, 2, 6)[0].nonzero().flatten().tolist() == [4]


def test_truncation_masks_with_minus_inf_never_zero():
    logits = torch.tensor([[5.0, 4.0, -3.0, -4.0]])
    out = process_logits(logits, None, SamplerConfig(top_k=2))
    assert out[0, 2] == float("-inf") and out[0, 3] == float("-inf")
    assert process_logits(logits, None, SamplerConfig(top_k=2)).softmax(-1)[0, 2:].tolist() == [0.0, 0.0]


def test_hf_preset_matches_transformers_warpers():
    """Our 'hf' order reproduces transformers' warper chain (temperature → top-k → top-p → min-p)."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        logits = torch.randn(2, 40, generator=g) * 3
        t = float(torch.empty(1).uniform_(0.3, 2.5, generator=g))
        p = float(torch.empty(1).uniform_(0.3, 0.99, generator=g))
        k = int(torch.randint(1, 40, (1,), generator=g))
        mp = float(torch.empty(1).uniform_(0.0, 0.3, generator=g))
        chain = LogitsProcessorList(
            [TemperatureLogitsWarper(t), TopKLogitsWarper(k), TopPLogitsWarper(p), MinPLogitsWarper(mp)]
        )
        theirs = chain(torch.zeros(2, 1, dtype=torch.long), logits.clone())
        ours = process_logits(logits, None, SamplerConfig(temperature=t, top_k=k, top_p=p, min_p=mp, order="hf"))
        assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
        assert torch.allclose(ours[torch.isfinite(ours)], theirs[torch.isfinite(theirs)])


# ---- hypothesis properties -------------------------------------------------------------------
@PROPS
@given(row=logit_rows, cfg=configs(), hist=st.lists(st.integers(0, 30), max_size=10))
def test_probabilities_finite_and_sum_to_one_and_kept_set_nonempty(row, cfg, hist):
    logits = torch.tensor([row])
    V = logits.shape[1]
    h = _history(hist, V)
    try:
        probs = process_logits(logits, h, cfg).softmax(-1)
    except ValueError as exc:  # no_repeat_ngram may legitimately ban every token of a tiny vocabulary
        assert "every token is banned" in str(exc) and cfg.no_repeat_ngram
        return
    assert torch.isfinite(probs).all()
    assert math.isclose(float(probs.sum()), 1.0, abs_tol=1e-5)
    assert int((probs > 0).sum()) >= 1
    tok = int(sample_next(logits, h, cfg, torch.Generator().manual_seed(0)))
    assert probs[0, tok] > 0


@PROPS
@given(row=logit_rows, p=st.floats(min_value=1e-3, max_value=1.0))
def test_top_p_keeps_smallest_prefix_reaching_p(row, p):
    logits = torch.tensor([row])
    kept = torch.isfinite(process_logits(logits, None, SamplerConfig(top_p=p)))[0]  # genprobe's top-p
    probs = torch.softmax(logits, -1)[0].double()
    order = torch.argsort(probs, descending=True)
    m = int(kept.sum())
    # the kept set is a prefix of the tokens sorted by probability (ties may swap equal values)
    thresh = probs[order[m - 1]]
    assert bool((probs[kept] >= thresh).all()) and bool((probs[~kept] <= thresh).all())
    mass = float(probs[kept].sum())
    assert mass >= p - 1e-5 or m == len(row)  # reaches p (the crossing token included)
    assert mass - float(thresh) < p + 1e-5  # dropping the last kept token would fall below p: smallest


@PROPS
@given(
    row=logit_rows.filter(lambda r: len(r) >= 3),
    ban=st.lists(st.integers(0, 1), min_size=1, max_size=2),
    cfg=configs(greedy=False),
    seed=st.integers(0, 10_000),
)
def test_banned_tokens_never_drawn(row, ban, cfg, seed):
    cfg = SamplerConfig(**{**cfg.to_dict(), "ban_ids": tuple(ban), "no_repeat_ngram": 0})
    logits = torch.tensor([row] * 4)
    probs = process_logits(logits, None, cfg).softmax(-1)
    assert (probs[:, list(set(ban))] == 0).all()
    draws = sample_next(logits.repeat(8, 1), None, cfg, torch.Generator().manual_seed(seed))
    assert not any(int(d) in ban for d in draws)
    assert int(sample_next(logits, None, SamplerConfig(greedy=True, ban_ids=tuple(ban)))[0]) not in ban


@PROPS
@given(row=logit_rows, k=top_ks, p=top_ps, mp=min_ps)
def test_orders_agree_at_temperature_one(row, k, p, mp):
    # Same engine (arithmetic), different orders: at τ = 1 only the truncation order can matter.
    logits = torch.tensor([row])
    outs = {
        o: process_logits(logits, None, SamplerConfig(top_k=k, top_p=p, min_p=mp, order=o, engine="genprobe"))
        for o in ORDERS
    }
    same_chain = ["trunc_then_temp", "temp_then_trunc", "hf", "llama.cpp"]
    for o in same_chain[1:]:
        assert torch.equal(outs[o], outs[same_chain[0]]), o
    n_trunc = sum([bool(k), p is not None and p < 1, bool(mp)])
    if n_trunc <= 1:  # vLLM's different truncation order matters only when truncations combine
        assert torch.equal(outs["vllm"], outs["trunc_then_temp"])


@PROPS
@given(row=logit_rows, p=st.floats(min_value=0.05, max_value=0.99), t=temperatures)
def test_trunc_then_temp_kept_set_independent_of_tau_and_temp_then_trunc_moves(row, p, t):
    logits = torch.tensor(row)
    base = kept_set_size(logits, SamplerConfig(top_p=p, order="trunc_then_temp"))
    assert kept_set_size(logits, SamplerConfig(top_p=p, temperature=t, order="trunc_then_temp")) == base
    # llama.cpp applies τ last too (its own float32 arithmetic may keep a different set than genprobe's)
    assert kept_set_size(logits, SamplerConfig(top_p=p, temperature=t, order="llama.cpp")) == kept_set_size(
        logits, SamplerConfig(top_p=p, order="llama.cpp")
    )
    b = kept_set_size(logits, SamplerConfig(top_p=p, temperature=t, order="temp_then_trunc"))
    # a sharper distribution (τ<1) reaches p with fewer tokens, a flatter one (τ>1) needs more
    if t < 1:
        assert b <= base
    elif t > 1:
        assert b >= base


def test_orders_differ_where_the_seed_says():
    """The order trap (seed §3.5.5).

    With top-p 0.9, temp_then_trunc's kept set moves with τ, trunc_then_temp's does not.
    """
    logits = torch.log(torch.softmax(torch.linspace(4, -4, 200), 0))  # a smooth, long-tailed distribution
    rows = order_trap(logits, 0.9, [0.5, 1.0, 1.5, 2.0], ("trunc_then_temp", "temp_then_trunc"))
    a = [r["trunc_then_temp"] for r in rows]
    b = [r["temp_then_trunc"] for r in rows]
    assert len(set(a)) == 1
    assert b[1] == a[1]  # τ = 1: identical
    assert b[0] < a[0] and b[2] > a[2] and b[3] > b[2]  # strictly different where τ ≠ 1


@PROPS
@given(row=logit_rows, cfg=configs(greedy=False), seed=st.integers(0, 2**31 - 1))
def test_same_seed_same_tokens(row, cfg, seed):
    cfg = SamplerConfig(**{**cfg.to_dict(), "no_repeat_ngram": 0})
    logits = torch.tensor([row] * 3)
    a = sample_next(logits, None, cfg, torch.Generator().manual_seed(seed))
    b = sample_next(logits, None, cfg, torch.Generator().manual_seed(seed))
    assert torch.equal(a, b)


def test_sampling_never_touches_global_rng():
    logits = torch.randn(2, 10)
    before = torch.get_rng_state()
    sample_next(logits, None, SamplerConfig(temperature=0.7), torch.Generator().manual_seed(0))
    assert torch.equal(before, torch.get_rng_state())


def test_sampled_frequencies_follow_processed_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -5.0]])
    cfg = SamplerConfig(temperature=1.3, top_p=0.9)
    probs = process_logits(logits, None, cfg).softmax(-1)[0]
    draws = sample_next(logits.repeat(20000, 1), None, cfg, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=5).double() / 20000
    assert torch.allclose(freq, probs.double(), atol=0.015)
    assert freq[probs == 0].sum() == 0
