"""``genprobe case`` argument handling and model reuse (the end-to-end run is in test_case_findings.py)."""

from __future__ import annotations

import json

from genprobe.cli import main


def test_case_rejects_unknown_experiment(tmp_path, capsys):
    assert main(["case", "--out", str(tmp_path), "--only", "nonsense"]) == 2
    assert "unknown experiment" in capsys.readouterr().err


def test_case_missing_checkpoint(tmp_path, capsys):
    assert main(["case", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "no such model directory" in capsys.readouterr().err


def test_case_refuses_a_transformers_model(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    d = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)).save_pretrained(d)
    assert main(["case", str(d), "--out", str(tmp_path / "o"), "--only", "sampling"]) == 2
    assert "genprobe case takes a genprobe checkpoint; " in capsys.readouterr().err


def test_case_model_positional(trained_ckpt, tmp_path):
    """MODEL first: the case study runs on that checkpoint."""
    assert (
        main(
            ["case", str(trained_ckpt), "--quick", "--out", str(tmp_path / "a"), "--only", "sampling", "--no-progress"]
        )
        == 0
    )
    a = json.loads((tmp_path / "a" / "ch3_case.json").read_text(encoding="utf-8"))
    assert a["sampling"] and a["meta"]["checkpoint"] == str(trained_ckpt)


def test_case_reuses_model_in_out_dir(trained_ckpt, tmp_path, capsys):
    import shutil

    out = tmp_path / "case"
    shutil.copytree(trained_ckpt, out / "model")  # a quick-recipe checkpoint already in OUT/model
    rc = main(["case", "--quick", "--out", str(out), "--only", "sampling", "--no-progress"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "reusing the model already trained" in err and "training the default model" not in err
    case = json.loads((out / "ch3_case.json").read_text(encoding="utf-8"))
    assert set(case) == {"meta", "model", "sampling"} and case["meta"]["checkpoint"] == str(out / "model")
