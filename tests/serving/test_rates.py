"""compare_loop_rates: the served rate inside our engine's 95% interval, per-prompt agreement beside it."""

from __future__ import annotations

import pytest

from genprobe._io import json_safe
from genprobe.loops.scan import ScanResult, ScanSettings, generation_record, summarise
from genprobe.metrics.degeneracy import LoopSettings
from genprobe.serving.scan import compare_loop_rates

LOOPING = [5, 6, 7, 8] * 6  # period 4, 24 tokens
FREE = list(range(10, 34))  # no repetition at all


def _scan(looping: list[bool]) -> ScanResult:
    loop = LoopSettings()
    recs = [
        generation_record([i], LOOPING if lp else FREE, True, None, loop, None, None) for i, lp in enumerate(looping)
    ]
    return ScanResult(recs, summarise(recs), ScanSettings({}, 24, 0, json_safe(loop)))


def test_same_rate_is_consistent_and_a_far_rate_is_not():
    ours = _scan([True] * 10 + [False] * 90)
    same_rate_other_prompts = _scan([False] * 90 + [True] * 10)
    cmp = compare_loop_rates(ours, same_rate_other_prompts)
    assert cmp.consistent and cmp.served_rate == cmp.ours_rate == 0.1
    assert cmp.verdict_agreement == 0.8  # equal rates, different prompts: the second measure shows it
    far = compare_loop_rates(ours, _scan([True] * 40 + [False] * 60))
    assert not far.consistent and far.served_rate == 0.4 and json_safe(far)["consistent"] is False


def test_different_prompt_sets_are_refused():
    a = _scan([True, False])
    b = _scan([True, False])
    b.records[1].prompt_ids = [7]
    with pytest.raises(ValueError, match="same prompts"):
        compare_loop_rates(a, b)
