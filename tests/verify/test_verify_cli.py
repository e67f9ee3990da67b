"""``genprobe verify-cache`` end to end: targets, user implementations, mutants, exit statuses, strict JSON."""

from __future__ import annotations

import json

import pytest

from genprobe.cli import main


def run_cli(capsys, *argv):
    rc = main(["verify-cache", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def strict_json(text: str) -> dict:
    """json.loads that refuses NaN / Infinity (what a strict parser such as JavaScript's would do)."""

    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_checkpoint_with_mutants_prints_tables_and_exits_0(capsys, tiny_ckpt):
    rc, out, err = run_cli(capsys, str(tiny_ckpt), "--mutants", "--max-new-tokens", "8", "--prompt", "春江潮水连海平")
    assert rc == 0, err
    for name in ("engine", "pos_zero", "no_cat", "no_mask", "kv_mismatch", "cat_order", "mask no-op", "isolation"):
        assert name in out
    assert "✗" not in out
    # the per-phase table gives each phase's first differing call: no_mask shows in prefill (0) and chunk_4 (0)
    line = next(ln for ln in out.splitlines() if ln.startswith("no_mask") and "@" in ln)
    assert line.count("@0") >= 2, line


def test_json_output(capsys, tiny_ckpt):
    rc, out, _ = run_cli(capsys, str(tiny_ckpt), "--max-new-tokens", "5", "--chunk-sizes", "2", "--json")
    d = strict_json(out)
    assert rc == 0 and d["exit_status"] == 0 and d["failing"] == [] and d["errors"] == []
    (impl,) = d["implementations"]
    assert impl["verdict"] == "pass" and impl["prefill_bit_identical"]
    assert set(impl["max_abs_dlogit_by_phase"]) == {
        "prefill",
        "incremental",
        "chunk_2",
        "padded_batch",
        "isolation",
        "prefix_reuse",
        "prefix_reuse_no_reset",
    }
    assert set(impl["first_diff_step_by_phase"]) == set(impl["max_abs_dlogit_by_phase"])
    assert d["reference"] == "full recomputation" and len(d["prompts"]) == 2


def test_impl_correct_passes_broken_fails(capsys, tiny_ckpt, user_impls):
    rc, out, err = run_cli(capsys, str(tiny_ckpt), "--impl", f"{user_impls}:correct", "--max-new-tokens", "6")
    assert rc == 0, out + err
    assert "user_impls:correct" in out and "pass" in out
    rc, out, err = run_cli(capsys, str(tiny_ckpt), "--impl", f"{user_impls}:broken", "--max-new-tokens", "6", "--json")
    assert rc == 1
    d = strict_json(out)
    assert d["implementations"][0]["verdict"] == "bug" and d["failing"] == [f"{user_impls}:broken"]
    assert d["implementations"][0]["first_diff_step_by_phase"]["incremental"] == 1
    assert "FAIL" in err


def test_impl_without_model_uses_its_own_reference(capsys, user_impls):
    rc, out, err = run_cli(capsys, "--impl", f"{user_impls}:standalone", "--max-new-tokens", "4", "--json")
    assert rc == 0, err
    d = strict_json(out)
    assert d["implementations"][0]["verdict"] == "pass" and len(d["prompts"]) == 3


# ---- an implementation that raises: verdict error, exit status 3, JSON still written ---------------------
def test_implementation_that_raises_is_error_with_exit_3(capsys, tiny_ckpt, user_impls):
    rc, out, err = run_cli(capsys, str(tiny_ckpt), "--impl", f"{user_impls}:crashy", "--max-new-tokens", "6", "--json")
    assert rc == 3, err
    d = strict_json(out)
    impl = d["implementations"][0]
    assert d["exit_status"] == 3 and d["errors"] == [f"{user_impls}:crashy"] and impl["verdict"] == "error"
    (e,) = impl["errors"]
    assert (e["phase"], e["type"]) == ("chunk_4", "RuntimeError") and "not implemented in this kernel" in e["message"]
    by_phase = {p["phase"]: p["verdict"] for p in impl["phases"]}
    assert by_phase["incremental"] == "pass" and by_phase["isolation"] == "pass"  # the other phases still ran
    assert "raised in phase chunk_4" in err and "Traceback" not in err


def test_factory_that_raises_is_error_with_exit_3(capsys, tiny_ckpt, user_impls):
    rc, out, err = run_cli(capsys, str(tiny_ckpt), "--impl", f"{user_impls}:factory_raises", "--json")
    assert rc == 3
    (impl,) = strict_json(out)["implementations"]
    assert impl["verdict"] == "error" and impl["errors"][0]["phase"] == "factory"
    assert impl["errors"][0]["type"] == "OSError" and "accelerator0" in impl["errors"][0]["message"]


def test_nan_logits_give_strict_json(capsys, tiny_ckpt, user_impls):
    rc, out, _ = run_cli(capsys, str(tiny_ckpt), "--impl", f"{user_impls}:nan_steps", "--max-new-tokens", "6", "--json")
    assert rc == 1
    assert "NaN" not in out and "Infinity" not in out
    impl = strict_json(out)["implementations"][0]
    assert impl["verdict"] == "bug" and impl["max_abs_dlogit"] == "inf"
    assert any(p["nonfinite_logits"] for p in impl["phases"])


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
    rc, _, err = run_cli(capsys, "--impl", spec, "--max-new-tokens", "2")
    assert rc == 2 and msg in err, err


def test_thresholds_and_fail_on_drive_the_exit_status(capsys, tiny_ckpt, user_impls):
    base = [str(tiny_ckpt), "--impl", f"{user_impls}:broken", "--max-new-tokens", "3"]
    assert run_cli(capsys, *base)[0] == 1
    assert run_cli(capsys, *base, "--bug", "1e6", "--rel-bug", "1e6")[0] == 0  # only "suspicious" now
    assert run_cli(capsys, *base, "--bug", "1e6")[0] == 1  # still > 1 σ of the reference logits
    assert run_cli(capsys, *base, "--bug", "1e6", "--rel-bug", "1e6", "--fail-on", "suspicious")[0] == 1
    good = [str(tiny_ckpt), "--impl", f"{user_impls}:correct", "--max-new-tokens", "3"]
    assert run_cli(capsys, *good, "--fail-on", "small")[0] == 0


def test_usage_errors_exit_2(capsys, tiny_ckpt, tmp_path):
    assert run_cli(capsys)[0] == 2  # no target
    assert run_cli(capsys, str(tiny_ckpt), "--chunk-sizes", "a", "b")[0] == 2
    assert run_cli(capsys, str(tiny_ckpt), "--max-new-tokens", "40")[0] == 2  # past the 32-position context
    assert run_cli(capsys, str(tmp_path / "nope"))[0] == 2
    rc, _, err = run_cli(capsys, str(tmp_path), "--max-new-tokens", "2")
    assert rc == 2 and "neither a genprobe checkpoint" in err
    rc, _, err = run_cli(capsys, str(tiny_ckpt), "--hf-cache", "static")
    assert rc == 2 and "hf_caches verifies a transformers model" in err


def test_compiled_decode_path_is_verified_too(capsys, tiny_ckpt):
    rc, out, err = run_cli(
        capsys, str(tiny_ckpt), "--compiled", "--max-new-tokens", "6", "--chunk-sizes", "1", "3", "--json"
    )
    d = strict_json(out)
    assert rc == 0 and d["failing"] == [], err
    names = [i["impl"] for i in d["implementations"]]
    assert names == ["engine", "engine-compiled"]
    compiled = d["implementations"][1]
    assert compiled["verdict"] == "pass"
    assert set(compiled["max_abs_dlogit_by_phase"]) == {
        "prefill",
        "incremental",
        "chunk_1",
        "chunk_3",
        "padded_batch",
        "isolation",
        "prefix_reuse",
        "prefix_reuse_no_reset",
    }
    assert main(["verify-cache", "--impl", "x:y", "--compiled"]) == 2
    assert "compiled verifies genprobe's own compiled decode path" in capsys.readouterr().err
