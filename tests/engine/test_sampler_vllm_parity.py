"""The ``vllm`` engine against vLLM's PyTorch sampler.

vLLM is not a dependency: when ``import vllm`` works the real functions are compared on hard
logits; otherwise (always, too) the vectors below are derived by hand from vLLM's source:

* vllm/v1/sample/sampler.py — Sampler.sample: penalties → temperature (float32 ``div_``) →
  argmax-invariant processors (min-p) → top-k/top-p;
* vllm/v1/sample/ops/topk_topp_sampler.py — apply_top_k_top_p_pytorch: ascending ``sort``,
  top-k keeps every logit >= the k-th, top-p drops ``cumsum <= 1 - p`` with ``p`` a float32 tensor;
* vllm/v1/sample/logits_processor/builtin.py — MinPLogitsProcessor.apply;
* vllm/_custom_ops.py — apply_repetition_penalties_torch: ``logits *= where(logits > 0, 1/p, p)``
  on prompt ∪ output tokens; vllm/model_executor/layers/utils.py — apply_penalties: frequency and
  presence on output tokens only (OpenAI's definition);
* vllm/sampling_params.py — SamplingParams.__post_init__: 0 < τ < _MAX_TEMP (0.01) becomes 0.01.
"""

from __future__ import annotations

import pytest
import torch

from genprobe.engine.samplers.chain import process_logits
from genprobe.engine.samplers.stages import SamplerConfig

VLLM = SamplerConfig(order="vllm")


def _kept(z: torch.Tensor) -> list[bool]:
    return torch.isfinite(z)[0].tolist()


def test_vllm_top_p_ties_at_the_cut():
    """Four equal logits, p = 0.5: ascending sort puts ids 0, 1 first; cumsum 0.25, 0.5 <= 0.5 drops both."""
    assert _kept(process_logits(torch.zeros(1, 4), None, VLLM.replace(top_p=0.5))) == [False, False, True, True]


def test_vllm_top_p_threshold_is_one_minus_float32_p():
    """logits (−2.1972244, 0), p = 0.9: the smaller token's cumsum is 0.10000001639.

    vLLM: 1 − float32(0.9) = 0.10000002384 → cumsum <= it → token 0 dropped.
    HF: float32(1 − 0.9) = 0.10000000149 → kept (checked against TopPLogitsWarper itself).
    """
    from transformers.generation.logits_process import TopPLogitsWarper

    z = torch.tensor([[-2.1972243785858154, 0.0]])
    cum0 = torch.softmax(z, -1)[0, 0].item()
    assert 0.10000000149011612 < cum0 <= 0.10000002384185791
    assert _kept(process_logits(z, None, VLLM.replace(top_p=0.9))) == [False, True]
    assert _kept(TopPLogitsWarper(0.9)(None, z.clone())) == [True, True]
    assert _kept(process_logits(z, None, SamplerConfig(top_p=0.9, order="hf"))) == [True, True]


def test_vllm_temperature_floor():
    """0 < τ < 0.01 is raised to 0.01 (SamplingParams.__post_init__); HF divides by τ as given."""
    z = torch.tensor([[0.02, 0.01, -0.03]])
    assert torch.equal(process_logits(z, None, VLLM.replace(temperature=0.001)), z / torch.tensor([0.01]))
    assert torch.equal(process_logits(z, None, SamplerConfig(temperature=0.001, order="hf")), z / 0.001)


