"""SamplerConfig → vLLM SamplingParams: exact where vLLM can express it, refused where it cannot.

"Exact" means: genprobe's ``engine="vllm"`` chain (which the sampler tests check op for op) on the same
settings equals vLLM's own code, checked here where it is installed:
``vllm/v1/sample/ops/topk_topp_sampler.py:apply_top_k_top_p_pytorch`` (top-k/top-p),
``vllm/v1/sample/logits_processor/builtin.py:MinPLogitsProcessor.apply`` (min-p),
``vllm/model_executor/layers/utils.py:apply_penalties`` (repetition/presence/frequency), in the order of
``vllm/v1/sample/sampler.py:Sampler`` (penalties → temperature → min-p → top-k → top-p).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from genprobe.engine.samplers.chain import adjust_logits, process_logits
from genprobe.engine.samplers.stages import SamplerConfig
from genprobe.serving import scan as smap
from genprobe.serving.scan import UnsupportedSamplerError, sampling_kwargs

NEG_INF = float("-inf")

V = 12


def hard_logits() -> torch.Tensor:
    """Rows with ties at the k-th value, -inf entries, a dominant token, a flat row, and probabilities
    0.4/0.3/0.2/0.1 (where top-p 0.5 and min-p 0.6 keep 2 tokens in one order and 1 in the other)."""
    return torch.tensor(
        [
            [3.0, 2.0, 2.0, 2.0, 1.0, 0.5, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0],
            [5.0, NEG_INF, 1.0, 1.0, 0.2, 0.2, 0.2, NEG_INF, -1.0, -1.0, -9.0, 0.0],
            [0.0] * V,
            [10.0, 9.0, 8.5, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2],
            [math.log(0.4), math.log(0.3), math.log(0.2), math.log(0.1)] + [-60.0] * (V - 4),
        ]
    )


# ---- the mapping itself (no vLLM needed) -------------------------------------------------------------
def test_greedy_and_plain_fields_map_one_to_one():
    kw = sampling_kwargs(SamplerConfig(greedy=True, repetition_penalty=1.3, presence_penalty=0.5, engine="vllm"), V)
    assert kw["temperature"] == 0.0 and kw["repetition_penalty"] == 1.3 and kw["presence_penalty"] == 0.5
    kw = sampling_kwargs(SamplerConfig(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, order="vllm"), V)
    assert (kw["temperature"], kw["top_k"], kw["top_p"], kw["min_p"]) == (0.7, 5, 0.9, 0.05)
    kw = sampling_kwargs(SamplerConfig(), V)  # plain τ = 1 sampling: no arithmetic to differ, any engine
    assert (kw["top_k"], kw["top_p"], kw["min_p"]) == (0, 1.0, 0.0)  # "off" in vLLM's spelling
    sampling_kwargs(SamplerConfig(greedy=True, ban_ids=(1,)), V)  # greedy + ban: any engine


@pytest.mark.parametrize(
    "cfg",
    [
        SamplerConfig(greedy=True, repetition_penalty=1.3),  # genprobe: x/p; vLLM: x·(1/p) in float32
        SamplerConfig(temperature=0.7, top_p=0.9, order="vllm", engine="genprobe"),  # float64 nucleus, lower-id ties
        SamplerConfig(top_k=5, order="hf"),  # hf engine
    ],
)
def test_other_engines_arithmetic_is_refused(cfg):
    with pytest.raises(UnsupportedSamplerError, match="engine='vllm'"):
        sampling_kwargs(cfg, V)


@pytest.mark.parametrize(
    "cfg, name",
    [
        (SamplerConfig(greedy=True, no_repeat_ngram=3), "no_repeat_ngram"),
        (SamplerConfig(typical_p=0.9, order="vllm"), "typical_p"),
        (SamplerConfig(top_n_sigma=1.0, order="vllm"), "top_n_sigma"),
        (SamplerConfig(greedy=True, dry_multiplier=0.8), "DRY"),
        (SamplerConfig(xtc_probability=0.5, order="vllm"), "XTC"),
        (SamplerConfig(top_k=4, penalty_alpha=0.6, order="vllm"), "contrastive"),
        (SamplerConfig(greedy=True, repetition_penalty=1.1, penalty_last_n=64), "penalty_last_n"),
    ],
)
def test_samplers_vllm_lacks_are_refused_by_name(cfg, name):
    with pytest.raises(UnsupportedSamplerError, match=name):
        sampling_kwargs(cfg, V)


def test_inactive_settings_of_missing_samplers_are_accepted():
    """DRY's base or XTC's threshold without their switch change nothing: no reason to refuse."""
    sampling_kwargs(SamplerConfig(greedy=True, dry_base=2.0, xtc_threshold=0.3, typical_p=1.0), V)


def test_ban_is_an_exact_whitelist_not_a_logit_bias():
    kw = sampling_kwargs(SamplerConfig(greedy=True, ban_ids=(1, 3)), V)
    assert kw["allowed_token_ids"] == [i for i in range(V) if i not in (1, 3)] and "logit_bias" not in kw
    with pytest.raises(UnsupportedSamplerError, match="outside"):
        sampling_kwargs(SamplerConfig(greedy=True, ban_ids=(V,)), V)


@pytest.mark.parametrize(
    "cfg",
    [
        SamplerConfig(temperature=0.5, top_p=0.9, engine="vllm"),  # trunc_then_temp: top-p before τ; vLLM: τ first
        SamplerConfig(temperature=2.0, min_p=0.1, order="hf", engine="vllm"),  # hf: τ → min-p is fine, but …
        SamplerConfig(top_p=0.5, min_p=0.6, order="hf", engine="vllm"),  # … top-p before min-p is not vLLM's order
        SamplerConfig(temperature=0.5, min_p=0.1, order="llama.cpp", engine="vllm"),
    ],
)
def test_orders_vllm_cannot_follow_are_refused_and_really_differ(cfg):
    """Each refused config has a hard-case input where its order and vLLM's order give different distributions."""
    if cfg.order == "hf" and cfg.top_p is None:
        sampling_kwargs(cfg, V)  # τ → min-p is vLLM's order too: accepted
        return
    with pytest.raises(UnsupportedSamplerError, match="order"):
        sampling_kwargs(cfg, V)
    z = hard_logits()
    ours = torch.softmax(process_logits(z, None, cfg), -1)
    theirs = torch.softmax(process_logits(z, None, dataclasses.replace(cfg, order="vllm")), -1)
    assert not torch.allclose(ours, theirs, atol=1e-6)


