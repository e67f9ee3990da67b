"""The public API, used as a newcomer would: ``import genprobe`` and nothing else."""

from __future__ import annotations

import json

import pytest
import torch

import genprobe
from genprobe._io import json_safe


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_public_names_are_exported():
    for name in (
        "load",
        "Model",
        "SamplingParams",
        "Completion",
        "scan_loops",
        "repair_loops",
        "RepairConfig",
        "attention_heads",
        "padding_leak",
        "run_case",
        "verify_cache",
    ):
        assert name in dir(genprobe), name
        assert getattr(genprobe, name) is not None


def test_load_and_generate(trained_ckpt):
    model = genprobe.load(trained_ckpt)
    greedy = model.generate("白日依山盡", max_new_tokens=12)
    sampled = model.generate(
        ["白日依山盡", "黃河"], genprobe.SamplingParams(temperature=0.8, top_p=0.9), max_new_tokens=12, seed=1
    )
    assert len(greedy[0].token_ids) == 12 and greedy[0].finished == "length"
    assert [c.prompt for c in sampled] == ["白日依山盡", "黃河"]
    assert sampled == model.generate(
        ["白日依山盡", "黃河"], genprobe.SamplingParams(temperature=0.8, top_p=0.9), max_new_tokens=12, seed=1
    )  # seeded: reproducible
    json.dumps([json_safe(c) for c in sampled], ensure_ascii=False)


def test_scan_and_repair_loops(trained_ckpt, tmp_path):
    model = genprobe.load(trained_ckpt)
    before = model.state_sha256()
    scan = genprobe.scan_loops(model, ["白日依山盡", "黃河入海流", "床前看月光"], max_new_tokens=24)
    assert scan.summary.n == 3 and 0.0 <= scan.summary.degenerate_rate <= 1.0
    cfg = genprobe.RepairConfig(
        n_direction=96,
        n_search=48,
        n_validate=32,
        search_prone=6,
        search_control=6,
        ks=(4,),
        subtract_alphas=(1.0,),
        project_alphas=(),
        forms=("subtract",),
        regression_windows=8,
    )
    fix = genprobe.repair_loops(model, config=cfg, out=tmp_path / "repair")
    assert model.state_sha256() == before  # the search leaves the model as it found it
    assert (tmp_path / "repair" / "repair.json").is_file()
    assert json.loads((tmp_path / "repair" / "repair.json").read_text())["verdict"] == fix.report.verdict
    assert (fix.patch is None) == (fix.report.validation is None or not fix.report.validation.significant)


def test_attention_and_padding_leak(trained_ckpt):
    model = genprobe.load(trained_ckpt)
    heads = genprobe.attention_heads(model, "白日依山盡黃河入海流")
    assert len(heads.heads) == 2 * 4 and json_safe(heads)["seq_len"] == 10
    assert all(0.0 <= h.far_mass <= 1.0 for h in heads.heads if h.far_mass is not None)
    leak = genprobe.padding_leak(model)
    assert not leak.leak and json_safe(leak)["sequences"]


def test_verify_cache(trained_ckpt):
    model = genprobe.load(trained_ckpt)
    report = genprobe.verify_cache(model, max_new_tokens=8)
    assert report.verdict == "pass"
    json.dumps(json_safe(report), allow_nan=False)


@pytest.mark.slow
def test_run_case_quick(trained_ckpt, tmp_path):
    study = genprobe.run_case(tmp_path / "case", trained_ckpt, quick=True, only=["decoding", "sampling"])
    assert study.report.is_file() and study.json_path.is_file()
    assert set(json.loads(study.json_path.read_text())) >= {"meta", "model", "decoding", "sampling"}


@pytest.mark.slow
def test_readme_library_example_runs(trained_ckpt, tmp_path, monkeypatch, capsys):
    """The README's library block, as written (only the checkpoint path points at the test model)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Library", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert code.startswith("import genprobe\n") and "from genprobe" not in code  # only the public API
    assert '"out/case/model"' in code
    monkeypatch.chdir(tmp_path)
    exec(compile(code.replace('"out/case/model"', repr(str(trained_ckpt))), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "verify-cache: pass" in out and "padding leak: False" in out and "repair:" in out
    assert (tmp_path / "runs" / "api-repair" / "repair.json").is_file()
