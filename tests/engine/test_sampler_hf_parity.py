"""The ``hf`` engine against transformers' own processors and ``generate`` (installed: transformers 5.x).

Every comparison is exact (``torch.equal``) on logits built to hit the hard cases continuous random
logits never show: ties (values drawn from a handful of levels), ``-inf`` entries, equal logits
whose nucleus mass hits ``p`` exactly, zeros and negatives under the repetition penalty.
References: transformers/generation/logits_process.py — TemperatureLogitsWarper, TopKLogitsWarper,
TopPLogitsWarper, MinPLogitsWarper, TypicalLogitsWarper, RepetitionPenaltyLogitsProcessor,
NoRepeatNGramLogitsProcessor; transformers/generation/utils.py — GenerationMixin._get_logits_processor
(warper order) and _sample; configuration_utils.py — default top_k=50.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from genprobe.engine.samplers.chain import process_logits
from genprobe.engine.samplers.stages import SamplerConfig

LEVELS = torch.tensor([-3.0, -1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 2.0, float("-inf")])


def hard_logits(g: torch.Generator, B: int = 4, V: int = 12) -> torch.Tensor:
    """Logits drawn from a few levels (ties everywhere, some -inf), at least one finite per row."""
    z = LEVELS[torch.randint(0, len(LEVELS), (B, V), generator=g)]
    z[:, 0] = torch.where(torch.isfinite(z[:, 0]), z[:, 0], torch.zeros(B))
    return z


def _hf_chain(t, k, p, mp, typ):
    procs = []
    if t != 1.0:
        procs.append(TemperatureLogitsWarper(t))
    if k:
        procs.append(TopKLogitsWarper(k))
    if p < 1.0:
        procs.append(TopPLogitsWarper(p))
    if mp:
        procs.append(MinPLogitsWarper(mp))
    if typ < 1.0:
        procs.append(TypicalLogitsWarper(typ))
    return LogitsProcessorList(procs)


def test_warper_chain_equals_transformers_on_ties_and_minus_inf():
    """TemperatureLogitsWarper → TopK → TopP → MinP → Typical, as _get_logits_processor orders them."""
    g = torch.Generator().manual_seed(0)
    for _ in range(400):
        z = hard_logits(g)
        t = [0.5, 1.0, 1.7][int(torch.randint(0, 3, (1,), generator=g))]
        k = int(torch.randint(0, 8, (1,), generator=g))
        p = [0.3, 0.5, 0.75, 0.9, 1.0][int(torch.randint(0, 5, (1,), generator=g))]
        mp = [0.0, 0.1, 0.5][int(torch.randint(0, 3, (1,), generator=g))]
        typ = [1.0, 0.5, 0.9][int(torch.randint(0, 3, (1,), generator=g))]
        theirs = _hf_chain(t, k, p, mp, typ)(torch.zeros(4, 1, dtype=torch.long), z.clone())
        cfg = SamplerConfig(temperature=t, top_k=k, top_p=p, min_p=mp, typical_p=typ, order="hf")
        assert torch.equal(process_logits(z, None, cfg), theirs), (z, t, k, p, mp, typ)


def test_top_p_ties_at_the_cut_drop_lower_ids_like_transformers():
    """Four equal logits, p = 0.5: HF sorts ascending, so ids 0 and 1 are cut; genprobe keeps the lower ids."""
    z = torch.zeros(1, 4)
    theirs = TopPLogitsWarper(0.5)(None, z.clone())
    assert torch.isfinite(theirs)[0].tolist() == [False, False, True, True]
    assert torch.equal(process_logits(z, None, SamplerConfig(top_p=0.5, order="hf")), theirs)
    assert torch.isfinite(process_logits(z, None, SamplerConfig(top_p=0.5)))[0].tolist() == [True, True, False, False]


@pytest.mark.parametrize("n", range(2, 25))
def test_top_p_exact_thresholds_on_equal_logits(n):
    """p = m/n on n equal logits: the float32 rounding decides, and ours must decide it as HF does."""
    z = torch.zeros(1, n)
    for m in range(1, n):
        theirs = TopPLogitsWarper(m / n)(None, z.clone())
        assert torch.equal(process_logits(z, None, SamplerConfig(top_p=m / n, order="hf")), theirs), (n, m)
        # genprobe's own arithmetic keeps exactly m: the mass of m tokens is p
        assert int(torch.isfinite(process_logits(z, None, SamplerConfig(top_p=m / n))).sum()) == m, (n, m)


def test_repetition_penalty_equals_transformers_with_zeros_negatives_and_repeats():
    """RepetitionPenaltyLogitsProcessor: prompt + output ids, x<0 → x·p else x/p, each id once."""
    g = torch.Generator().manual_seed(1)
    for penalty in (0.5, 1.3, 2.0):
        for _ in range(50):
            z = hard_logits(g, B=3, V=10)
            ids = torch.randint(0, 10, (3, 7), generator=g)
            theirs = RepetitionPenaltyLogitsProcessor(penalty)(ids, z.clone())
            ours = process_logits(z, ids, SamplerConfig(repetition_penalty=penalty, greedy=True, engine="hf"))
            assert torch.equal(ours, theirs)


def test_hf_preset_adds_top_k_50_like_generate():
    """GenerationConfig's default top_k=50 is part of HF sampling: the preset states it explicitly."""
    from transformers import GenerationConfig

    defaults = GenerationConfig._get_default_generation_params()
    assert SamplerConfig.preset("hf").top_k == defaults["top_k"] == 50
    assert SamplerConfig.preset("hf", top_k=0).top_k == 0 and SamplerConfig.preset("hf").order == "hf"


@pytest.fixture(scope="module")
def hf_gpt2_80():
    """A tiny GPT-2 with 80 tokens: more than 50, so HF's implicit top_k=50 truncates."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=80,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_inner=64,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
    )
    return GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize(
    "kw",
    [dict(), dict(temperature=0.7, top_p=0.9), dict(top_k=10, repetition_penalty=1.3), dict(min_p=0.1, typical_p=0.9)],
    ids=["defaults", "temp-top_p", "top_k-rep", "min_p-typical"],
)
def test_sampled_generation_equals_transformers_generate(hf_gpt2_80, kw):
    """Same seed → same sampled tokens as ``generate(do_sample=True)`` (its multinomial draws on the global RNG)."""
    from genprobe.engine.generate import generate
    from genprobe.engine.hf_adapter import HFCausalLM

    ids = torch.tensor([[3, 4, 5]])
    torch.manual_seed(123)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = hf_gpt2_80.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            max_new_tokens=20,
            min_new_tokens=20,
            pad_token_id=0,
            **kw,
        )[0, 3:].tolist()
    runner = HFCausalLM(hf_gpt2_80)
    assert generate(runner, [[3, 4, 5]], 20, sampler=SamplerConfig.preset("hf", **kw), seed=123).tokens[0] == theirs
    if "top_k" not in kw:  # without the implicit top_k=50 the same seed draws other tokens
        assert generate(runner, [[3, 4, 5]], 20, sampler=SamplerConfig(order="hf", **kw), seed=123).tokens[0] != theirs
