"""Contrastive search: our engine (our GPT over our KV cache, and HF models via HFCausalLM) vs HF's own.

Reference tokens come from transformers 4.52.4 ``GenerationMixin._contrastive_search`` (via
``_ranking_fast``) on two tiny fixed-seed models stored as safetensors under
``tests/engine/data/contrastive`` (regenerate with ``make_reference.py`` there; transformers 5 no
longer ships contrastive search in core). Every recorded step is decided by a score margin >= 1e-4,
so float rounding differences between the implementations cannot flip a choice.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from genprobe.engine.generate import generate, rank_candidates
from genprobe.engine.hf_adapter import HFCausalLM
from genprobe.engine.samplers.stages import SamplerConfig

DATA = Path(__file__).parent / "data" / "contrastive"
REF = json.loads((DATA / "expected.json").read_text(encoding="utf-8"))


def _hf(name: str):
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(
            DATA / name, local_files_only=True, use_safetensors=True, attn_implementation="eager"
        ).eval()


def _cfg(case: dict) -> SamplerConfig:
    return SamplerConfig(
        penalty_alpha=case["penalty_alpha"], top_k=case["top_k"], repetition_penalty=case.get("repetition_penalty", 1.0)
    )


@pytest.mark.parametrize("case", REF["cases"], ids=lambda c: f"{c['model']}-k{c['top_k']}-B{len(c['prompts'])}")
def test_contrastive_matches_transformers_reference(case):
    """Same tokens as transformers 4.52.4 generate(penalty_alpha=…, top_k=…), incl. left padding and a penalty."""
    hf = _hf(case["model"])
    res = generate(HFCausalLM(hf), case["prompts"], case["max_new_tokens"], sampler=_cfg(case))
    assert res.tokens == case["tokens"] and res.mode == "contrastive"
    if case["model"].startswith("gpt2"):
        from genprobe.model.hf import from_hf_gpt2

        ours = generate(from_hf_gpt2(hf), case["prompts"], case["max_new_tokens"], sampler=_cfg(case))
        assert ours.tokens == case["tokens"]


def test_reference_cases_are_not_greedy():
    """The reference would prove nothing if contrastive search picked the argmax anyway."""
    differ = 0
    for case in REF["cases"]:
        greedy = generate(
            HFCausalLM(_hf(case["model"])),
            case["prompts"],
            case["max_new_tokens"],
            sampler=SamplerConfig(greedy=True, repetition_penalty=case.get("repetition_penalty", 1.0)),
        )
        differ += greedy.tokens != case["tokens"]
    assert differ == len(REF["cases"])


def test_rank_candidates_semantics():
    """(1−α)·p − α·max cosine over real context positions (HF _ranking_fast); padding never counts."""
    context = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]])  # (B=1, S=3, d=2)
    mask = torch.tensor([[True, True, False]])  # the third position is padding
    cands = torch.tensor([[[2.0, 0.0]], [[1.0, 1.0]]])  # (B·k=2, 1, d): cos 1 with pos 0 / cos 0.707 max
    probs = torch.tensor([[0.6, 0.4]])
    # α = 0.5: 0.5·0.6 − 0.5·1 = −0.2 vs 0.5·0.4 − 0.5·0.7071 = −0.154 → candidate 1
    assert rank_candidates(context, mask, cands, probs, 0.5).tolist() == [1]
    assert rank_candidates(context, mask, cands, probs, 0.1).tolist() == [0]  # probability dominates
    # were the padded position counted, candidate 1 would have cos 1 with it and lose
    assert rank_candidates(context, torch.ones_like(mask), cands, probs, 0.5).tolist() == [0]


def test_contrastive_gpt_with_cache_equals_hf_adapter_with_eos(tiny_model):
    """Our KV-cache path (newest-slot copy) and HF's cache path (row select) give the same tokens; eos stops rows."""
    from genprobe.model.hf import to_hf_gpt2

    cfg = SamplerConfig(penalty_alpha=0.6, top_k=4)
    prompts = [[3, 4, 5], [7, 8], [9]]
    ours = generate(tiny_model, prompts, 12, sampler=cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = generate(HFCausalLM(to_hf_gpt2(tiny_model)), prompts, 12, sampler=cfg)
    assert ours.tokens == theirs.tokens
    eos = ours.tokens[0][3]
    stopped = generate(tiny_model, prompts, 12, sampler=cfg, eos_id=eos)
    assert stopped.tokens[0] == ours.tokens[0][:4] and stopped.finished[0] == "eos"


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(penalty_alpha=0.6), "top_k >= 2"),
        (dict(penalty_alpha=0.6, top_k=1), "top_k >= 2"),
        (dict(penalty_alpha=1.5, top_k=4), "penalty_alpha must be in"),
        (dict(penalty_alpha=-0.1, top_k=4), "penalty_alpha must be in"),
        (dict(penalty_alpha=0.6, top_k=4, temperature=0.7), "unset temperature"),
        (dict(penalty_alpha=0.6, top_k=4, greedy=True), "greedy"),
    ],
)
def test_contrastive_parameters_validated(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        SamplerConfig(**kwargs)


def test_contrastive_refuses_compile_and_naive(tiny_model):
    cfg = SamplerConfig(penalty_alpha=0.6, top_k=4)
    with pytest.raises(ValueError, match="contrastive"):
        generate(tiny_model, [[3, 4]], 4, sampler=cfg, mode="naive")
    with pytest.raises(ValueError, match="exceed the vocabulary"):
        generate(tiny_model, [[3, 4]], 4, sampler=SamplerConfig(penalty_alpha=0.6, top_k=60))
