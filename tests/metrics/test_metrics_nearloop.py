"""Near-loop detector, tail compression and seq-rep-n: what each must catch and must not flag."""

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from genprobe._io import json_safe
from genprobe.metrics.degeneracy import (
    LoopSettings,
    detect_loop,
    detect_near_loop,
    lz_pieces,
    match_share,
    measure_loops,
    tail_compression,
)
from genprobe.metrics.ngrams import seq_rep_n

PREFIX = list("床前明月光，")


def _fresh(k: int) -> str:
    return chr(0x4E00 + k)  # a character no unit below uses: the worst case for every detector


def one_substitution_per_cycle(unit: str, cycles: int) -> list[str]:
    """The synthetic 'edit' of issue 14: in cycle k the token at phase k mod p becomes a new character."""
    out = []
    for k in range(cycles):
        u = list(unit)
        u[k % len(u)] = _fresh(k)
        out += u
    return out


ISSUE_UNITS = ["肅肅嚴禋，肅肅肅肅。", "君不見君家。", "鳳凰鳴矣，于彼高岡。", "abcdefg", "abcdef"]


@pytest.mark.parametrize("unit", ISSUE_UNITS)
def test_one_substitution_per_cycle_is_still_a_near_loop(unit):
    gen = (PREFIX + one_substitution_per_cycle(unit, 12))[:57]
    assert not detect_loop(gen).looping  # the exact detector is fooled
    near = detect_near_loop(gen)
    assert near.near_looping and near.period == len(unit) and 0.8 <= near.match_share < 1.0
    if len(unit) < 9:  # the plain lag-p share (one period back only) misses it: a substitution breaks two comparisons
        assert match_share(gen, len(unit), two_back=False) < 0.8


