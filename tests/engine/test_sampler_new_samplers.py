"""DRY, XTC, typical-p, top-n-σ, penalty windows, presets, validation and NaN handling.

References: llama.cpp src/llama-sampling.cpp (llama_sampler_dry_apply, get_overlapping_token_sequences,
llama_sample_xtc_apply, llama_sampler_top_n_sigma_apply, llama_sampler_penalties_apply) and
common/common.h (defaults); transformers TypicalLogitsWarper (compared in test_sampler_hf_parity.py).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from genprobe.engine.generate import generate
from genprobe.engine.samplers.chain import process_logits, sample_next
from genprobe.engine.samplers.llama_cpp import breakers_from_strings, dry_penalties
from genprobe.engine.samplers.stages import DRY, XTC, SamplerConfig


# ---- DRY -----------------------------------------------------------------------------------------
def test_dry_penalty_formula_and_allowed_length():
    """Extending a repeat of length L costs multiplier·base^(L − allowed_length) (llama_sampler_dry_apply)."""
    ctx = [5, 1, 2, 3, 9, 1, 2, 3]  # "1 2 3" repeats; after its first copy came 9
    pens = dry_penalties(ctx, 0.8, 1.75, 2, -1, {})
    assert set(pens) == {9} and float(pens[9]) == pytest.approx(0.8 * 1.75 ** (3 - 2), rel=1e-7)
    assert dry_penalties(ctx, 0.8, 1.75, 3, -1, {})[9] == np.float32(0.8)  # L = allowed → base^0
    assert dry_penalties(ctx, 0.8, 1.75, 4, -1, {}) == {}  # L < allowed: free


def test_dry_breakers_cut_matches_and_window_limits_the_scan():
    """A breaker inside the suffix caps the repeat length; last_n hides older copies."""
    ctx = [1, 2, 3, 9, 1, 2, 3]
    assert dry_penalties(ctx, 1.0, 2.0, 2, -1, {})[9] == np.float32(2.0)  # L = 3
    # 2 is a breaker: only "3" (1 token) after it can repeat → below allowed_length 2 → no penalty
    assert dry_penalties(ctx, 1.0, 2.0, 2, -1, {2: [()]}) == {}
    # a two-token breaker (1, 2) needs both tokens, in order
    assert dry_penalties(ctx, 1.0, 2.0, 1, -1, {1: [(2,)]}) == {9: np.float32(1.0)}
    assert dry_penalties(ctx, 1.0, 2.0, 2, 4, {}) == {}  # window [9, 1, 2, 3]: no earlier copy


def test_dry_exponent_cap_keeps_the_penalty_finite():
    """max exponent int(88.7228391 / ln base): base 1.75 → 158, so a 400-token loop costs 1.75^158, not inf."""
    pens = dry_penalties([0, 1] * 200, 1.0, 1.75, 2, -1, {})
    assert math.isfinite(float(pens[0])) and float(pens[0]) == pytest.approx(1.75**158, rel=1e-6)


def test_dry_in_generation_breaks_a_greedy_loop_and_ignores_padding(tiny_model):
    """Greedy loops on the tiny model; DRY (an adjustment, so it works under greedy) breaks the loop."""
    plain = generate(tiny_model, [[3, 4, 5]], 24).tokens[0]
    dry = SamplerConfig(greedy=True, dry_multiplier=2.0, dry_allowed_length=1)
    broken = generate(tiny_model, [[3, 4, 5]], 24, sampler=dry).tokens[0]
    assert len(set(plain[-10:])) <= 2 and len(set(broken[-10:])) > len(set(plain[-10:]))
    batch = generate(tiny_model, [[7, 8, 9, 10, 11], [3, 4, 5]], 24, sampler=dry).tokens
    assert batch[1] == broken  # the left-padded row equals the row alone


class _Tok:
    """Multi-character tokens, greedy longest-match encoding (enough for breaker processing)."""

    vocab = ["a", "b\n", "\n", "x:", ":y", "ab", "c"]
    vocab_size = len(vocab)

    def token_str(self, i):
        return self.vocab[i]

    def encode(self, s):
        out = []
        while s:
            best = max((t for t in self.vocab if s.startswith(t)), key=len)
            out.append(self.vocab.index(best))
            s = s[len(best) :]
        return out


def test_breakers_from_strings_follow_get_overlapping_token_sequences():
    """Tokens containing the string are one-token breakers; a token ending with a prefix heads a sequence."""
    t = _Tok()
    assert set(breakers_from_strings(["\n"], t.vocab_size, t.token_str, t.encode)) == {(1,), (2,)}
    # "ab\n": "a" ends with prefix "a" → tail encode("b\n") = [1]; "ab" ends with "ab" → tail [2]
    assert set(breakers_from_strings(["ab\n"], t.vocab_size, t.token_str, t.encode)) == {(0, 1), (5, 2)}
    # ":y" contains ":" ; "x:" contains ":"
    assert set(breakers_from_strings([":"], t.vocab_size, t.token_str, t.encode)) == {(3,), (4,)}
    with pytest.raises(ValueError, match="empty"):
        breakers_from_strings([""], t.vocab_size, t.token_str, t.encode)


# ---- XTC -----------------------------------------------------------------------------------------
def test_xtc_removes_top_choices_but_the_least_likely_and_is_reproducible():
    z = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    for engine in ("genprobe", "hf", "vllm", "llama.cpp"):
        cfg = SamplerConfig(xtc_probability=1.0, xtc_threshold=0.15, engine=engine)
        kept = torch.isfinite(process_logits(z, None, cfg, generator=torch.Generator().manual_seed(0)))[0].tolist()
        assert kept == [False, False, True, True], engine  # 0.4, 0.3 go; 0.2 (least likely above 0.15) stays
    off = SamplerConfig(xtc_probability=1.0, xtc_threshold=0.51)  # above 0.5: off
    assert torch.isfinite(process_logits(z, None, off, generator=torch.Generator())).all()
    cfg = SamplerConfig(xtc_probability=0.5, xtc_threshold=0.15)

    def draws(seed: int) -> list[int]:
        return sample_next(z.repeat(64, 1), None, cfg, torch.Generator().manual_seed(seed)).tolist()

    assert draws(1) == draws(1) and draws(1) != draws(2)
    frac = sum(d in (0, 1) for d in draws(3)) / 64  # top choices survive only when XTC does not fire
    assert 0.1 < frac < 0.6


def test_xtc_needs_the_generation_generator():
    with pytest.raises(ValueError, match="torch.Generator"):
        process_logits(torch.zeros(1, 4), None, SamplerConfig(xtc_probability=0.5))


# ---- top-n-σ, penalty windows, presets -----------------------------------------------------------
def test_top_n_sigma_torch_matches_llama_cpp_engine_on_continuous_logits():
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        z = torch.randn(1, 30, generator=g) * 2
        n = float(torch.empty(1).uniform_(0.3, 2.5, generator=g))
        a = torch.isfinite(process_logits(z, None, SamplerConfig(top_n_sigma=n)))
        b = torch.isfinite(process_logits(z, None, SamplerConfig(top_n_sigma=n, order="llama.cpp")))
        assert torch.equal(a, b)


def test_penalty_window_counts_only_the_last_n_tokens_prompt_included():
    """llama.cpp: penalties see the last penalty_last_n (default 64) accepted tokens, prompt included."""
    hist = torch.tensor([[0] + [1] * 70])  # token 0 is 70 tokens back
    z = torch.ones(1, 3)
    llama = process_logits(z, hist, SamplerConfig(repetition_penalty=2.0, greedy=True, engine="llama.cpp"))
    assert llama[0].tolist() == [1.0, 0.5, 1.0]  # 0 is outside the 64-token window
    hf = process_logits(z, hist, SamplerConfig(repetition_penalty=2.0, greedy=True, engine="hf"))
    assert hf[0].tolist() == [0.5, 0.5, 1.0]  # HF: the whole prompt + output
    win = process_logits(z, hist, SamplerConfig(repetition_penalty=2.0, greedy=True, penalty_last_n=71))
    assert win[0].tolist() == [0.5, 0.5, 1.0]


def test_presets_fill_engine_defaults_and_keep_order_selectable():
    lc = SamplerConfig.preset("llama.cpp")
    assert (lc.temperature, lc.top_k, lc.top_p, lc.min_p, lc.penalty_last_n) == (0.8, 40, 0.95, 0.05, 64)
    assert (lc.dry_base, lc.dry_allowed_length, lc.dry_last_n, lc.xtc_threshold) == (1.75, 2, 64, 0.1)
    assert lc.order == lc.engine == "llama.cpp" and not DRY.active(lc) and not XTC.active(lc)
    moved = SamplerConfig.preset("llama.cpp", order="temp_then_trunc", top_k=5)
    assert moved.engine == "llama.cpp" and moved.order == "temp_then_trunc" and moved.top_k == 5
    assert SamplerConfig.preset("vllm").engine == "vllm" and SamplerConfig(order="hf").engine == "hf"
    assert SamplerConfig().engine == "genprobe"
    with pytest.raises(ValueError, match="unknown sampler preset"):
        SamplerConfig.preset("ollama")
    d = SamplerConfig(dry_multiplier=0.8, dry_sequence_breakers=((3,), (4, 5))).to_dict()
    assert json.loads(json.dumps(d))["dry_sequence_breakers"] == [[3], [4, 5]] and d["engine"] == "genprobe"


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(typical_p=0.0), "typical_p must be in \\(0, 1\\]"),
        (dict(typical_p=1.5), "typical_p"),
        (dict(top_n_sigma=-1.0), "top_n_sigma must be >= 0"),
        (dict(dry_multiplier=-0.5), "dry_multiplier must be >= 0"),
        (dict(dry_base=0.9), "dry_base must be >= 1"),
        (dict(dry_allowed_length=0), "dry_allowed_length must be an integer >= 1"),
        (dict(dry_last_n=-2), "dry_last_n must be an integer >= -1"),
        (dict(dry_sequence_breakers=((),)), "non-empty"),
        (dict(dry_sequence_breakers=((-1,),)), "ids >= 0"),
        (dict(xtc_probability=1.5), "xtc_probability must be in \\[0, 1\\]"),
        (dict(xtc_threshold=-0.1), "xtc_threshold must be in \\[0, 1\\]"),
        (dict(penalty_last_n=-2), "penalty_last_n must be an integer >= -1"),
        (dict(penalty_last_n=10, engine="hf"), "no penalty window"),
        (dict(engine="ollama"), "unknown sampler engine"),
        (dict(frequency_penalty=float("nan")), "frequency_penalty must be a finite number"),
    ],
)
def test_new_parameters_validated(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        SamplerConfig(**kwargs)


# ---- NaN -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cfg",
    [
        SamplerConfig(greedy=True),
        SamplerConfig(greedy=True, repetition_penalty=1.2),
        SamplerConfig(temperature=0.7, top_p=0.9),
        SamplerConfig(order="llama.cpp", top_k=3),
    ],
)
def test_nan_logits_raise_in_every_path(cfg):
    z = torch.tensor([[0.1, float("nan"), 0.3]])
    for call in (
        lambda: process_logits(z, torch.tensor([[0]]), cfg),
        lambda: sample_next(z, torch.tensor([[0]]), cfg, torch.Generator()),
        lambda: process_logits(z, torch.tensor([[0]]), cfg).softmax(-1),
    ):
        with pytest.raises(ValueError, match="NaN"):
            call()


def test_nan_model_output_raises_in_generation(tiny_model):
    with torch.no_grad():
        tiny_model.lm_head.weight[7, 0] = float("nan")  # one corrupted row of the tied embedding
    for s in (None, SamplerConfig(temperature=0.8), SamplerConfig(penalty_alpha=0.6, top_k=3)):
        with pytest.raises(ValueError, match="NaN"):
            generate(tiny_model, [[3, 4]], 4, sampler=s)
