"""Issue #29: every ``verify-cache`` action exists in the library. ``genprobe.verify_caches`` and
``genprobe.verify.api.verify_targets`` build and run what the CLI runs, and give what its JSON says."""

from __future__ import annotations

import json

import pytest

import genprobe
from genprobe._io import json_safe
from genprobe.cli import main
from genprobe.verify.adapters import CompiledEngineAdapter, EngineAdapter
from genprobe.verify.api import verify_targets
from genprobe.verify.harness import VerifyOptions


def _cli_json(capsys, *argv) -> dict:
    main(["verify-cache", *argv, "--json"])
    return json.loads(capsys.readouterr().out)


def test_verify_caches_with_mutants_gives_what_the_cli_prints(capsys, tiny_ckpt):
    model = genprobe.load(tiny_ckpt)
    res = genprobe.verify_caches(model, mutants=True, prompts=["春江潮水连海平"], max_new_tokens=6, chunk_sizes=(2,))
    d = _cli_json(
        capsys, str(tiny_ckpt), "--mutants", "--prompt", "春江潮水连海平", "--max-new-tokens", "6", "--chunk-sizes", "2"
    )
    assert isinstance(res, genprobe.CacheVerification) and isinstance(res.mutants, genprobe.MutantTable)
    assert [(r.impl, r.verdict) for r in res.reports] == [(r["impl"], r["verdict"]) for r in d["implementations"]]
    assert [(r["impl"], r["as_expected"]) for r in res.mutants.rows] == [
        (r["impl"], r["as_expected"]) for r in d["mutants"]
    ]
    assert res.prompts == d["prompts"] and res.reference == d["reference"] == "full recomputation"
    assert set(res.mutants.mask_noop) == set(d["mask_noop"]) and res.mutants.mask_noop["no_mask_t_new_1"] == 0.0
    lib = json_safe(res)
    assert lib["failing"] == d["failing"] == [] and lib["errors"] == d["errors"] == []
    assert {
        k: v for k, v in d.items() if k not in ("weight_dtype", "narrow_output", "exit_status")
    }.keys() == lib.keys()


def test_verify_targets_builds_the_compiled_path_and_refuses_what_does_not_apply(tiny_ckpt):
    model = genprobe.load(tiny_ckpt)
    t = verify_targets(model, opts=VerifyOptions(compiled=True))
    assert [type(x.impl) for x in t.targets] == [EngineAdapter, CompiledEngineAdapter] and t.reference is not None
    with pytest.raises(ValueError, match="hf_caches"):
        verify_targets(model, hf_caches=("static",))
    with pytest.raises(ValueError, match="compiled"):
        verify_targets(model, opts=VerifyOptions(compiled=True, window=4))


def test_a_factory_that_raises_is_an_error_report_not_an_exception(tiny_ckpt, user_impls):
    model = genprobe.load(tiny_ckpt)
    (t,) = verify_targets(model, f"{user_impls}:factory_raises").targets
    assert t.impl is None and t.report is not None and t.report.verdict == "error"
    res = genprobe.verify_caches(model, f"{user_impls}:factory_raises", max_new_tokens=4)
    assert res.errors == [f"{user_impls}:factory_raises"] and res.reports[0].errors[0].phase == "factory"


def test_hf_caches_all_names_every_kind(tmp_path):
    from genprobe.verify.hf_caches import CACHE_KINDS
    from genprobe.verify.hf_matrix import tiny_model

    tiny_model("llama", init=0.2).save_pretrained(tmp_path / "llama", safe_serialization=True)
    model = genprobe.load(tmp_path / "llama")
    t = verify_targets(model, hf_caches=("all",))
    assert len(t.targets) == len(CACHE_KINDS)
    assert all(x.report is not None or x.impl.cache_kind == k for x, k in zip(t.targets, CACHE_KINDS, strict=True))
