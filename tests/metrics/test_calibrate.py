"""Loop-detector calibration on human text: exact scores, thresholds that move, held-out FPR, no blind detector."""

from __future__ import annotations

import random

import pytest

from genprobe._io import json_safe
from genprobe.metrics.calibrate import MARGINS, calibrate_loop_settings, flags, human_scores
from genprobe.metrics.degeneracy import LoopSettings, measure_loops

LENGTH = 64


def prose(rng: random.Random) -> list[int]:
    """Human-like: no token repeats within a sequence (compression 1, no period)."""
    return rng.sample(range(10_000), LENGTH)


def quoting(rng: random.Random) -> list[int]:
    """Human text that quotes itself: the 32-token tail is two 12-token copies of earlier text and 8 new tokens,
    10 LZ pieces (3.2 tail tokens per piece: over the default 2.5), no period."""
    head = rng.sample(range(10_000), 32)
    new = rng.sample(range(10_000, 20_000), 8)
    return head + head[0:12] + new[:4] + head[12:24] + new[4:]


def looping(rng: random.Random, period: int = 3) -> list[int]:
    """A degenerate generation: 20 tokens of prose, then one unit over and over."""
    start = rng.sample(range(10_000), 20)
    unit = rng.sample(range(20_000, 30_000), period)
    return start + [unit[i % period] for i in range(LENGTH - 20)]


def corpus(n: int, kinds: list, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [kinds[i % len(kinds)](rng) for i in range(n)]


def test_scores_reproduce_every_detector_verdict():
    rng = random.Random(1)
    seqs = [prose(rng), quoting(rng), looping(rng), looping(rng, 7), [1, 2] * 32, [5] * 64]
    seqs += [[rng.randrange(4) for _ in range(LENGTH)] for _ in range(30)]  # small alphabet: near loops, ties
    grid = [
        LoopSettings(),
        LoopSettings(min_tail=12, min_match=0.6, min_compression=2.0),
        LoopSettings(min_tail=30, min_match=0.95, min_compression=5.0),
    ]
    for s in grid:
        for seq in seqs:
            m = measure_loops(seq, s)
            f = flags(human_scores(seq, s), s)
            assert (f["exact"], f["near"], f["repetitive"], f["degenerate"]) == (
                m.looping,
                m.near_looping,
                m.repetitive,
                m.degenerate,
            )


def test_defaults_kept_when_human_text_is_clean():
    cal = calibrate_loop_settings(corpus(200, [prose]), source="synthetic", chars_unit=False)
    assert cal.settings == LoopSettings() and cal.changed == [] and cal.meets_target
    assert cal.heldout_fpr["degenerate"].flagged == 0 and cal.n_calibrate == cal.n_heldout == 100


def test_thresholds_move_on_repetitive_human_text_and_held_out_fpr_meets_target():
    # one human sequence in ten quotes itself: the default repetitive-tail threshold flags 10% of human text
    seqs = corpus(600, [prose] * 9 + [quoting])
    assert all(human_scores(s, LoopSettings()).compression == pytest.approx(3.2) for s in seqs[9::10])
    cal = calibrate_loop_settings(seqs, source="synthetic", chars_unit=False, target=0.01)
    assert cal.defaults_heldout_fpr["repetitive"].rate == pytest.approx(0.1)
    assert cal.changed == ["min_compression"]
    # the quantile plus the margin, not looser: just above the quoting score
    assert cal.settings.min_compression == pytest.approx(3.2 + MARGINS["min_compression"])
    assert cal.calibration_fpr["degenerate"].rate <= 0.01
    assert cal.heldout_fpr["degenerate"].rate <= 0.01 and cal.heldout_fpr["degenerate"].n == 300
    assert cal.meets_target


def test_target_is_respected_at_a_looser_level():
    seqs = corpus(600, [prose] * 9 + [quoting])
    loose = calibrate_loop_settings(seqs, source="synthetic", chars_unit=False, target=0.2)
    assert loose.settings == LoopSettings()  # 10% flagged is within a 20% target: defaults kept


def test_a_loop_is_still_flagged_after_calibration():
    rng = random.Random(7)
    seqs = corpus(600, [prose] * 9 + [quoting])
    cal = calibrate_loop_settings(seqs, source="synthetic", chars_unit=False)
    for period in (1, 3, 7):
        assert measure_loops(looping(rng, period), cal.settings).degenerate


def test_caps_keep_detectors_seeing_loops_when_human_text_loops():
    # a third of the "human" text is an exact loop: meeting 1% would need thresholds above every loop
    seqs = corpus(300, [prose, quoting, looping])
    cal = calibrate_loop_settings(seqs, source="synthetic", chars_unit=False)
    assert not cal.meets_target and cal.capped
    s = cal.settings
    assert s.min_match <= 1.0 and s.min_compression <= s.window / 2 and s.min_tail <= s.window
    m = measure_loops(looping(random.Random(3)), s)
    assert m.looping and m.repetitive and m.degenerate
    assert "NOT met" in cal.describe()


def test_never_stricter_than_the_defaults_nor_below_them():
    seqs = corpus(200, [prose] * 4 + [quoting])
    base = LoopSettings(min_compression=4.0)  # already above the quoting score: nothing to move
    cal = calibrate_loop_settings(seqs, source="synthetic", chars_unit=False, base=base)
    assert cal.settings == base


def test_to_dict_carries_source_length_unit_and_rates():
    cal = calibrate_loop_settings(corpus(40, [prose]), source="english:lee-corpus", chars_unit=True)
    d = json_safe(cal)
    assert d["source"] == "english:lee-corpus" and d["length"] == LENGTH and d["chars_unit"] is True
    assert set(d["heldout_fpr"]) == {"exact", "near", "any_loop", "repetitive", "degenerate"}
    assert d["heldout_fpr"]["degenerate"]["ci95"][0] == 0.0 and d["settings"] == json_safe(LoopSettings())


@pytest.mark.parametrize(
    "seqs, kw, match",
    [
        ([[1, 2, 3]] * 10, {}, "at least 20"),
        ([list(range(64))] * 19 + [list(range(63))], {}, "all have the scan's length"),
        ([list(range(64))] * 20, {"target": 1.0}, "target must be in"),
    ],
)
def test_bad_input(seqs, kw, match):
    with pytest.raises(ValueError, match=match):
        calibrate_loop_settings(seqs, source="x", chars_unit=False, **kw)


def test_margins_are_positive():
    # flagged iff score >= threshold: a zero margin would leave the quantile's own sequence flagged
    assert min(MARGINS.values()) > 0
