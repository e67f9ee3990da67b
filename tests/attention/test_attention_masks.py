"""The mask validator catches each planted fault and stays silent on valid left/right-padded batches."""

import json

import pytest
import torch

from genprobe.attention.masks import check_masks, load_batch_jsonl

PAD = 0
LEFT_IDS = [[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]]
LEFT_MASK = [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
LEFT_POS = [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
RIGHT_IDS = [[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]]
RIGHT_MASK = [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]


def rules(findings):
    return {f.rule for f in findings}


def test_valid_left_padded_batch_has_no_findings():
    assert check_masks(LEFT_IDS, LEFT_MASK, LEFT_POS, pad_token_id=PAD) == []
    assert check_masks(torch.tensor(LEFT_IDS), torch.tensor(LEFT_MASK), torch.tensor(LEFT_POS), PAD) == []


def test_valid_right_padded_batch_has_no_findings():
    assert check_masks(RIGHT_IDS, RIGHT_MASK, [[0, 1, 2, 3, 4]] * 2, pad_token_id=PAD) == []
    assert check_masks(RIGHT_IDS, RIGHT_MASK) == []


def test_length_mismatch():
    f = check_masks(LEFT_IDS, [[0, 1, 1, 1], LEFT_MASK[1]], pad_token_id=PAD)
    assert [x.rule for x in f] == ["length_mismatch"] and f[0].row == 0


def test_non_binary_values():
    f = check_masks(LEFT_IDS, [[0, 0, 1, 2, 1], LEFT_MASK[1]], pad_token_id=PAD)
    assert [(x.rule, x.row, x.position) for x in f] == [("non_binary", 0, 3)]
    f = check_masks(LEFT_IDS, [[0, 0, 0.5, 1, 1], LEFT_MASK[1]])
    assert rules(f) == {"non_binary"}


def test_inverted_mask():
    inverted = [[1, 1, 0, 0, 0], LEFT_MASK[1]]
    f = check_masks(LEFT_IDS, inverted, pad_token_id=PAD)
    assert [(x.rule, x.row) for x in f] == [("inverted_mask", 0)]
    # Without a pad id the heuristic (unmasked = one repeated id, masked = varied) still catches it.
    assert "inverted_mask" in rules(check_masks(LEFT_IDS, inverted))


def test_unmasked_pad_positions():
    f = check_masks(LEFT_IDS, [[0, 1, 1, 1, 1], LEFT_MASK[1]], pad_token_id=PAD)
    assert [(x.rule, x.row, x.position) for x in f] == [("pad_unmasked", 0, 1)]


def test_fully_masked_row():
    f = check_masks(LEFT_IDS, [[0, 0, 0, 0, 0], LEFT_MASK[1]], pad_token_id=PAD)
    assert [(x.rule, x.row) for x in f] == [("empty_row", 0)]


def test_positions_not_restarting_after_left_padding():
    f = check_masks(LEFT_IDS, LEFT_MASK, [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]], pad_token_id=PAD)
    assert [(x.rule, x.row, x.position) for x in f] == [("positions_not_restarting", 0, 2)]


def test_mixed_padding_side_and_holes():
    f = check_masks(
        [LEFT_IDS[0], RIGHT_IDS[0], RIGHT_IDS[0]], [LEFT_MASK[0], RIGHT_MASK[0], RIGHT_MASK[0]], pad_token_id=PAD
    )
    assert [(x.rule, x.row) for x in f] == [("mixed_padding_side", 0)]
    f = check_masks([[5, 0, 7, 8]], [[1, 0, 1, 1]], pad_token_id=PAD)
    assert [(x.rule, x.position) for x in f] == [("mask_hole", 1)]


def test_padding_on_both_ends_is_a_finding_not_a_crash():
    """Used to raise StopIteration: no zero lies between the real tokens, the padding sits on both sides."""
    f = check_masks([[0, 5, 6, 0, 0]], [[0, 1, 1, 0, 0]], pad_token_id=PAD)
    assert [(x.rule, x.row, x.position) for x in f] == [("mask_hole", 0, 3)]
    f = check_masks([[0, 5, 0, 6, 0]], [[0, 1, 0, 1, 0]], pad_token_id=PAD)  # both: the hole inside is named
    assert [(x.rule, x.position) for x in f] == [("mask_hole", 2)]


def test_ragged_batch():
    f = check_masks([[1, 2, 3], [1, 2, 3], [1, 2]], [[1, 1, 1], [1, 1, 1], [1, 1]])
    assert [(x.rule, x.row) for x in f] == [("ragged_batch", 2)]


def test_load_batch_jsonl_both_layouts(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps({"input_ids": i, "attention_mask": m, "position_ids": p})
            for i, m, p in zip(LEFT_IDS, LEFT_MASK, LEFT_POS, strict=True)
        )
        + "\n"
    )
    b = load_batch_jsonl(rows)
    assert b["input_ids"] == LEFT_IDS and b["position_ids"] == LEFT_POS
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"input_ids": RIGHT_IDS, "attention_mask": RIGHT_MASK, "pad_token_id": 0}, indent=1))
    b = load_batch_jsonl(one)
    assert b["attention_mask"] == RIGHT_MASK and b["pad_token_id"] == 0 and b["position_ids"] is None
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1]}\n')
    with pytest.raises(ValueError, match="attention_mask"):
        load_batch_jsonl(bad)
