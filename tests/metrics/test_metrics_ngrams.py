"""distinct-n, seq-rep-n, longest repeated n-gram, <unk> share and the Wilson interval."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from genprobe.metrics.degeneracy import degeneracy_metrics
from genprobe.metrics.ngrams import distinct_n, longest_repeated_ngram, seq_rep_n, unk_share
from genprobe.metrics.stats import wilson_interval


def test_distinct_n_values():
    assert distinct_n("春江潮水連海平", 2) == 1.0
    # "abab": bigrams ab, ba, ab -> 2 unique / 3
    assert distinct_n("abab", 2) == pytest.approx(2 / 3)
    assert distinct_n([5, 5, 5, 5], 1) == 0.25
    # the chapter's walk-through: 9 distinct bigrams then alternating U。/。， ... check a constructed case
    text = "春江潮水海平U。，U。，U。，"
    grams = [text[i : i + 2] for i in range(len(text) - 1)]
    assert distinct_n(text, 2) == len(set(grams)) / len(grams)


def test_empty_conventions():
    assert distinct_n("a", 2) == 0.0
    assert seq_rep_n("", 4) == 0.0
    assert unk_share([]) == 0.0
    assert longest_repeated_ngram("ab") == (0, ())
    with pytest.raises(ValueError, match="n-gram order"):
        distinct_n("abc", 0)


def test_seq_rep():
    # 4-grams of "abcabcabc": abca bcab cabc abca bcab cabc -> 3 repeat an earlier one of 6
    assert seq_rep_n("abcabcabc", 4) == 0.5


@given(st.lists(st.integers(0, 4), min_size=4, max_size=40), st.integers(1, 4))
def test_seq_rep_is_one_minus_distinct(tokens, n):
    assert math.isclose(seq_rep_n(tokens, n), 1 - distinct_n(tokens, n))


def test_longest_repeated_ngram_overlapping():
    assert longest_repeated_ngram("abcXabcYabcZ") == (3, tuple("abc"))
    # overlapping occurrences count: "aaaaa" has "aaa" at 0,1,2
    assert longest_repeated_ngram("aaaaa") == (3, tuple("aaa"))
    assert longest_repeated_ngram("ab" * 20) == (36, tuple("ab" * 18))  # T - 2p for a period-p loop
    assert longest_repeated_ngram("abcXabcY") == (0, ())
    # two occurrences are not enough at min_count=3
    assert longest_repeated_ngram("abcdXabcd")[0] == 0
    assert longest_repeated_ngram("abcdXabcd", min_count=2) == (4, tuple("abcd"))


def test_unk_share():
    assert unk_share([1, 2, 1, 3]) == 0.5
    assert unk_share([7, 7, 2], unk_id=7) == pytest.approx(2 / 3)


def test_degeneracy_metrics_keys_and_loop():
    d = degeneracy_metrics([10, 11, 12] + [20, 21] * 10)
    assert d["looping"] and d["loop_period"] == 2 and d["loop_onset"] == 3
    assert set(d) >= {"distinct_1", "distinct_2", "distinct_3", "longest_repeat", "unk_share", "seq_rep_4"}
    assert d["distinct_2"] < 0.3


def test_wilson():
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