@pytest.mark.parametrize(
    "cfg",
    [
        SamplerConfig(temperature=0.5, top_k=3, engine="vllm"),  # trunc_then_temp: top-k → τ; top-k commutes with τ
        SamplerConfig(top_p=0.9, engine="vllm"),  # a single truncation at τ = 1: the order is moot
        SamplerConfig(temperature=1.5, order="hf", engine="vllm"),
        SamplerConfig(temperature=0.5, top_k=3, top_p=0.8, order="hf", engine="vllm"),  # τ, top-k, top-p: vLLM's order
    ],
)
def test_accepted_orders_give_vllms_distribution(cfg):
    sampling_kwargs(cfg, V)
    z = hard_logits()
    ours = torch.softmax(process_logits(z, None, cfg), -1)
    theirs = torch.softmax(process_logits(z, None, dataclasses.replace(cfg, order="vllm")), -1)
    torch.testing.assert_close(ours, theirs, atol=1e-7, rtol=0)


def test_a_field_without_a_mapping_is_refused_not_dropped(monkeypatch):
    """A sampler setting added later (simulated: min_p's stage is missing) is refused until a stage maps it."""
    monkeypatch.setattr(smap, "STAGES", tuple(s for s in smap.STAGES if s.name != "min_p"))
    with pytest.raises(UnsupportedSamplerError, match="min_p=0.1"):
        sampling_kwargs(SamplerConfig(min_p=0.1, order="vllm"), V)
    sampling_kwargs(SamplerConfig(order="vllm"), V)  # at its default the unknown field changes nothing: accepted


