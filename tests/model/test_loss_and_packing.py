"""Masked loss (seed Eq. 3.4) and packed rows with a block-diagonal causal mask (seed Eq. 3.16)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT, masked_cross_entropy, packed_positions


def _padded_batch(seed: int = 0, B: int = 4, T: int = 20, V: int = 11, pad_share: float = 0.6):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g) * 3
    targets = torch.randint(0, V, (B, T), generator=g)
    n_real = round(B * T * (1 - pad_share))
    flat = torch.zeros(B * T, dtype=torch.bool)
    flat[torch.randperm(B * T, generator=g)[:n_real]] = True
    return logits, targets, flat.view(B, T)


def test_masked_loss_ignores_padding_and_counts_real_positions_only():
    logits, targets, mask = _padded_batch()
    assert int(mask.sum()) == 32 and mask.numel() == 80  # 60% of positions are padding
    loss = masked_cross_entropy(logits, targets, mask)

    # Hand computation: Σ over real positions of -log softmax(target) / number of real positions.
    total, count = 0.0, 0
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            if mask[b, t]:
                row = logits[b, t].double()
                total += -(row[targets[b, t]] - math.log(float(row.exp().sum())))
                count += 1
    assert count == int(mask.sum())
    assert abs(float(loss) - total / count) < 1e-5
    # Dividing by all positions (the classic bug) gives a clearly different number.
    wrong = total / mask.numel()
    assert abs(float(loss) - wrong) > 0.5

    # Changing whatever sits at padded positions — targets and logits — changes nothing.
    g = torch.Generator().manual_seed(99)
    logits2 = torch.where(mask[..., None], logits, torch.randn(logits.shape, generator=g) * 50)
    targets2 = torch.where(mask, targets, torch.randint(0, logits.shape[-1], targets.shape, generator=g))
    assert torch.equal(masked_cross_entropy(logits2, targets2, mask), loss)


def test_masked_loss_gradient_is_zero_at_padding():
    logits, targets, mask = _padded_batch(seed=1)
    logits.requires_grad_(True)
    masked_cross_entropy(logits, targets, mask).backward()
    assert torch.all(logits.grad[~mask] == 0)
    assert torch.any(logits.grad[mask] != 0)


def test_all_masked_raises():
    logits, targets, mask = _padded_batch()
    with pytest.raises(ValueError, match="no position"):
        masked_cross_entropy(logits, targets, torch.zeros_like(mask))


def test_packed_positions_restart_at_each_document():
    doc = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2], [5, 5, 5, 5, 5, 5, 7, 7, 7]])
    want = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 0, 1, 2]])
    assert torch.equal(packed_positions(doc), want)


def _model(pe: str = "learned") -> GPT:
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=50, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=32, pos_encoding=pe))
    with torch.no_grad():  # larger weights than the init so attention leaks would be visible
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.3)
    return m.eval()


def _pack(docs: list[torch.Tensor], T: int):
    ids = torch.zeros(1, T, dtype=torch.long)
    doc = torch.full((1, T), len(docs), dtype=torch.long)  # the padding tail is its own "document"
    t = 0
    spans = []
    for i, d in enumerate(docs):
        ids[0, t : t + len(d)] = d
        doc[0, t : t + len(d)] = i
        spans.append((t, t + len(d)))
        t += len(d)
    return ids, doc, spans


@pytest.mark.parametrize("pe", ["learned", "rope", "alibi", "none"])
@torch.no_grad()
def test_packed_document_logits_equal_document_alone(pe):
    m = _model(pe)
    g = torch.Generator().manual_seed(1)
    docs = [torch.randint(2, 50, (n,), generator=g) for n in (7, 12, 9)]
    ids, doc, spans = _pack(docs, 32)
    packed = m(ids, positions=packed_positions(doc), document_ids=doc)
    for d, (a, b) in zip(docs, spans, strict=True):
        alone = m(d[None])
        assert (packed[0, a:b] - alone[0]).abs().max() < 1e-5
    # Without the block-diagonal mask, later documents attend to earlier ones: their logits change.
    leaky = m(ids, positions=packed_positions(doc))
    for d, (a, b) in list(zip(docs, spans, strict=True))[1:]:
        assert (leaky[0, a:b] - m(d[None])[0]).abs().max() > 1e-2


@settings(max_examples=8, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 10), min_size=1, max_size=3), seed=st.integers(0, 2**16)
)  # ≤ 30 tokens: one row of block_size 32
@torch.no_grad()
def test_packing_property_any_document_lengths(lengths, seed):
    m = _MODEL
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(2, 50, (n,), generator=g) for n in lengths]
    ids, doc, spans = _pack(docs, 32)
    packed = m(ids, positions=packed_positions(doc), document_ids=doc)
    for d, (a, b) in zip(docs, spans, strict=True):
        assert (packed[0, a:b] - m(d[None])[0]).abs().max() < 1e-5


_MODEL = _model()
