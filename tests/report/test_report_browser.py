"""The report's interactive experiments in a real headless Chromium (system chromium driven by PyPI playwright).

Skips only when /usr/bin/chromium is absent and we are not in CI (``CI`` set → the absence fails).
Install it with ``scripts/install_system_packages.sh``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from genprobe._io import json_safe
from genprobe.engine.samplers.chain import kept_set_size, process_logits
from genprobe.engine.samplers.stages import SamplerConfig
from genprobe.experiments.sampling import run_sampling
from genprobe.report.headline import seed_tables
from genprobe.report.html import write_report

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _need_browser():
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("CI: /usr/bin/chromium is missing — run scripts/install_system_packages.sh")
        pytest.skip("headless Chromium not installed (/usr/bin/chromium); run scripts/install_system_packages.sh")
    return pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def report(trained, tmp_path_factory):
    """A report holding the trained model's real next-token distribution (sampling section only)."""
    model, tok, _ = trained
    case = {"meta": {"genprobe": "test", "quick": True}, "sampling": json_safe(run_sampling(model, tok))}
    out = tmp_path_factory.mktemp("report")
    return write_report(case, out, seed_tables(), figures={}), case


def _set(page, sel: str, value) -> None:
    page.eval_on_selector(
        sel,
        "(el, v) => { el.value = String(v); el.dispatchEvent(new Event('input', {bubbles: true})); "
        "el.dispatchEvent(new Event('change', {bubbles: true})); }",
        value,
    )


def _val(page, sel: str) -> str:
    return page.get_attribute(sel, "data-value")


def test_interactive_report_in_chromium(report, tmp_path):
    sync = _need_browser()
    path, case = report
    logits = torch.tensor(case["sampling"]["distribution"]["logits"], dtype=torch.float32)
    V = logits.numel()
    errors, requests = [], []
    with sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
            page.goto(path.resolve().as_uri())
            page.wait_for_selector("body[data-ready='1']", timeout=15000)

            # --- sampling lab: kept-set size equals Python's kept_set_size for the same settings
            assert int(_val(page, "#lab-kept")) == V  # nothing truncated at the start
            settings = [
                (1.0, 0, 0.9, "trunc_then_temp"),
                (0.5, 0, 0.9, "trunc_then_temp"),
                (0.5, 0, 0.9, "temp_then_trunc"),
                (2.0, 0, 0.9, "temp_then_trunc"),
                (1.5, 50, 0.95, "temp_then_trunc"),
                (0.8, 10, 1.0, "trunc_then_temp"),
                (1.0, 0, 0.5, "trunc_then_temp"),
                (3.0, 0, 0.99, "temp_then_trunc"),
            ]
            for tau, k, top_p, order in settings:
                _set(page, "#lab-tau", tau)
                _set(page, "#lab-topk", k)
                _set(page, "#lab-topp", top_p)
                _set(page, "#lab-order", order)
                cfg = SamplerConfig(temperature=tau, top_k=k or None, top_p=top_p if top_p < 1 else None, order=order)
                want = kept_set_size(logits, cfg)
                assert int(_val(page, "#lab-kept")) == want, (tau, k, top_p, order)
                # entropy / perplexity shown are those of the processed (sampling) distribution
                shown = float(_val(page, "#lab-entropy"))
                q = torch.softmax(process_logits(logits[None], None, cfg)[0].double(), -1)
                h = float(-(q[q > 0] * q[q > 0].log()).sum())
                assert shown == pytest.approx(h, abs=2e-3), (tau, k, top_p, order)
                assert float(_val(page, "#lab-ppl")) == pytest.approx(torch.tensor(h).exp().item(), rel=3e-3)

            # --- draw: with top-k 1 the draw must be the argmax; then several draws from a wider set
            _set(page, "#lab-topk", 1)
            page.click("#lab-draw")
            assert int(page.get_attribute("#lab-sample", "data-id")) == int(logits.argmax())
            _set(page, "#lab-topk", 0)
            _set(page, "#lab-topp", 0.9)
            _set(page, "#lab-order", "trunc_then_temp")
            kept = torch.isfinite(process_logits(logits[None], None, SamplerConfig(top_p=0.9))[0])
            for _ in range(5):
                page.click("#lab-draw")
                tid = int(page.get_attribute("#lab-sample", "data-id"))
                assert kept[tid], tid  # never a truncated token
            assert page.get_attribute("#lab-sample", "data-draws") == "6"
            assert len(page.text_content("#lab-history")) >= 6

            # --- order trap: both orders as τ and p move
            for tau, top_p in [(0.5, 0.9), (1.0, 0.9), (2.0, 0.9), (1.5, 0.95)]:
                _set(page, "#trap-tau", tau)
                _set(page, "#trap-p", top_p)
                for sel, order in (("#trap-a", "trunc_then_temp"), ("#trap-b", "temp_then_trunc")):
                    want = kept_set_size(logits, SamplerConfig(temperature=tau, top_p=top_p, order=order))
                    assert int(_val(page, sel)) == want, (tau, top_p, order)

            # --- KV workload grid: the counters follow seed §3.3.2 and the engine's count
            for n in (20, 50, 100):
                _set(page, "#kv-len", n)
                assert int(_val(page, "#kv-naive-count")) == n * 7 + n * (n - 1) // 2
                assert int(_val(page, "#kv-cached-count")) == 7 + n - 1
            page.click("#kv-play")
            page.wait_for_function("document.getElementById('kv-step').dataset.value === '100'", timeout=15000)

            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "report.png").stat().st_size > 10_000
    assert not errors, errors
    assert not requests, requests
