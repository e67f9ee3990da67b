"""Bits per character (genprobe.model.bpc): every target scored once with the intended context; the
char GPT's <unk> targets pay for naming the exact character.

Reference: the strided sliding-window evaluation of the transformers perplexity guide
(transformers docs/source/en/perplexity.md): windows of ``W`` advancing by ``S``, each scoring only the
targets the previous window did not, so every target after the first window sees >= ``W - S`` tokens.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from genprobe.corpus.tokenizer import CharTokenizer
from genprobe.model.bpc import char_gpt_bits_per_char, oov_unigram_cost, sliding_nll
from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT


def _position_model(x: torch.Tensor) -> torch.Tensor:
    """Vocabulary of 2, ids all 0: -log p(0) at window position p is log(1 + e^p), so the NLL reveals p."""
    B, T = x.shape
    pos = torch.arange(T, dtype=torch.float32)
    return torch.stack([torch.zeros(T), pos], dim=-1).expand(B, T, 2)


def _positions(nll: torch.Tensor) -> list[int]:
    return [round(math.log(math.expm1(v))) for v in nll.tolist()]


@pytest.mark.parametrize(
    "n, window, stride, want",
    [
        (10, 4, 2, [0, 1, 2, 1, 2, 1, 2, 1, 2]),  # worked by hand from the guide's scheme
        (10, 4, 1, [0, 1, 2, 2, 2, 2, 2, 2, 2]),
        (10, 4, 3, [0, 1, 2, 0, 1, 2, 0, 1, 2]),
        (4, 4, 2, [0, 1, 2]),  # exactly one window
        (5, 4, 2, [0, 1, 2, 1]),  # one target past it: a short last window from the next stride
        (3, 8, 4, [0, 1]),  # text shorter than the window
    ],
)
def test_each_target_scored_once_at_the_expected_position(n, window, stride, want):
    ids = torch.zeros(n, dtype=torch.long)
    nll = sliding_nll(_position_model, ids, window, stride, batch_size=2)
    assert not torch.isnan(nll).any() and len(nll) == n - 1
    assert _positions(nll) == want
    assert all(p + 1 >= window - stride for p in want[window - 1 :])  # context after the first window


def test_matches_full_context_loss_when_the_window_covers_the_text():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, n_layer=1, n_head=2, d_model=16, d_ff=32, block_size=32)).eval()
    ids = torch.randint(0, 20, (32,))
    with torch.no_grad():
        want = F.cross_entropy(model(ids[None, :-1])[0], ids[1:], reduction="none").double()
    got = sliding_nll(model, ids, window=32, stride=16)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_bad_window_values():
    ids = torch.zeros(10, dtype=torch.long)
    for w, s in ((1, None), (4, 4), (4, 0)):
        with pytest.raises(ValueError, match="window"):
            sliding_nll(_position_model, ids, w, s)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        sliding_nll(_position_model, ids[:1], 4, 2)


def test_oov_unigram_cost_by_hand():
    tok = CharTokenizer(["a"])
    cost = oov_unigram_cost(tok, "abbbc", {"a", "b", "c", "d"})
    # add-one counts over {b, c, d}: 4, 2, 1 of 7
    assert cost == pytest.approx({"b": -math.log(4 / 7), "c": -math.log(2 / 7), "d": -math.log(1 / 7)})


def test_char_gpt_unk_targets_pay_for_the_exact_character():
    tok = CharTokenizer(list("春風"))
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=16, d_ff=32, block_size=8))
    text = "雨春風春雪風雨春"  # 雨 and 雪 are <unk>; the first 雨 is context only, never a target
    cost = {"雨": 1.5, "雪": 4.0}
    r = char_gpt_bits_per_char(model, tok, text, cost, window=8, stride=4)
    nll = sliding_nll(model.eval(), torch.tensor(tok.encode(text, warn=False)), 8, 4)
    assert r.unk_targets == 2 and r.chars == 7 and r.tokens == 7
    assert r.bits_per_char_unk_as_symbol == pytest.approx(float(nll.sum()) / math.log(2) / 7)
    assert r.bits_per_char == pytest.approx((float(nll.sum()) + 1.5 + 4.0) / math.log(2) / 7)
    with pytest.raises(ValueError, match="no entry"):
        char_gpt_bits_per_char(model, tok, text, {"雨": 1.0})


def test_char_gpt_reference_scores_the_default_validation_text():
    """On the default corpus's validation text, with the 1,200-char vocabulary: ≈12% of targets are <unk>."""
    from genprobe.corpus.tang import load_corpus
    from genprobe.model.bpc import char_gpt_reference

    corpus = load_corpus()
    tok = CharTokenizer.from_text(corpus.text, 1200)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=16, d_ff=32, block_size=64))
    r = char_gpt_reference(model, tok)
    assert r.chars == len(corpus.val) - 1 and r.window == 64 and r.stride == 32
    assert 0.08 < r.unk_targets / r.chars < 0.2
    # an untrained model is near uniform over 1,202 ids; the exact figure adds the <unk> spelling cost
    assert r.bits_per_char_unk_as_symbol == pytest.approx(math.log2(1202), abs=0.3)
    assert r.bits_per_char > r.bits_per_char_unk_as_symbol + 1.0
