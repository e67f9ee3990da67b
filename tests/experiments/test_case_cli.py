"""``genprobe case`` argument handling and model reuse (the end-to-end run is in test_case_findings.py)."""

from __future__ import annotations

import json

from genprobe.cli import main


def test_case_rejects_unknown_experiment(tmp_path, capsys):
    assert main(["case", "--out", str(tmp_path), "--only", "nonsense"]) == 2
    assert "unknown experiment" in capsys.readouterr().err


def test_case_missing_checkpoint(tmp_path, capsys):
    assert main(["case", "--out", str(tmp_path / "o"), "--ckpt", str(tmp_path / "nope")]) == 2
    assert "not found" in capsys.readouterr().err


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
