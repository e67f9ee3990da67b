"""CLI: ``genprobe train --json``, the export-hf / import-hf round trip, and readable errors (exit 2)."""

from __future__ import annotations

import json

import pytest
import torch

from genprobe.cli import main
from genprobe.corpus.tokenizer import CharTokenizer
from genprobe.model.checkpoint import load_checkpoint, save_checkpoint
from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT

REQUIRED = ("parameters", "train_loss", "val_loss", "unigram_ce", "coverage", "unk_share", "seconds")


def _json_out(capsys) -> dict:
    out = capsys.readouterr().out
    return json.loads(out)


def test_train_json_summary(tmp_path, capsys):
    out = tmp_path / "ck"
    rc = main(
        ["train", "--steps", "5", "--batch-size", "4", "--poems", "200", "--vocab", "300", "--out", str(out), "--json"]
    )
    assert rc == 0
    s = _json_out(capsys)
    for k in REQUIRED:
        assert isinstance(s[k], (int, float)), k
    assert s["corpus"]["documents"] == 200
    assert s["train_config"]["steps"] == 5 and s["train_config"]["batch_size"] == 4
    model, tok, meta = load_checkpoint(out)
    assert tok.vocab_size == 302 and meta["summary"]["val_loss"] == s["val_loss"]
    assert s["parameters"] == model.num_parameters()


def test_train_human_output_rope_and_grad_tracking(tmp_path, capsys):
    rc = main(
        [
            "train",
            "--steps",
            "3",
            "--batch-size",
            "2",
            "--poems",
            "100",
            "--vocab",
            "100",
            "--pe",
            "rope",
            "--track-grads",
            "--out",
            str(tmp_path / "ck"),
        ]
    )
    assert rc == 0
    cap = capsys.readouterr()
    assert cap.out == ""  # without --json, stdout stays empty
    assert "unigram CE" in cap.err and "coverage" in cap.err
    assert load_checkpoint(tmp_path / "ck")[0].cfg.pos_encoding == "rope"
    rows = json.loads((tmp_path / "ck" / "qkv_grad_norms.json").read_text(encoding="utf-8"))["rows"]
    assert sorted({r["step"] for r in rows}) == [0, 1, 2]
    assert (tmp_path / "ck" / "qkv_grad_norms.png").stat().st_size > 0


def _tiny_ckpt(path, pe="learned"):
    tok = CharTokenizer.from_text("春眠不覺曉處處聞啼鳥夜來風雨聲花落知多少", 30)
    torch.manual_seed(0)
    m = GPT(
        GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=16, d_ff=32, block_size=16, pos_encoding=pe)
    )
    save_checkpoint(path, m, tok)
    return m, tok


def test_export_import_round_trip(tmp_path, capsys):
    m, tok = _tiny_ckpt(tmp_path / "ck")
    assert main(["export-hf", str(tmp_path / "ck"), str(tmp_path / "hf"), "--json"]) == 0
    res = _json_out(capsys)
    assert "model.safetensors" in res["files"] and "config.json" in res["files"]
    assert main(["import-hf", str(tmp_path / "hf"), str(tmp_path / "ck2"), "--json"]) == 0
    res2 = _json_out(capsys)
    assert res2["parameters"] == m.num_parameters()
    m2, tok2, _ = load_checkpoint(tmp_path / "ck2", expect_tokenizer=tok)
    sa, sb = m.state_dict(), m2.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["export-hf", "{tmp}/missing", "{tmp}/hf"], "genprobe export-hf: error: checkpoint directory does not exist"),
        (["export-hf", "{tmp}/rope", "{tmp}/hf"], "pos_encoding='learned'"),
        (["import-hf", "{tmp}/missing", "{tmp}/ck"], "genprobe import-hf: error: no such model directory"),
        (["train", "--steps", "0", "--out", "{tmp}/t"], "genprobe train: error: steps and batch_size must be >= 1"),
        (["train", "--corpus", "{tmp}/none.txt", "--out", "{tmp}/t"], "corpus file not found"),
        (["train", "--steps", "1", "--out", "{tmp}/busy"], "not a genprobe checkpoint; refusing"),
    ],
)
def test_errors_exit_2_with_a_readable_message(tmp_path, capsys, argv, message):
    _tiny_ckpt(tmp_path / "rope", pe="rope")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "thesis.tex").write_text("precious", encoding="utf-8")
    rc = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    cap = capsys.readouterr()
    assert rc == 2
    assert message in cap.err
    assert "Traceback" not in cap.err
    assert (tmp_path / "busy" / "thesis.tex").read_text(encoding="utf-8") == "precious"


