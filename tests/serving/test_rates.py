"""compare_loop_rates: the served rate inside our engine's 95% interval, per-prompt agreement beside it."""

from __future__ import annotations

import pytest

from genprobe.loops.scan import ScanResult, summarise
from genprobe.serving.rates import compare_loop_rates


def _scan(looping: list[bool], tokens: list[list[int]] | None = None) -> ScanResult:
    recs = []
    for i, lp in enumerate(looping):
        recs.append({"prompt_ids": [i], "tokens": tokens[i] if tokens else [i, i], "looping": lp,
                     "period": 2 if lp else None, "onset": 0 if lp else None, "hit_limit": True, "distinct_2": 0.5,
                     "seq_rep_4": 0.0, "longest_repeat": 0, "unk_share": 0.0})
    return ScanResult(recs, summarise(recs))


def test_same_rate_is_consistent_and_a_far_rate_is_not():
    ours = _scan([True] * 10 + [False] * 90)
    same_rate_other_prompts = _scan([False] * 90 + [True] * 10)
    cmp = compare_loop_rates(ours, same_rate_other_prompts)
    assert cmp.consistent and cmp.served_rate == cmp.ours_rate == 0.1
    assert cmp.verdict_agreement == 0.8  # equal rates, different prompts: the second measure shows it
    far = compare_loop_rates(ours, _scan([True] * 40 + [False] * 60))
    assert not far.consistent and far.served_rate == 0.4 and far.to_dict()["consistent"] is False


def test_different_prompt_sets_are_refused():
    a = _scan([True, False])
    b = _scan([True, False])
    b.records[1]["prompt_ids"] = [7]
    with pytest.raises(ValueError, match="same prompts"):
        compare_loop_rates(a, b)
