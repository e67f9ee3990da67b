"""CLI: `genprobe attention heads | check-masks | padding-leak`."""

import json

import pytest
import torch

from genprobe.cli import main


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory, tokenizer):
    from genprobe.model.checkpoint import save_checkpoint
    from genprobe.model.config import GPTConfig
    from genprobe.model.gpt import GPT

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=32))
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", model.eval(), tokenizer)


def test_attention_table_and_files(tiny_ckpt, tmp_path, capsys):
    assert (
        main(
            [
                "attention",
                "heads",
                str(tiny_ckpt),
                "--prompt",
                "白日依山盡黃河入海流",
                "--out",
                str(tmp_path),
                "--distance",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "H/lnN" in out and "mean" in out
    rep = json.loads((tmp_path / "attention.json").read_text())
    assert rep["distance"] == 4 and len(rep["heads"]) == 4 and rep["seq_len"] == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention.json", "entropy.png", "heads.png"]


def test_attention_per_head_maps_only_where_asked(tiny_ckpt, tmp_path, capsys):
    args = ["attention", "heads", str(tiny_ckpt), "--prompt", "白日依山盡"]
    assert main([*args, "--out", str(tmp_path / "one"), "--maps", "1"]) == 0
    assert sorted(p.name for p in (tmp_path / "one").glob("attn_*.png")) == ["attn_L1_H0.png", "attn_L1_H1.png"]
    assert main([*args, "--out", str(tmp_path / "all"), "--maps"]) == 0
    assert len(list((tmp_path / "all").glob("attn_*.png"))) == 4
    capsys.readouterr()
    assert main([*args, "--maps", "1"]) == 2
    assert "--out" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "bad"), "--maps", "2"]) == 2
    assert "layers 0..1" in capsys.readouterr().err


def test_attention_text_table_long_or_grid(tiny_ckpt, capsys):
    args = ["attention", "heads", str(tiny_ckpt), "--prompt", "白日依山盡"]
    assert main(args) == 0  # 4 heads: one line per head
    out = capsys.readouterr().out
    assert "H/lnN" in out and "rows: layers" not in out
    assert main([*args, "--table", "grid"]) == 0
    out = capsys.readouterr().out
    assert "rows: layers, columns: heads" in out and "H/lnN" not in out


def test_check_masks_exit_codes(tmp_path, capsys):
    good = tmp_path / "good.jsonl"
    good.write_text(
        '{"input_ids": [0, 5, 6], "attention_mask": [0, 1, 1], "position_ids": [0, 0, 1], '
        '"pad_token_id": 0}\n'
        '{"input_ids": [7, 8, 9], "attention_mask": [1, 1, 1], "position_ids": [0, 1, 2]}\n'
    )
    assert main(["attention", "check-masks", str(good)]) == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"input_ids": [0, 5, 6], "attention_mask": [0, 1, 1], "position_ids": [0, 1, 2]}\n'
        '{"input_ids": [7, 8, 9], "attention_mask": [1, 1, 1], "position_ids": [0, 1, 2]}\n'
    )
    capsys.readouterr()
    assert main(["attention", "check-masks", str(bad), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert [f["rule"] for f in rep["findings"]] == ["positions_not_restarting"]
    assert main(["attention", "check-masks", str(tmp_path / "missing.jsonl")]) == 2


def test_padding_leak_cli(tiny_ckpt, capsys):
    assert main(["attention", "padding-leak", str(tiny_ckpt), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["verdict"] == "ok" and rep["max_delta"] < 1e-4 and len(rep["sequences"]) == 3
    assert (
        main(["attention", "padding-leak", str(tiny_ckpt), "--prompt", "白日依山盡", "春眠不覺曉處處", "--json"]) == 0
    )
    rep = json.loads(capsys.readouterr().out)
    assert [s["length"] for s in rep["sequences"]] == [5, 7]


def test_attention_needs_a_sub_command_or_a_model(capsys):
    assert main(["attention"]) == 2
    err = capsys.readouterr().err
    assert "heads MODEL" in err and "checkpoint" in err and "deprecated" not in err
    assert main(["attention", "heads"]) == 2
    assert "give MODEL" in capsys.readouterr().err


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=50,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        n_inner=64,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    d = tmp_path_factory.mktemp("hf") / "gpt2-tiny"
    GPT2LMHeadModel(cfg).save_pretrained(d, safe_serialization=True)
    return d


def test_hf_attention_and_leak_cli(hf_dir, capsys):
    assert main(["attention", "heads", str(hf_dir), "--ids", "5", "6", "7", "8", "9", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["n_layer"] == 2 and rep["seq_len"] == 5 and rep["implementation"] == "eager"
    # The textbook leak: GPT-2 with left padding and no position_ids.
    assert (
        main(
            ["attention", "padding-leak", str(hf_dir), "--ids", "5", "6", "7", "8", "9", "--no-position-ids", "--json"]
        )
        == 1
    )
    assert json.loads(capsys.readouterr().out)["verdict"] == "LEAK"
    assert main(["attention", "padding-leak", str(hf_dir), "--ids", "5", "6", "7", "8", "9", "--json"]) == 0
    # text without a tokenizer: a clear error, exit 2
    assert main(["attention", "heads", str(hf_dir), "--prompt", "hello"]) == 2
    assert "--ids" in capsys.readouterr().err