@given(st.lists(st.integers(0, 50), min_size=2, max_size=14, unique=True), st.integers(0, 12))
def test_exact_loops_are_near_loops_with_the_same_period(unit, prefix_len):
    seq = list(range(100, 100 + prefix_len)) + unit * (60 // len(unit) + 1)
    seq = seq[:57]
    exact, near = detect_loop(seq), detect_near_loop(seq)
    assert exact.looping
    if exact.onset + exact.period <= len(seq) - 32:  # every compared tail position has its copy inside the loop
        assert near.near_looping and near.match_share == 1.0 and near.onset == exact.onset
    if near.near_looping:  # period 4 is reported as 4, not 2 (fully matched two periods back) or 8
        assert near.period == exact.period


def test_onset_follows_the_start_of_the_repetition():
    unit = "君不見君家。"
    prose = "春江潮水連海平海上明月共潮生灩灩隨波千萬里何處春江無月明"  # 28 characters
    gen = list(prose[:14]) + one_substitution_per_cycle(unit, 8)[:43]
    near = detect_near_loop(gen)
    assert near.near_looping and near.period == 6
    assert 14 <= near.onset <= 20  # the repetition's first unit starts at 14
    assert detect_near_loop(list(prose) + list(unit) * 7).onset == 28


def test_documented_limit_short_period_with_a_substitution_per_cycle():
    """Periods <= 5 with a new token in every cycle change >= 20% of tokens: not near loops, but compressible."""
    for unit in ("君不見，", "abcd"):
        gen = (PREFIX + one_substitution_per_cycle(unit, 16))[:57]
        assert not detect_near_loop(gen).near_looping
        assert tail_compression(gen) > 2.0


def test_no_near_loop_and_low_compression_on_human_text(corpus, tokenizer):
    val = corpus.val
    n, ratios = 0, []
    for i in range(0, len(val) - 57 + 1, 19):
        w = val[i : i + 57]
        near = detect_near_loop(w)
        assert not near.near_looping, (w, near)
        if "□" not in w:  # the corpus writes lost characters as runs of □, which do repeat
            ratios.append(tail_compression(w))
        n += 1
    ids = tokenizer.encode(val, warn=False)
    for i in range(0, len(ids) - 57 + 1, 57):
        assert not detect_near_loop(ids[i : i + 57]).near_looping
    assert n > 1000 and max(ratios) < 2.0 and sum(ratios) / len(ratios) < 1.1


def test_match_share_by_hand():
    # t = a b a c a b a c ; p = 2, positions 2..7: a==a; c!=b (nothing two back); a==a; b!=c but b==b two back;
    # a==a; c!=b but c==c two back -> 5/6 looking two periods back, 3/6 looking one back
    t = list("abacabac")
    assert match_share(t, 2, window=8) == pytest.approx(5 / 6)
    assert match_share(t, 2, window=8, two_back=False) == 0.5
    assert match_share(t, 4, window=8) == 1.0
    assert match_share(t, 4, window=2) == 1.0 and match_share(list("abcdabcx"), 4, window=2) == 0.5
    with pytest.raises(ValueError, match="period"):
        match_share(t, 0)


def test_near_loop_threshold_is_inclusive_and_validated():
    # 30 compared positions, 24 matches -> exactly 0.8 counts as a near loop
    unit = list("abcdefghij")
    seq = unit * 6
    for k in (12, 25, 38, 51):  # four isolated substitutions at positions 12.. break 4 + their followers...
        seq[k] = _fresh(k)
    share = match_share(seq, 10)
    assert detect_near_loop(seq).near_looping == (share >= 0.8)
    with pytest.raises(ValueError, match="min_match"):
        detect_near_loop(seq, min_match=0.0)
    with pytest.raises(ValueError, match="window"):
        detect_near_loop(seq, window=4)
    assert not detect_near_loop([]).near_looping and not detect_near_loop(list("abc")).near_looping


def test_lz_pieces_by_hand():
    assert lz_pieces("abcabcabc") == 4  # a | b | c | abcabc (a copy may overlap what it writes)
    assert lz_pieces("aaaa") == 2  # a | aaa
    assert lz_pieces("abcd") == 4
    assert lz_pieces("abcabcabc", start=3) == 1  # the tail is one copy of earlier text
    assert lz_pieces("") == 0
    with pytest.raises(ValueError, match="start"):
        lz_pieces("abc", start=4)


def test_tail_compression_exact_loop_is_one_piece():
    gen = PREFIX + list("君不見，") * 14
    assert tail_compression(gen) == 32.0
    assert tail_compression(list("春江潮水連海平")) == 1.0
    assert tail_compression([]) == 0.0


def _welleck_seq_rep(tokens, n):
    """Reference: facebookresearch/unlikelihood_training, custom/metrics.py, ``ngram_metrics``:
    ``pct_repeat_{n}grams = 1 - len(Counter(ngrams)) / len(ngrams)`` on the continuation."""
    ngs = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(Counter(ngs)) / len(ngs)


@given(st.lists(st.integers(0, 3), min_size=4, max_size=60))
def test_seq_rep_4_is_welleck_definition(tokens):
    assert seq_rep_n(tokens, 4) == pytest.approx(_welleck_seq_rep(tokens, 4))


def test_measure_loops_any_loop_and_period():
    gen = (PREFIX + one_substitution_per_cycle("肅肅嚴禋，肅肅肅肅。", 6))[:57]
    m = measure_loops(gen)
    assert not m.looping and m.near_looping and m.any_loop and m.any_period == 10 and m.degenerate
    d = json_safe(m)
    assert d["any_loop"] and d["degenerate"] and d["near_period"] == 10 and isinstance(d["unit"], list)
    clean = measure_loops(list("春江潮水連海平，海上明月共潮生。灩灩隨波千萬里，何處春江無月明。"))
    assert not clean.any_loop and clean.any_period is None and not clean.repetitive and not clean.degenerate


def test_repetitive_tail_catches_a_chant_whose_unit_shifts():
    """The issue's second sample: '君不見，君不見君家。君不見君，…' repeats with insertions, so no period fits."""
    gen = list("，何處不堪眠。君不見，君不見君家。君不見君，君不見。君不見君家，君不見君。君不見，君不見君家。")
    m = measure_loops(gen)
    assert not m.looping and not m.near_looping
    assert m.tail_compression >= 2.5 and m.repetitive and m.degenerate
    with pytest.raises(ValueError, match="min_compression"):
        LoopSettings(min_compression=0.5)


def test_no_repetitive_tail_in_human_text(corpus):
    val = corpus.val
    windows = [val[i : i + 57] for i in range(0, len(val) - 57 + 1, 7) if "□" not in val[i : i + 57]]
    assert len(windows) > 3000
    assert not any(measure_loops(w).degenerate for w in windows[::5])
