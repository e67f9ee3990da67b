"""Trainer: seeded runs are bit-identical on CPU; the learning-rate schedule has the seed's shape."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch

from genprobe.corpus.tang import load_corpus
from genprobe.corpus.tokenizer import CharTokenizer
from genprobe.model.config import GPTConfig
from genprobe.model.train import TrainConfig, lr_at, train, unigram_cross_entropy


@pytest.fixture(scope="module")
def small():
    corpus = load_corpus(poems=120)
    tok = CharTokenizer.from_text(corpus.text, 150)
    cfg = GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=32, d_ff=64, block_size=32)
    return corpus, tok, cfg


def _run(small, seed: int, pack: bool = False, steps: int = 20):
    corpus, tok, cfg = small
    tc = TrainConfig(steps=steps, batch_size=8, seed=seed, warmup=5, eval_every=0, pack=pack)
    return train(corpus, tok, cfg=cfg, tc=tc, progress=False)


def _equal(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def run0(small):
    return _run(small, 0)


def test_same_seed_gives_identical_weights(small, run0):
    again = _run(small, 0)
    assert _equal(run0.model, again.model)
    assert run0.summary["train_loss"] == again.summary["train_loss"]
    assert not _equal(run0.model, _run(small, 1).model)  # the seed actually matters


def test_packed_training_is_deterministic_too(small):
    assert _equal(_run(small, 0, pack=True, steps=8).model, _run(small, 0, pack=True, steps=8).model)


def test_summary_reports_baseline_and_coverage(run0):
    s = run0.summary
    for k in ("parameters", "train_loss", "val_loss", "unigram_ce", "coverage", "unk_share", "seconds", "history"):
        assert k in s
    assert abs(s["coverage"] + s["unk_share"] - 1) < 1e-3
    assert s["history"][-1]["step"] == 20


def test_on_backward_sees_gradients_every_step(small):
    corpus, tok, cfg = small
    seen = []

    def hook(step, model):
        g = model.h[0].attn.c_attn.weight.grad
        seen.append((step, g is not None and float(g.norm()) > 0))

    train(corpus, tok, cfg=cfg, tc=TrainConfig(steps=4, batch_size=4, eval_every=0), progress=False, on_backward=hook)
    assert seen == [(0, True), (1, True), (2, True), (3, True)]


def test_lr_schedule_shape():
    tc = TrainConfig()  # seed: lr 3e-3, warmup 100, cosine over 2,000 steps
    lrs = [lr_at(s, tc) for s in range(tc.steps)]
    assert lrs[0] == pytest.approx(tc.lr / tc.warmup)
    assert all(b > a for a, b in pairwise(lrs[: tc.warmup]))  # linear warmup
    assert lrs[tc.warmup - 1] == pytest.approx(tc.lr) and max(lrs) == pytest.approx(tc.lr)
    assert all(b <= a for a, b in pairwise(lrs[tc.warmup :]))  # then never increases
    mid = tc.warmup + (tc.steps - tc.warmup) // 2
    assert lrs[mid] == pytest.approx(tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) / 2), rel=1e-3)  # cosine midpoint
    assert lr_at(tc.steps, tc) == pytest.approx(tc.lr * tc.min_lr_ratio)
    assert lrs[-1] == pytest.approx(tc.lr * tc.min_lr_ratio, rel=1e-3)


def test_bad_train_config_is_refused():
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="lr"):
        TrainConfig(lr=0)


def test_unigram_cross_entropy_matches_hand_computation():
    train_ids = torch.tensor([2, 2, 2, 3])
    val_ids = torch.tensor([2, 3])
    # add-one counts over V=4: [1, 1, 4, 2] / 8
    want = -(torch.tensor(4 / 8).log() + torch.tensor(2 / 8).log()) / 2
    assert unigram_cross_entropy(train_ids, val_ids, 4) == pytest.approx(float(want))