# ---- against vLLM's own sampler code -------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_ops(vllm_ready):
    from vllm.model_executor.layers.utils import apply_penalties
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    return apply_top_k_top_p_pytorch, apply_penalties


def _vllm_min_p(z: torch.Tensor, min_p: float) -> torch.Tensor:
    """vLLM's MinPLogitsProcessor.apply, run through the class itself."""
    from types import SimpleNamespace

    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor

    cfg = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=z.shape[0]))
    proc = MinPLogitsProcessor(cfg, torch.device("cpu"), False)
    added = [(i, SamplingParams(min_p=min_p), None, []) for i in range(z.shape[0])]
    proc.update_state(BatchUpdate(batch_size=z.shape[0], removed=[], added=added, moved=[]))
    return proc.apply(z)


@pytest.mark.parametrize(
    "cfg",
    [
        SamplerConfig(temperature=0.7, top_k=3, order="vllm"),
        SamplerConfig(temperature=1.3, top_k=4, top_p=0.6, min_p=0.05, order="vllm"),
        SamplerConfig(top_p=0.5, order="vllm"),
        SamplerConfig(temperature=0.5, min_p=0.3, order="vllm"),
        SamplerConfig(temperature=0.5, top_k=2, engine="vllm"),  # default order: accepted, top-k commutes with τ
    ],
)
def test_mapped_sampler_equals_vllms_pipeline(vllm_ops, cfg):
    top_k_top_p, _ = vllm_ops
    kw = sampling_kwargs(cfg, V)
    z = hard_logits()
    B = z.shape[0]
    x = z.clone() / kw["temperature"]
    if kw["min_p"]:
        x = _vllm_min_p(x, kw["min_p"])
    k = torch.full((B,), kw["top_k"], dtype=torch.long) if kw["top_k"] else None
    p = torch.full((B,), kw["top_p"]) if kw["top_p"] < 1.0 else None
    x = top_k_top_p(x, k, p, allow_cpu_sync=True)
    ours = process_logits(z, None, cfg)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(x))  # the same kept sets, ties included
    torch.testing.assert_close(torch.softmax(ours, -1), torch.softmax(x, -1), atol=1e-6, rtol=0)


def test_penalties_equal_vllms(vllm_ops):
    """Repetition over prompt + output, presence/frequency over output only — ours and vLLM's apply_penalties."""
    _, apply_penalties = vllm_ops
    z = hard_logits()
    prompts = [[0, 1, 1], [2, 3, 3], [5], [11, 0, 4], [1]]
    outputs = [[1, 2, 2, 2], [3], [5, 5, 6], [7, 8], [0, 0, 0, 0]]
    cfg = SamplerConfig(greedy=True, repetition_penalty=1.7, presence_penalty=0.4, frequency_penalty=0.3, engine="vllm")
    P = max(map(len, prompts))
    hist = torch.tensor(
        [[-1] * (P - len(p)) + p + o + [-1] * (4 - len(o)) for p, o in zip(prompts, outputs, strict=True)]
    )
    ours = adjust_logits(z, hist, cfg, prompt_len=P)
    pad = lambda rows, n: torch.tensor([r + [V] * (n - len(r)) for r in rows])  # noqa: E731 - vLLM pads with V
    B = z.shape[0]
    theirs = apply_penalties(
        z.clone(), pad(prompts, P), pad(outputs, 4), torch.full((B,), 0.4), torch.full((B,), 0.3), torch.full((B,), 1.7)
    )
    fin = torch.isfinite(ours)
    assert torch.equal(fin, torch.isfinite(theirs))
    assert torch.equal(ours[fin], theirs[fin])  # op for op: bit-identical
    assert not math.isclose(float(ours[0, 1]), float(z[0, 1]))  # the penalties did act on this input
