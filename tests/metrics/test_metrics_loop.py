"""Loop detector on constructed sequences and on real validation text (no false positives)."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from genprobe.metrics.degeneracy import detect_loop, periodic_tail_length


def _aperiodic(n, seed, alphabet=1000):
    rng = random.Random(seed)
    return [rng.randrange(100, 100 + alphabet) for _ in range(n)]


def _unit(p, seed):
    # distinct tokens so the unit is primitive (its smallest period is exactly p)
    rng = random.Random(seed)
    return rng.sample(range(5000, 6000), p)


@pytest.mark.parametrize("period", [1, 2, 4, 10, 23])
def test_periodic_tail_found_with_smallest_period(period):
    prefix = _aperiodic(7, seed=period)
    unit = _unit(period, seed=period + 1)
    reps = max(3, -(-16 // period))  # at least 16 tokens and 3 units
    tokens = prefix + unit * reps + unit[: period // 2]
    info = detect_loop(tokens)
    assert info.looping
    assert info.period == period
    assert info.onset == len(prefix)
    assert info.unit == tuple(unit)
    assert info.repeats == pytest.approx((len(tokens) - len(prefix)) / period)


def test_long_period_up_to_half_the_length():
    unit = _unit(23, 0)
    tokens = unit * 2  # exactly two full repeats, period = half the length
    info = detect_loop(tokens)
    assert info.looping and info.period == 23 and info.onset == 0
    assert not detect_loop(tokens, max_period=22).looping


def test_chant_vs_couplet_cycle_are_distinguished():
    chant = list("山中日，") * 14
    couplet = list("山中日月明，水上風雲起。") * 5
    assert detect_loop(chant).period == 4
    assert detect_loop(couplet).period == 12


@pytest.mark.parametrize("period", [2, 4, 10])
def test_single_mutation_in_tail_breaks_or_shortens_loop(period):
    unit = _unit(period, 3)
    tokens = _aperiodic(5, 9) + unit * 3
    # mutate the second-to-last token: the periodic tail is now shorter than one unit + 1
    mutated = list(tokens)
    mutated[-2] = -1
    info = detect_loop(mutated)
    assert not info.looping


def test_mutation_before_tail_moves_onset():
    unit = list("不知，")
    tokens = list("床前明月光，") + unit * 6
    clean = detect_loop(tokens)
    m = list(tokens)
    m[6 + 3 * 2] = "X"  # break the third unit
    info = detect_loop(m)
    assert info.looping and info.period == 3
    assert info.onset > clean.onset


def test_short_accidents_are_not_loops():
    assert not detect_loop(list("春江潮水連海平，海上明月共潮生。，。，")).looping  # tail of 4 < min_tail
    assert detect_loop(list("春江潮水連海平，海上明月共潮生。，。，"), min_tail=4).looping
    assert not detect_loop(list("abcab")).looping
    assert not detect_loop([]).looping


def test_min_repeats_and_min_tail_configurable():
    tokens = _aperiodic(4, 1) + _unit(6, 2) * 2 + _unit(6, 2)[:3]  # 2.5 repeats, 15 tokens
    assert detect_loop(tokens).looping
    assert not detect_loop(tokens, min_repeats=3).looping
    assert not detect_loop(tokens, min_tail=16).looping
    with pytest.raises(ValueError, match="min_repeats"):
        detect_loop(tokens, min_repeats=1)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=60), st.integers(1, 30))
def test_periodic_tail_length_is_periodic_and_maximal(tokens, p):
    m = periodic_tail_length(tokens, p)
    T = len(tokens)
    tail = tokens[T - m :]
    assert all(tail[i] == tail[i - p] for i in range(p, len(tail)))
    if m < T:  # cannot be extended by one token
        ext = tokens[T - m - 1 :]
        assert not all(ext[i] == ext[i - p] for i in range(p, len(ext)))


@given(st.lists(st.integers(0, 2), min_size=0, max_size=60))
def test_reported_loop_is_real_and_smallest(tokens):
    info = detect_loop(tokens)
    for p in range(1, (info.period or len(tokens) // 2 + 1)):
        t = periodic_tail_length(tokens, p)
        assert not (t >= 2 * p and t >= 8), f"smaller qualifying period {p} missed"
    if info.looping:
        tail = tokens[info.onset :]
        assert len(tail) >= 2 * info.period and len(tail) >= 8
        assert all(tail[i] == tail[i - info.period] for i in range(info.period, len(tail)))


def test_no_false_positive_on_validation_text(corpus, tokenizer):
    val = corpus.val
    n = 0
    for width in range(50, 65):
        for i in range(0, len(val) - width + 1, width):
            n += 1
            info = detect_loop(val[i : i + width])
            assert not info.looping, (width, i, val[i : i + width], info)
    ids = tokenizer.encode(val, warn=False)
    for i in range(0, len(ids) - 57 + 1, 57):
        n += 1
        assert not detect_loop(ids[i : i + 57]).looping, tokenizer.decode(ids[i : i + 57])
    assert n > 5000
