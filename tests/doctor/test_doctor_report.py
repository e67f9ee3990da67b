"""Issue #33: the doctor's report — the library call, strict ``doctor.json`` with every stage, and ``report.html``
in a real browser (system Chromium driven by playwright): every section present, no console error, a screenshot."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import genprobe
from genprobe._io import json_safe
from genprobe.doctor.options import Finding, Verdict
from genprobe.doctor.run import DoctorReport

from .conftest import run_cli

CHROMIUM = Path("/usr/bin/chromium")
SECTIONS = ("summary", "card", "inference", "attention", "degeneration", "fixes")


def _strict(text: str) -> dict:
    def refuse(name):
        raise ValueError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def full_report(trained_ckpt, tmp_path_factory) -> Path:
    """A full doctor run on the trained test checkpoint, with a small which-fix stage (the budget shrunk)."""
    from genprobe.doctor.options import FULL, DoctorOptions
    from genprobe.doctor.run import run_doctor

    out = tmp_path_factory.mktemp("doctor")
    budget = FULL.__class__(
        **{
            **FULL.__dict__,
            "scan_prompts": 24,
            "eos_prompts": 8,
            "fix_prompts": 16,
            "verify_steps": 8,
            "scan_tokens": 24,
        }
    )
    opts = DoctorOptions(sampling=genprobe.SamplingParams(temperature=0.8), budget=budget)
    run_doctor(genprobe.load(trained_ckpt), opts, out=out)
    return out


def test_every_stage_runs_and_the_json_is_strict(full_report):
    d = _strict((full_report / "doctor.json").read_text(encoding="utf-8"))
    assert [s["status"] for s in d["stages"]] == ["ran"] * 7
    stages = {"audit", "card", "quality", "inference", "attention", "degeneration", "fixes"}
    assert {f["stage"] for f in d["findings"]} == stages
    assert d["audit"]["kind"] == "genprobe"  # a checkpoint: the audit says "not checked", nothing to read
    assert d["exit_status"] in (0, 4) and d["verdict"] in ("healthy", "warnings")
    assert d["card"]["parameters"] > 0 and d["card"]["tensors"]
    assert d["inference"]["caches"]["noise_floor"] is not None
    heads = d["attention"]["heads"]
    assert len(heads) == d["attention"]["n_layer"] * d["attention"]["n_head"]
    assert set(d["degeneration"]["scans"]["scans"]) == {"greedy", "your sampler"}
    assert d["fixes"]["rows"][0]["name"] == "greedy" and d["fixes"]["recommendation"]
    assert (full_report / "prompts.txt").read_text(encoding="utf-8").count("\n") == 24


def test_library_call_returns_a_typed_report(trained_ckpt):
    rep = genprobe.diagnose(genprobe.load(trained_ckpt), quick=True, only=["card", "attention"])
    assert isinstance(rep, genprobe.DoctorReport) and isinstance(rep.findings[0], genprobe.Finding)
    assert rep.inference is None and rep.card is not None and rep.exit_status in (0, 4)
    _strict(json.dumps(json_safe(rep)))


def test_verdict_is_the_worst_finding():
    def f(sev: str) -> Finding:
        return Finding("card", "x", sev, "t")

    assert Verdict.of([]).exit_status == 0
    assert Verdict.of([f("ok"), f("info")]).exit_status == 0
    assert Verdict.of([f("info"), f("warning")]).exit_status == 4
    assert Verdict.of([f("warning"), f("bug")]).exit_status == 1
    with pytest.raises(ValueError, match="severity"):
        f("fatal")


def test_json_flag_prints_the_report(trained_ckpt, tmp_path, capsys):
    run_cli("doctor", trained_ckpt, "--quick", "--only", "card", "--json", "--out", tmp_path / "doc")
    d = _strict(capsys.readouterr().out)
    assert d["options"]["stages"] == ["card"] and d["files"]["html"].endswith("report.html")
    assert isinstance(DoctorReport, type)


def _reports(full_report: Path) -> list[Path]:
    """The report of this suite, and those named in GENPROBE_DOCTOR_REPORTS (``os.pathsep``-separated ``--out``
    directories of doctor runs, e.g. on the three reference models: docs/doctor.md)."""
    extra = [Path(p) for p in os.environ.get("GENPROBE_DOCTOR_REPORTS", "").split(os.pathsep) if p]
    return [full_report, *extra]


def _check_page(page, out: Path, shot: Path) -> None:
    """Every section present, the stages that ran shown (not 'not run'), the filter working, a screenshot."""
    d = _strict((out / "doctor.json").read_text(encoding="utf-8"))
    page.goto((out / "report.html").resolve().as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=15000)
    for s in SECTIONS:
        assert page.is_visible(f"section[data-section='{s}'] h2"), s
    for stage in d["stages"]:
        skipped = page.locator(f"section[data-section='{stage['name']}'] .skipped").count()
        assert (skipped == 0) == (stage["status"] == "ran"), stage
    if d["attention"] is not None:
        assert page.locator("#heatmap td").count() == d["attention"]["n_layer"] * d["attention"]["n_head"]
    assert page.inner_text("#verdict") == d["verdict"]
    page.select_option("#severity-filter", "ok")
    rows = "rs => rs.filter(r => r.style.display !== 'none').map(r => r.dataset.severity)"
    shown = page.eval_on_selector_all("#findings tbody tr", rows)
    assert set(shown) == {"ok"} and len(shown) == sum(f["severity"] == "ok" for f in d["findings"])
    page.screenshot(path=str(shot), full_page=True)


@pytest.mark.browser
def test_report_in_chromium(full_report, tmp_path):
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("CI: /usr/bin/chromium is missing — run scripts/install_system_packages.sh")
        pytest.skip("headless Chromium not installed (/usr/bin/chromium)")
    sync = pytest.importorskip("playwright.sync_api")
    errors, requests = [], []
    shots = []
    with sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
        try:
            for i, out in enumerate(_reports(full_report)):
                page = browser.new_page(viewport={"width": 1200, "height": 900})
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on(
                    "request", lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None
                )
                shots.append(Path(os.environ.get("GENPROBE_DOCTOR_SHOTS", tmp_path)) / f"doctor-{i}.png")
                shots[-1].parent.mkdir(parents=True, exist_ok=True)
                _check_page(page, out, shots[-1])
                page.close()
        finally:
            browser.close()
    assert errors == [] and requests == []
    assert all(s.stat().st_size > 10_000 for s in shots)


def test_head_flags_follow_their_criteria():
    import torch

    from genprobe.doctor.attention_health import DEAD_ENTROPY, POSITION_TV, SINK_MASS, _content_tv, _flag

    assert _flag(DEAD_ENTROPY, 0.0, 0.0) == "dead"
    assert _flag(0.5, SINK_MASS, 0.0) == "sink"
    assert _flag(0.5, 0.2, POSITION_TV) == "position"
    assert _flag(0.5, 0.2, POSITION_TV + 0.01) is None
    T = 12
    prev = torch.zeros(1, 1, T, T)  # a previous-token head: the same map whatever the tokens
    prev[0, 0, 0, 0] = 1.0
    for q in range(1, T):
        prev[0, 0, q, q - 1] = 1.0
    rows = torch.arange(T) >= 8
    assert float(_content_tv(prev, prev.clone(), rows)) == 0.0
    other = torch.roll(prev, 1, dims=-1)
    assert float(_content_tv(prev, other, rows)) == 1.0


def test_card_groups_weights_by_tensor_type_with_the_gguf_quantization(tiny_model):
    from genprobe.doctor.card import tensor_groups
    from genprobe.model.load import Model

    model = Model.from_module(tiny_model)
    model.meta["gguf"] = {
        "tensor_types": {"token_embd.weight": "Q8_0", "blk.0.ffn_down.weight": "Q4_1", "blk.1.ffn_down.weight": "Q4_1"}
    }
    groups = {g.name: g for g in tensor_groups(model)}
    assert groups["h.*.mlp.c_proj.weight"].tensors == tiny_model.cfg.n_layer
    assert groups["h.*.mlp.c_proj.weight"].dtype == "float32"
    assert groups["gguf:blk.*.ffn_down.weight"].gguf_types == {"Q4_1": 2}
    assert groups["gguf:token_embd.weight"].gguf_types == {"Q8_0": 1}


def test_cache_classes_that_apply():
    from types import SimpleNamespace

    from genprobe.doctor.inference import cache_kinds
    from genprobe.doctor.options import DoctorOptions

    full, quick = DoctorOptions(), DoctorOptions(quick=True)
    windowed = SimpleNamespace(kind="hf", window=16)
    assert cache_kinds(windowed, full) == ("dynamic", "static", "sliding")
    assert cache_kinds(SimpleNamespace(kind="hf", window=None), full) == ("dynamic", "static")
    assert cache_kinds(windowed, quick) == ()  # the model's default cache only
    assert cache_kinds(SimpleNamespace(kind="genprobe", window=None), full) == ()  # our engine's cache
