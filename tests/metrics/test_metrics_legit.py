"""Genre repetition rates (genprobe.metrics.legit) against hand-counted examples.

疊字 (a character written exactly twice in a row) must not be confused with stutter (runs of >= 3),
couplets pair line 2k with line 2k+1 (never line 2k+1 with 2k+2), a couplet whose lines are copies
(equal, or equal at more than half of the positions) is not parallelism, and pooled rates are
total events / total Han characters.
"""

import pytest

from genprobe.metrics.legit import (
    couplet_parallels,
    is_han,
    legit_counts,
    legit_rates,
    ngram_units,
    poem_lines,
    reduplications,
)


def test_is_han_covers_ideographs_only():
    assert all(is_han(c) for c in "青蕭㐀丽")  # unified, extension A, compatibility
    assert is_han(chr(0x20000))  # supplementary plane (extension B)
    assert not any(is_han(c) for c in "，。a1▯ ")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("青青河畔草，鬱鬱園中柳", (2, 0)),  # two 疊字
        ("蕭蕭", (1, 0)),
        ("肅肅肅肅嚴禋", (0, 1)),  # a run of four is one stutter run, not two reduplications
        ("青青青，蕭蕭", (1, 1)),  # run of three = stutter; the next pair is a 疊字
        ("青青，青", (1, 0)),  # punctuation ends the run
        ("君不見君不見", (0, 0)),  # a repeated word is not reduplication
        ("，，。。aa", (0, 0)),  # only Han characters count
        ("", (0, 0)),
    ],
)
def test_reduplication_versus_stutter(text, expected):
    assert reduplications(text) == expected


def test_poem_lines_keep_complete_lines_only():
    assert poem_lines("床前明月光，疑是地上霜。舉頭") == ["床前明月光", "疑是地上霜"]
    assert poem_lines("，，春眠不覺曉？處處聞啼鳥！") == ["春眠不覺曉", "處處聞啼鳥"]  # empty lines dropped


def test_couplet_parallels_hand_counted():
    # 一年一度秋 / 一日一回春: offsets 0 and 2 agree (一, 一) -> 2 parallels; 2 of 5 is not more than half
    assert couplet_parallels("一年一度秋，一日一回春。") == (2, 0, 1)
    # couplets are (line 0, line 1), (line 2, line 3): 丁戊己 / 丁戊庚 are lines 1 and 2 -> not a couplet
    assert couplet_parallels("甲乙丙，丁戊己。丁戊庚，") == (0, 0, 1)
    assert couplet_parallels("甲乙丙，丁戊己。丁戊庚，辛壬癸。") == (0, 0, 2)
    # identical lines and near-copies (3 of 4 positions) are copied couplets, not parallels
    assert couplet_parallels("君不見，君不見。") == (0, 1, 1)
    assert couplet_parallels("肅肅嚴禋，肅肅嚴祀。") == (0, 1, 1)
    # exactly half (2 of 4) is still parallelism
    assert couplet_parallels("山高水長，山低雲闊。") == (1, 0, 1)
    assert couplet_parallels("春風吹，") == (0, 0, 0)


def test_ngram_units_words_or_characters():
    assert ngram_units("the cat sat on the mat") == ["the", "cat", "sat", "on", "the", "mat"]
    assert ngram_units("床前 明月光，") == list("床前明月光，")  # Chinese: characters, spaces dropped
    assert ngram_units("ab 床") == ["ab", "床"]  # fewer than half Han: words
    c = legit_counts("the cat sat the cat sat", n=2)
    assert (c.ngrams, c.repeated_ngrams) == (5, 2)  # (the cat), (cat sat) repeat


def test_legit_counts_of_a_poem_and_its_continuation():
    c = legit_counts("青青河畔草，鬱鬱園中柳。", "鬱鬱園中柳。", n=2)
    assert (c.han, c.reduplicated, c.stutter, c.parallel, c.copied_couplets, c.couplets) == (10, 2, 0, 0, 0, 1)
    assert (c.ngrams, c.repeated_ngrams) == (5, 0)  # the continuation's bigrams: 鬱鬱 鬱園 園中 中柳 柳。


def test_legit_rates_pool_counts_and_bound_them():
    texts = ["青青河畔草，鬱鬱園中柳。", "一年一度秋，一日一回春。", "肅肅肅肅，肅肅肅肅。"]
    counts = [legit_counts(t) for t in texts]
    r = legit_rates(counts)
    han = 10 + 10 + 8
    assert r.han_chars == han and r.n_texts == 3
    assert r.reduplication_per100 == pytest.approx(100 * 2 / han)
    assert r.stutter_per100 == pytest.approx(100 * 2 / han)
    assert r.parallel_per100 == pytest.approx(100 * 2 / han)
    assert r.copied_couplet_share == pytest.approx(1 / 3)
    lo, hi = r.reduplication_ci95
    assert 0 <= lo <= r.reduplication_per100 <= hi
    empty = legit_rates([])
    assert empty.reduplication_per100 is None and empty.copied_couplet_share is None and empty.n_texts == 0
