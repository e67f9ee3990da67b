"""The character n-gram judge: a proper distribution, no credit for repetition, human text cheaper than noise."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from genprobe.loops.compare_human import CharNgramJudge, fluency, ngram_judge, score_continuations

DOCS = [ln for ln in (Path(__file__).resolve().parents[2] / "docs" / "which-fix.md").read_text().splitlines() if ln]


@pytest.fixture(scope="module")
def judge() -> CharNgramJudge:
    return CharNgramJudge(DOCS, order=5)


def test_probabilities_over_the_alphabet_and_the_unseen_slot_sum_to_one(judge):
    for history in ("", "t", "the l", "zqxjk", "degenerate rate "):
        total = sum(judge.prob(history, c) for c in judge.alphabet) + judge.prob(history, "\uffff")
        assert total == pytest.approx(1.0, abs=1e-9)


def test_a_repeated_line_costs_the_same_every_time(judge):
    line = "the model loops on every prompt. "
    one, two, three = (judge.nll("Text: ", line * k) for k in (1, 2, 3))
    assert three - two == pytest.approx(two - one, rel=1e-12)  # the third copy is no cheaper than the second
    assert two - one > 0.5 * one  # and the second copy is not free either (a transformer judge would copy it)


def test_human_text_is_cheaper_than_the_same_characters_shuffled(judge):
    text = "The edit halves the degenerate rate on both models and the texts stop chanting one line."
    chars = list(text)
    random.Random(0).shuffle(chars)
    assert judge.nll("", text) < 0.7 * judge.nll("", "".join(chars))


def test_it_scores_like_a_model_judge_in_the_fluency_pooling(judge):
    scores = score_continuations(judge, ["A ", "B "], ["good text here", None])
    assert scores[1] is None and scores[0].chars == len("good text here") and not scores[0].truncated
    f = fluency(judge.source, scores)
    assert f.texts == 1 and f.nll_per_char == pytest.approx(scores[0].nll / scores[0].chars)
    assert "5-gram" in f.model


def test_bad_judges_are_refused(tmp_path):
    with pytest.raises(ValueError, match="order must be >= 1"):
        CharNgramJudge(DOCS, order=0)
    with pytest.raises(ValueError, match="at least 1,000 characters"):
        CharNgramJudge(["too short"])
    with pytest.raises(FileNotFoundError, match="ngram:english"):
        ngram_judge(f"ngram:{tmp_path / 'missing.txt'}")
    f = tmp_path / "human.txt"
    f.write_text("\n".join(DOCS), encoding="utf-8")
    assert ngram_judge(f"ngram:{f}").source.startswith(f"file:{f}")