# ---- --arch llama / qwen2: the subword reference model ------------------------------------------------

SUBWORD_REQUIRED = (
    "parameters",
    "train_loss",
    "val_loss",
    "val_bits_per_char",
    "heldout_loss",
    "chars_per_token",
    "seconds",
    "cpu_seconds",
    "initial_loss",
)


@pytest.mark.slow
def test_train_subword_quick_json_and_loadable_directory(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "sub"
    rc = main(["train", "--arch", "llama", "--quick", "--steps", "4", "--poems", "1200", "--out", str(out), "--json"])
    assert rc == 0
    cap = capsys.readouterr()
    s = json.loads(cap.out)
    for k in SUBWORD_REQUIRED:
        assert isinstance(s[k], (int, float)), k
    assert "bits/char" in cap.err and "held out" in cap.err
    assert s["train_config"]["steps"] == 4 and s["model_config"]["arch"] == "llama"
    assert s["split"]["subword_train"] == [[0, 1200]] and s["split"]["heldout"] == [4003, 57607]
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert model.config.model_type == "llama" and tok.decode(tok.encode("春眠不覺曉。")) == "春眠不覺曉。"
    assert sum(p.numel() for p in model.parameters()) == s["parameters"]


def test_gpt_quick_recipe(tmp_path, capsys):
    rc = main(
        [
            "train",
            "--quick",
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--poems",
            "100",
            "--vocab",
            "100",
            "--out",
            str(tmp_path / "ck"),
            "--json",
        ]
    )
    assert rc == 0
    s = json.loads(capsys.readouterr().out)
    assert s["train_config"]["steps"] == 2 and s["train_config"]["dropout"] == 0.0  # the quick recipe's dropout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--arch", "llama", "--vocab", "256"], "--vocab must be in [257, 65536]"),
        (["--arch", "llama", "--poems", "0"], "--poems must be in [1, 57606]"),
        (["--arch", "qwen2", "--poems", "57607"], "--poems must be in [1, 57606]"),
        (["--arch", "llama", "--pe", "rope"], "--pe is for --arch gpt only, not --arch llama"),
        (["--arch", "llama", "--dropout", "0.1", "--pack"], "--dropout, --pack are for --arch gpt only"),
        (["--arch", "llama", "--corpus", "x.jsonl"], "--corpus is for --arch gpt only"),
        (["--kv-heads", "2"], "--kv-heads is for --arch llama/qwen2 only, not --arch gpt"),
        (["--arch", "llama", "--d-model", "96", "--heads", "6", "--kv-heads", "4"], "must be a multiple of n_kv_head"),
        (["--arch", "llama", "--block-size", "4"], "block_size must be >= 8"),
        (["--arch", "llama", "--steps", "0"], "steps and batch_size must be >= 1"),
        (["--arch", "llama", "--lr", "0"], "lr must be > 0"),
        (["--arch", "llama", "--out", "{tmp}/busy"], "not a genprobe-trained model; refusing"),
    ],
)
def test_subword_bad_flags_exit_2_naming_the_limit(tmp_path, capsys, argv, message):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "thesis.tex").write_text("precious", encoding="utf-8")
    if "--out" not in argv:
        argv = argv + ["--out", str(tmp_path / "t")]
    rc = main(["train", "--quick"] + [a.replace("{tmp}", str(tmp_path)) for a in argv])
    cap = capsys.readouterr()
    assert rc == 2, cap.err
    assert message in cap.err
    assert "Traceback" not in cap.err
    assert not (tmp_path / "t").exists()
    assert (tmp_path / "busy" / "thesis.tex").read_text(encoding="utf-8") == "precious"
