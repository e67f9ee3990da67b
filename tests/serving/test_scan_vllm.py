"""Loop scans through vLLM give our engine's loop verdicts, and a served patched model our engine's loop rates.

Reference: ``genprobe.loops.scan.engine_batches`` (our engine, the same weights in float32).
"""

from __future__ import annotations

import pytest

from genprobe._io import json_safe
from genprobe.engine.samplers.stages import SamplerConfig
from genprobe.loops.scan import ScanOptions, chanting_sampler, engine_batches, scan_batches
from genprobe.serving.scan import UnsupportedSamplerError, compare_loop_rates, vllm_batches

NEW = 57  # the repair setting: 5-character openings + 57 new tokens fill the 64-token context minus 2


@pytest.fixture(scope="module")
def patched_model(served_dirs):
    from genprobe.engine.loaded import load_model

    return load_model(served_dirs["patched"])


@pytest.fixture(scope="module")
def scans(vllm_ready, served_dirs, patched_model, heldout, engine_options):
    """(our engine's scan, vLLM's scan) of the held-out openings on the patched model, chanting setting."""
    from genprobe.serving.engine import shared_engine

    eng = shared_engine(served_dirs["patched"], engine_options("float32"))
    _, prompts = heldout
    ours = scan_batches(engine_batches(patched_model.runner), prompts, ScanOptions(NEW, chanting_sampler(1)))
    theirs = scan_batches(vllm_batches(eng), prompts, ScanOptions(NEW, chanting_sampler(1), batch_size=32))
    return ours, theirs


def test_greedy_loop_verdicts_and_records_equal_our_engine(scans):
    ours, theirs = scans
    assert json_safe(ours) == json_safe(theirs)  # same JSON: settings, summary, every record and its loop measures
    for a, b in zip(ours.records, theirs.records, strict=True):
        assert (a.measures.looping, a.measures.period, a.measures.onset) == (
            b.measures.looping,
            b.measures.period,
            b.measures.onset,
        )
    assert 0 < ours.summary.loops < len(ours.records)  # both outcomes occur: the check is not vacuous


def test_served_patched_model_gives_our_loop_rate(scans):
    """Step 'serve the repaired model': the served rate lies in our engine's CI, prompt by prompt too."""
    ours, theirs = scans
    cmp = compare_loop_rates(ours, theirs)
    assert cmp.consistent and cmp.verdict_agreement == 1.0 and cmp.token_agreement == 1.0
    assert json_safe(cmp)["served_rate"] == ours.summary.loop_rate


def test_penalties_and_bans_reach_the_engine_exactly(engine, patched_model, heldout):
    """Greedy with repetition/presence/frequency penalties and a ban: vLLM's tokens are our engine's tokens."""
    _, prompts = heldout
    cfg = SamplerConfig(
        greedy=True, ban_ids=(1, 2), repetition_penalty=1.3, presence_penalty=0.2, frequency_penalty=0.1, engine="vllm"
    )
    ours = scan_batches(engine_batches(patched_model.runner), prompts[:8], ScanOptions(24, cfg))
    theirs = scan_batches(vllm_batches(engine), prompts[:8], ScanOptions(24, cfg))
    assert [r.tokens for r in ours.records] == [r.tokens for r in theirs.records]
    plain = scan_batches(vllm_batches(engine), prompts[:8], ScanOptions(24, SamplerConfig(greedy=True)))
    assert [r.tokens for r in plain.records] != [r.tokens for r in theirs.records]  # the settings did act
    assert all(t not in (1, 2) for r in theirs.records for t in r.tokens)


def test_sampled_scan_is_reproducible_by_seed(engine, heldout):
    _, prompts = heldout
    cfg = SamplerConfig(temperature=0.9, top_k=20, top_p=0.95, order="vllm")
    a = scan_batches(vllm_batches(engine), prompts[:6], ScanOptions(16, cfg, seed=3))
    b = scan_batches(vllm_batches(engine), prompts[:6], ScanOptions(16, cfg, seed=3))
    c = scan_batches(vllm_batches(engine), prompts[:6], ScanOptions(16, cfg, seed=4))
    assert [r.tokens for r in a.records] == [r.tokens for r in b.records]
    assert [r.tokens for r in a.records] != [r.tokens for r in c.records]


def test_bad_requests_are_refused_before_generation(engine, heldout):
    _, prompts = heldout
    with pytest.raises(UnsupportedSamplerError, match="no_repeat_ngram"):
        scan_batches(vllm_batches(engine), prompts[:2], ScanOptions(8, SamplerConfig(greedy=True, no_repeat_ngram=2)))
    with pytest.raises(ValueError, match="max_model_len 64"):
        scan_batches(vllm_batches(engine), prompts[:2], ScanOptions(60, SamplerConfig(greedy=True)))
    with pytest.raises(ValueError, match="outside"):
        scan_batches(vllm_batches(engine), [[5, 99999]], ScanOptions(4, SamplerConfig(greedy=True)))
