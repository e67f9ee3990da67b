"""Metrics on hand-made attention matrices give exact values; entropies of the trained model stay in range."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genprobe._io import json_safe
from genprobe.attention.capture import capture_attention
from genprobe.attention.metrics import attention_report, head_stats, per_position
from genprobe.cli.cmd_attention import format_table


def uniform_causal(T):
    vis = torch.ones(T, T).tril()
    return vis / vis.sum(-1, keepdim=True)


def test_uniform_attention_has_max_entropy_and_normalised_one():
    T = 6
    pp = per_position(uniform_causal(T))
    n = torch.arange(1, T + 1, dtype=torch.float64)
    assert torch.allclose(pp["entropy"][0, 0], n.log())
    assert math.isnan(pp["norm_entropy"][0, 0, 0])  # one visible key: undefined
    assert torch.allclose(pp["norm_entropy"][0, 0, 1:], torch.ones(T - 1, dtype=torch.float64))
    s = head_stats(uniform_causal(T))[0]
    assert s.entropy == pytest.approx(float(n.log().mean()))
    assert s.norm_entropy == pytest.approx(1.0)  # row 0 excluded from the mean
    assert s.sink_mass == pytest.approx(float((1 / n).mean()))
    assert s.diag_mass == pytest.approx(float((1 / n).mean()))


def test_one_hot_diagonal():
    T = 7
    s = head_stats(torch.eye(T), distance=2, local_window=0)[0]
    assert s.entropy == 0.0 and s.norm_entropy == 0.0
    assert s.diag_mass == 1.0 and s.local_mass == 1.0 and s.far_mass == 0.0
    assert s.sink_mass == pytest.approx(1 / T)  # only query 0 attends to the first token


def test_sink_attention():
    T = 8
    p = torch.zeros(T, T)
    p[:, 0] = 1.0
    s = head_stats(p, distance=3, local_window=1)[0]
    assert s.entropy == 0.0
    assert s.sink_mass == 1.0
    assert s.diag_mass == pytest.approx(1 / T)
    assert s.far_mass == pytest.approx(sum(q > 3 for q in range(T)) / T)  # queries 4..7 look 4+ back
    assert s.local_mass == pytest.approx(2 / T)  # queries 0 and 1


def test_far_mass_counts_strictly_beyond_distance():
    T = 5
    p = torch.zeros(T, T)
    p[4, 1] = 1.0  # distance 3
    p[:4] = torch.eye(T)[:4]
    pp = per_position(p, distance=3)
    assert float(pp["far_mass"][0, 0, 4]) == 0.0
    pp = per_position(p, distance=2)
    assert float(pp["far_mass"][0, 0, 4]) == 1.0


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="must be"):
        per_position(torch.zeros(2, 2, 2, 2, 2))
    with pytest.raises(ValueError, match="must be"):
        per_position(torch.ones(2, 3))  # every query sees the keys up to itself: a square map
    with pytest.raises(ValueError, match=">= 0"):
        per_position(torch.eye(3), distance=-1)


def test_trained_model_entropies_within_bounds(trained):
    model, tok, _ = trained
    ids = tok.encode("白日依山盡黃河入海流欲窮千里目更上一層樓", warn=False)
    cap = capture_attention(model, ids)
    assert cap.probs.shape == (model.cfg.n_layer, model.cfg.n_head, len(ids), len(ids))
    assert torch.allclose(cap.probs.sum(-1), torch.ones(()), atol=1e-5)
    pp = per_position(cap.probs)
    ent = pp["entropy"]
    n_vis = torch.arange(1, len(ids) + 1, dtype=torch.float64)
    assert (ent >= -1e-9).all()
    assert (ent <= n_vis.log() + 1e-6).all()
    rep = json_safe(attention_report(cap))
    for h in rep["heads"]:
        assert 0.0 <= h["entropy"] <= h["max_entropy"] + 1e-9
        assert 0.0 <= h["norm_entropy"] <= 1.0 + 1e-9
        for k in ("far_mass", "sink_mass", "diag_mass", "local_mass"):
            assert 0.0 <= h[k] <= 1.0 + 1e-9
    assert "mean" in format_table(rep)


def test_hf_capture_switches_from_sdpa_to_eager():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=None, eos_token_id=None
    )
    hf = GPT2LMHeadModel(cfg).eval()
    hf.set_attn_implementation("sdpa")
    cap = capture_attention(hf, [3, 4, 5, 6])
    assert cap.probs.shape == (2, 2, 4, 4)
    assert "sdpa" in cap.note
    assert hf.config._attn_implementation == "sdpa"  # restored
    assert torch.allclose(cap.probs.sum(-1), torch.ones(()), atol=1e-5)
    assert float(cap.probs.triu(1).abs().max()) == 0.0


def test_capture_matches_hf_export(tiny_model):
    from genprobe.model.hf import to_hf_gpt2

    ids = [3, 9, 4, 1, 7, 7, 2]
    ours = capture_attention(tiny_model, ids).probs
    theirs = capture_attention(to_hf_gpt2(tiny_model), ids).probs
    assert (ours - theirs).abs().max() < 1e-5


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 12),
    H=st.integers(1, 3),
    scale=st.floats(0.0, 30.0),
    seed=st.integers(0, 10_000),
    d=st.integers(0, 12),
)
def test_random_attention_metrics_stay_in_range(T, H, scale, seed, d):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(H, T, T, generator=g) * scale
    probs = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    pp = per_position(probs, distance=d, local_window=1)
    log_n = torch.arange(1, T + 1, dtype=torch.float64).log()
    assert (pp["entropy"] >= -1e-9).all() and (pp["entropy"] <= log_n + 1e-6).all()
    for k in ("far_mass", "sink_mass", "diag_mass", "local_mass"):
        assert ((pp[k] >= -1e-9) & (pp[k] <= 1 + 1e-6)).all()  # float32 probabilities
    if d >= 1:  # far (> d) and local (<= 1) are disjoint key sets
        assert (pp["far_mass"] + pp["local_mass"] <= 1 + 1e-6).all()
    assert torch.all(pp["diag_mass"] <= pp["local_mass"] + 1e-12)


def test_capture_accepts_a_loaded_model(tiny_model):
    """capture_attention takes the loader's Model (its .module) as well as a bare module."""
    from genprobe.attention.capture import capture_attention
    from genprobe.model.load import Model

    a = capture_attention(tiny_model, [1, 2, 3, 4])
    b = capture_attention(Model.from_module(tiny_model), [1, 2, 3, 4])
    assert torch.equal(a.probs, b.probs) and a.probs.shape == (2, 2, 4, 4)
