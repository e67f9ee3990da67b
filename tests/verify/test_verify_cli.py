"""``genprobe verify-cache`` end to end: targets, user implementations, mutants, exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from genprobe.cli import main
from genprobe.corpus import CharTokenizer
from genprobe.model.checkpoint import save_checkpoint

HERE = Path(__file__).resolve().parent
# 48 distinct characters: the seed's prompt first, then consecutive CJK code points
CHARS = "".join(dict.fromkeys("春江潮水连海平" + "".join(chr(0x4E00 + i) for i in range(60))))


@pytest.fixture
def tiny_ckpt(tmp_path, sharp_model) -> Path:
    tok = CharTokenizer(list(CHARS[: sharp_model.cfg.vocab_size - 2]))
    return save_checkpoint(tmp_path / "ckpt", sharp_model, tok, {})


@pytest.fixture
def user_impls(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))
    return "user_impls"


def run_cli(capsys, *argv):
    rc = main(["verify-cache", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_checkpoint_with_mutants_prints_table_and_exits_0(capsys, tiny_ckpt):
    rc, out, err = run_cli(capsys, str(tiny_ckpt), "--mutants", "--steps", "8", "--prompt", "春江潮水连海平")
    assert rc == 0, err
    for name in ("engine", "pos_zero", "no_cat", "no_mask", "kv_mismatch", "cat_order", "mask no-op"):
        assert name in out
    assert "✗" not in out


def test_json_output(capsys, tiny_ckpt):
    rc, out, _ = run_cli(capsys, str(tiny_ckpt), "--steps", "5", "--chunk-sizes", "2", "--json")
    d = json.loads(out)
    assert rc == 0 and d["exit_status"] == 0 and d["failing"] == []
    (impl,) = d["implementations"]
    assert impl["verdict"] == "pass" and impl["prefill_bit_identical"]
    assert set(impl["max_abs_dlogit_by_phase"]) == {"prefill", "incremental", "chunk_2", "padded_batch"}


def test_impl_correct_passes_broken_fails(capsys, tiny_ckpt, user_impls):
    rc, out, err = run_cli(capsys, "--impl", f"{user_impls}:correct", "--model", str(tiny_ckpt), "--steps", "6")
    assert rc == 0, out + err
    assert "user_impls:correct" in out and "pass" in out
    rc, out, err = run_cli(capsys, "--impl", f"{user_impls}:broken", "--model", str(tiny_ckpt), "--steps", "6", "--json")
    assert rc == 1
    d = json.loads(out)
    assert d["implementations"][0]["verdict"] == "bug" and d["failing"] == [f"{user_impls}:broken"]
    assert "FAIL" in err


def test_impl_without_model_uses_its_own_reference(capsys, user_impls):
    rc, out, err = run_cli(capsys, "--impl", f"{user_impls}:standalone", "--steps", "4", "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["implementations"][0]["verdict"] == "pass" and len(d["prompts"]) == 3


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("user_impls", "package.module:factory"),
        ("no_such_module_xyz:f", "cannot import"),
        ("user_impls:missing", "no attribute"),
        ("user_impls:NOT_CALLABLE", "not callable"),
        ("user_impls:not_an_impl", "lacks reset, prefill, step"),
        ("user_impls:correct", "needs a model"),
    ],
)
def test_bad_impl_specs_exit_2(capsys, user_impls, spec, msg):
    rc, _, err = run_cli(capsys, "--impl", spec, "--steps", "2")
    assert rc == 2 and msg in err, err


def test_thresholds_and_fail_on_drive_the_exit_status(capsys, tiny_ckpt, user_impls):
    base = ["--impl", f"{user_impls}:broken", "--model", str(tiny_ckpt), "--steps", "3"]
    assert run_cli(capsys, *base)[0] == 1
    assert run_cli(capsys, *base, "--bug", "1e6")[0] == 0  # only "suspicious" now
    assert run_cli(capsys, *base, "--bug", "1e6", "--fail-on", "suspicious")[0] == 1
    good = ["--impl", f"{user_impls}:correct", "--model", str(tiny_ckpt), "--steps", "3"]
    assert run_cli(capsys, *good, "--fail-on", "small")[0] == 0


def test_usage_errors_exit_2(capsys, tiny_ckpt, tmp_path):
    assert run_cli(capsys)[0] == 2  # no target
    assert run_cli(capsys, str(tiny_ckpt), "--hf", str(tmp_path))[0] == 2  # two targets
    assert run_cli(capsys, str(tiny_ckpt), "--chunk-sizes", "a,b")[0] == 2
    assert run_cli(capsys, str(tiny_ckpt), "--steps", "40")[0] == 2  # past the 32-position context
    assert run_cli(capsys, str(tmp_path / "nope"))[0] == 2
    rc, _, err = run_cli(capsys, "--hf", str(tmp_path), "--steps", "2")
    assert rc == 2 and "config.json" in err


def test_hf_directory_and_position_id_bug(capsys, tmp_path, user_impls):
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                  initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    transformers.GPT2LMHeadModel(cfg).eval().save_pretrained(tmp_path / "hf", safe_serialization=True)
    base = ["--hf", str(tmp_path / "hf"), "--steps", "3", "--chunk-sizes", "4"]
    rc, out, err = run_cli(capsys, *base)
    assert rc == 0, out + err
    rc, out, err = run_cli(capsys, *base, "--hf-no-position-ids")
    assert rc == 1 and "padded_batch" in out
    rc, out, err = run_cli(capsys, *base, "--hf-no-position-ids", "--no-padded-batch")
    assert rc == 0  # without left padding the missing position_ids are harmless
    rc, out, err = run_cli(capsys, "--impl", f"{user_impls}:hf_cached", "--model", str(tmp_path / "hf"), "--steps", "3",
                           "--chunk-sizes", "4")
    assert rc == 0 and "user_impls:hf_cached" in out, out + err


def test_compiled_decode_path_is_verified_too(capsys, tiny_ckpt):
    rc, out, err = run_cli(capsys, str(tiny_ckpt), "--compiled", "--steps", "6", "--chunk-sizes", "1,3", "--json")
    d = json.loads(out)
    assert rc == 0 and d["failing"] == [], err
    names = [i["impl"] for i in d["implementations"]]
    assert names == ["engine", "engine-compiled"]
    compiled = d["implementations"][1]
    assert compiled["verdict"] == "pass"
    assert set(compiled["max_abs_dlogit_by_phase"]) == {"prefill", "incremental", "chunk_1", "chunk_3", "padded_batch"}
    assert main(["verify-cache", "--hf", "nowhere", "--compiled"]) == 2
    assert "--compiled verifies genprobe's own compiled decode path" in capsys.readouterr().err
