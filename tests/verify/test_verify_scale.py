"""Scale-aware verdicts: a bug on a small-logit model is a bug; float noise on it is still noise.

The seed's absolute scale (> 1 bug) assumes trained logits, spread by about one unit (our trained
checkpoint: std ≈ 1.2 across the vocabulary). A freshly initialised ``transformers`` GPT-2
(initializer_range 0.02) spreads its logits by ≈ 0.12: the left-padding bug without ``position_ids``
(transformers ``GPT2Model.forward`` takes ``position_ids = cache length + arange(T)`` when none are
given, so left-padded rows start at the wrong absolute position) moves them by ≈ 0.34 — "suspicious"
on the absolute scale, about three standard deviations of the reference: a bug.
"""

from __future__ import annotations

import pytest
import torch

from genprobe._io import json_safe
from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT
from genprobe.verify.adapters import EngineAdapter, FullRecompute
from genprobe.verify.compare import Thresholds
from genprobe.verify.harness import VerifyOptions, verify_implementation

transformers = pytest.importorskip("transformers")

from genprobe.verify.adapters import HFAdapter  # noqa: E402

PROMPTS = [[5, 17, 42, 8, 91, 23, 64, 30], [12, 77, 3, 56, 9], [40, 2, 88]]


def gpt2(init: float):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=100,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        initializer_range=init,
        attn_implementation="eager",
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.mark.parametrize("init, spread", [(0.02, (0.05, 0.3)), (0.2, (0.5, 3.0))])
def test_padding_leak_is_a_bug_on_small_and_large_logits(init, spread):
    hf = gpt2(init)
    bad = verify_implementation(
        HFAdapter(hf, pass_position_ids=False),
        FullRecompute(hf),
        PROMPTS,
        VerifyOptions(max_new_tokens=4, chunk_sizes=(4,)),
    )
    p = bad.phase("padded_batch")
    assert spread[0] < p.ref_logit_std < spread[1]  # the two models really differ in scale
    assert bad.verdict == "bug" and p.verdict == "bug" and p.rel_dlogit > 1.0, json_safe(p)
    if init == 0.02:
        # the case of issue 12: on the seed's absolute scale alone this is only "suspicious"
        assert p.max_abs_dlogit < 1.0 and Thresholds().absolute_verdict(p.max_abs_dlogit) == "suspicious"
    # and a correct implementation passes on both: float noise is not scaled up into a verdict
    good = verify_implementation(
        HFAdapter(hf), FullRecompute(hf), PROMPTS, VerifyOptions(max_new_tokens=4, chunk_sizes=(1, 4))
    )
    assert good.verdict == "pass", {q.phase: (q.max_abs_dlogit, q.rel_dlogit) for q in good.phases}


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_engine_passes_and_a_small_fault_fails_on_both_scales(scale, prompt):
    """Our engine on an unscaled (logit std ≈ 0.1) and a sharpened tiny GPT; a 0.3-unit fault is judged by σ."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=50, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=32)).eval()
    with torch.no_grad():
        for w in m.parameters():
            if w.dim() == 2:
                w.mul_(scale)
    r = verify_implementation(EngineAdapter(m), FullRecompute(m), [prompt, prompt[:3]], VerifyOptions(max_new_tokens=8))
    assert r.verdict == "pass", r.max_abs_dlogit_by_phase

    class Shifted(EngineAdapter):  # one logit moved by 0.3 at every decode step
        def step(self, ids):
            out = super().step(ids).clone()
            out[..., 0] += 0.3
            return out

    bad = verify_implementation(
        Shifted(m), FullRecompute(m), [prompt], VerifyOptions(max_new_tokens=8, isolation=False)
    )
    std = bad.phase("incremental").ref_logit_std
    assert bad.verdict == ("bug" if std < 0.3 else "suspicious"), (std, bad.max_abs_dlogit)
    assert (scale == 1.0) == (std < 0.3)


def test_reports_carry_both_scales_and_the_second_measures(sharp_model, prompt):
    r = verify_implementation(
        EngineAdapter(sharp_model), FullRecompute(sharp_model), [prompt], VerifyOptions(max_new_tokens=4)
    )
    p = json_safe(r.phase("incremental"))
    assert p["ref_logit_std"] > 0 and p["rel_dlogit"] == pytest.approx(p["max_abs_dlogit"] / p["ref_logit_std"])
    assert p["top1_agreement"] == 1.0 and p["max_abs_dlogprob_topk"] < 1e-4
    assert json_safe(r.thresholds) == {
        "noise": 1e-4,
        "bug": 1.0,
        "suspicious": 1e-3,
        "rel_bug": 1.0,
        "rel_suspicious": 0.01,
        "exact_prefill": False,
        "floor_multiple": 4.0,
        "floor_cap": 0.1,
    }