def test_vllm_repetition_penalty_multiplies_by_the_reciprocal():
    """1.5 with p = 1.1: vLLM 1.5 · float32(1/1.1) = 1.3636362553; HF 1.5 / 1.1 = 1.3636363745."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    z, hist = torch.tensor([[1.5, -2.0, 0.7]]), torch.tensor([[0, 1]])
    ours = process_logits(z, hist, SamplerConfig(repetition_penalty=1.1, greedy=True, engine="vllm"))
    assert ours[0].tolist() == [1.3636362552642822, -2.200000047683716, 0.699999988079071]
    hf = RepetitionPenaltyLogitsProcessor(1.1)(hist, z.clone())
    assert hf[0, 0].item() == 1.3636363744735718 != ours[0, 0].item()


def test_vllm_penalty_scopes():
    """Repetition: prompt ∪ output. Frequency/presence: output only (prompt = first 3 history columns)."""
    hist = torch.tensor([[2, 2, 0, 2, 3, 3]])
    z = torch.full((1, 5), 2.0)
    cfg = SamplerConfig(
        repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25, greedy=True, engine="vllm"
    )
    out = process_logits(z, hist, cfg, prompt_len=3)[0].tolist()
    # id 0: prompt only → 2/2 = 1; id 2: 2/2 − 0.5·1 − 0.25 = 0.25; id 3: 1 − 0.5·2 − 0.25 = −0.25
    assert out == [1.0, 2.0, 0.25, -0.25, 2.0]


def test_vllm_top_k_keeps_ties_and_min_p_runs_before_top_p():
    """top-k 2 on (1, 2, 2, 2, 0) keeps the three 2s; min-p then top-p differs from HF's top-p then min-p."""
    assert _kept(process_logits(torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0]]), None, VLLM.replace(top_k=2))) == [
        False,
        True,
        True,
        True,
        False,
    ]
    z = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    # vLLM: min-p 0.3 drops 0.1 (< 0.12); renormalised 0.444, 0.333, 0.222 → top-p 0.75 keeps two.
    assert sum(_kept(process_logits(z, None, VLLM.replace(min_p=0.3, top_p=0.75)))) == 2
    # HF: top-p 0.75 on the original keeps three (0.4 + 0.3 < 0.75), min-p then keeps all three.
    assert sum(_kept(process_logits(z, None, SamplerConfig(min_p=0.3, top_p=0.75, order="hf")))) == 3


# ---- against vLLM itself, when installed ------------------------------------------------------
def _vllm_top_k_top_p():
    ops = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
    fn = getattr(ops, "apply_top_k_top_p_pytorch", None) or ops.apply_top_k_top_p
    return fn


def test_top_k_top_p_equal_vllm_itself():
    """apply_top_k_top_p(_pytorch) on tie-heavy logits with -inf entries, all k/p combinations."""
    fn = _vllm_top_k_top_p()
    g = torch.Generator().manual_seed(0)
    levels = torch.tensor([-3.0, -1.0, 0.0, 0.0, 1.0, 1.0, 2.0, float("-inf")])
    for _ in range(200):
        z = levels[torch.randint(0, len(levels), (3, 10), generator=g)]
        z[:, 0] = 0.0
        k = int(torch.randint(1, 11, (1,), generator=g))
        p = [0.3, 0.5, 0.9, 0.95][int(torch.randint(0, 4, (1,), generator=g))]
        theirs = fn(z.clone(), torch.full((3,), k, dtype=torch.long), torch.full((3,), p, dtype=torch.float32))
        ours = process_logits(z, None, VLLM.replace(top_k=k, top_p=p))
        assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))


def test_penalties_equal_vllm_itself():
    """vllm.model_executor.layers.utils.apply_penalties (prompt ∪ output repetition, output-only freq/presence)."""
    utils = pytest.importorskip("vllm.model_executor.layers.utils")
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        z = torch.randn(2, 12, generator=g)
        prompt, output = torch.randint(0, 12, (2, 5), generator=g), torch.randint(0, 12, (2, 4), generator=g)
        theirs = utils.apply_penalties(
            z.clone(), prompt, output, torch.full((2,), 0.3), torch.full((2,), 0.2), torch.full((2,), 1.3)
        )
        cfg = SamplerConfig(
            repetition_penalty=1.3, presence_penalty=0.3, frequency_penalty=0.2, greedy=True, engine="vllm"
        )
        ours = process_logits(z, torch.cat([prompt, output], 1), cfg, prompt_len=5)
        assert torch.allclose(ours, theirs, atol=0, rtol=0)
