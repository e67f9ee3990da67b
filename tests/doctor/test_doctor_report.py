"""Issue #33: the doctor's report — the library call, strict ``doctor.json`` with every stage, and ``report.html``
in a real browser (system Chromium driven by playwright): every section present, no console error, a screenshot."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import genprobe
from genprobe.doctor import DoctorReport, Finding
from genprobe.doctor.verdict import verdict_of

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
    from genprobe.doctor import DoctorOptions, run_doctor
    from genprobe.doctor.options import FULL

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
    assert [s["status"] for s in d["stages"]] == ["ran"] * 5
    assert {f["stage"] for f in d["findings"]} == {"card", "inference", "attention", "degeneration", "fixes"}
    assert d["exit_status"] in (0, 4) and d["verdict"] in ("healthy", "warnings")
    assert d["card"]["parameters"] > 0 and d["card"]["tensors"]
    assert d["inference"]["noise_floor"] is not None
    heads = d["attention"]["heads"]
    assert len(heads) == d["attention"]["n_layer"] * d["attention"]["n_head"]
    assert set(d["degeneration"]["scans"]["scans"]) == {"greedy", "your sampler"}
    assert d["fixes"]["rows"][0]["name"] == "greedy" and d["fixes"]["recommendation"]
    assert (full_report / "prompts.txt").read_text(encoding="utf-8").count("\n") == 24


def test_library_call_returns_a_typed_report(trained_ckpt):
    rep = genprobe.diagnose(genprobe.load(trained_ckpt), quick=True, only=["card", "attention"])
    assert isinstance(rep, genprobe.DoctorReport) and isinstance(rep.findings[0], genprobe.Finding)
    assert rep.inference is None and rep.card is not None and rep.exit_status in (0, 4)
    _strict(json.dumps(rep.to_dict()))


def test_verdict_is_the_worst_finding():
    def f(sev: str) -> Finding:
        return Finding("card", "x", sev, "t")

    assert verdict_of([]).exit_status == 0
    assert verdict_of([f("ok"), f("info")]).exit_status == 0
    assert verdict_of([f("info"), f("warning")]).exit_status == 4
    assert verdict_of([f("warning"), f("bug")]).exit_status == 1
    with pytest.raises(ValueError, match="severity"):
        f("fatal")


def test_json_flag_prints_the_report(trained_ckpt, tmp_path, capsys):
    run_cli("doctor", trained_ckpt, "--quick", "--only", "card", "--json", "--out", tmp_path / "doc")
    d = _strict(capsys.readouterr().out)
    assert d["options"]["stages"] == ["card"] and d["files"]["html"].endswith("report.html")
    assert isinstance(DoctorReport, type)


@pytest.mark.browser
def test_report_in_chromium(full_report, tmp_path):
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("CI: /usr/bin/chromium is missing — run scripts/install_system_packages.sh")
        pytest.skip("headless Chromium not installed (/usr/bin/chromium)")
    sync = pytest.importorskip("playwright.sync_api")
    errors, requests = [], []
    shot = tmp_path / "doctor.png"
    with sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
            page.goto((full_report / "report.html").resolve().as_uri())
            page.wait_for_selector("body[data-ready='1']", timeout=15000)
            for s in SECTIONS:
                assert page.is_visible(f"section[data-section='{s}'] h2"), s
            assert page.locator("section[data-section='fixes'] .skipped").count() == 0
            assert page.locator("#heatmap td").count() >= 2
            assert page.inner_text("#verdict") in ("healthy", "warnings")
            page.select_option("#severity-filter", "ok")
            shown = page.eval_on_selector_all(
                "#findings tbody tr", "rs => rs.filter(r => r.style.display !== 'none').map(r => r.dataset.severity)"
            )
            assert shown and set(shown) == {"ok"}
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert errors == [] and requests == []
    assert shot.stat().st_size > 10_000
