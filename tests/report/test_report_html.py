"""The offline HTML report and figures, built from a small synthetic case (no full case run)."""

from __future__ import annotations

import json
import re

import pytest

from genprobe.report.claims import case_claims
from genprobe.report.figures import render_figures
from genprobe.report.headline import headline_rows, seed_tables
from genprobe.report.html import render_report, write_report


def test_report_is_self_contained(small_case, tmp_path):
    figs = render_figures(small_case, seed_tables())
    assert set(figs) == {
        "fig_decoding_distinct2.png",
        "fig_entropy_temperature.png",
        "fig_cache_compute_vs_speed.png",
        "fig_perturbation_shadow.png",
    }
    for png in figs.values():
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
    path = write_report(small_case, tmp_path, seed_tables(), figs)
    html = path.read_text(encoding="utf-8")
    # no external resource of any kind: every src/href is inline data or an in-page anchor
    for attr in re.findall(r'(?:src|href)="([^"]*)"', html):
        assert attr.startswith(("data:", "#")), attr
    assert "http://" not in html and "https://" not in html and "@import" not in html
    assert html.count("data:image/png;base64,") == 4
    for el in (
        "lab-tau",
        "lab-topk",
        "lab-topp",
        "lab-kept",
        "lab-draw",
        "trap-a",
        "trap-b",
        "kv-len",
        "kv-naive-count",
        "kv-cached-count",
        "headline",
        "findings",
    ):
        assert f'id="{el}"' in html, el


def test_embedded_data_survives_script_breakout(small_case):
    case = json.loads(json.dumps(small_case))
    case["sampling"]["distribution"]["tokens"][5] = "</script><b>x"
    html = render_report(case, seed_tables(), figures={})
    block = re.search(r'<script type="application/json" id="case-data">(.*?)</script>', html, re.S).group(1)
    data = json.loads(block)
    assert data["sampling"]["distribution"]["tokens"][5] == "</script><b>x"
    # decoded texts are escaped in the tables
    assert "春江&lt;unk&gt;" in html or '春江<span class="unk">&lt;unk&gt;</span>' in html
    assert "<unk></script>" not in html


def test_seed_numbers_beside_ours(small_case):
    seed = seed_tables()
    rows = {r[0]: r for r in headline_rows(small_case, seed)}
    assert rows["validation loss (nats)"][2] == seed["model"]["val_loss"]
    assert rows["greedy distinct-2"][1] == small_case["decoding"]["rows"][0]["distinct_2"]
    html = render_report(small_case, seed, figures={})
    assert "4.141" in html and "152.1" in html  # seed val loss and teacher-forcing perplexity


def test_findings_report_failures_honestly(small_case):
    case = json.loads(json.dumps(small_case))
    case["cache_exact"]["incremental_max_abs_dlogit"] = 0.5
    f = {x.claim: x for x in case_claims(case)}
    assert not f["KV cache: prefill Δ = 0.0, incremental < 1e-4"].holds
    assert "does NOT hold" in render_report(case, seed_tables(), figures={})


def test_report_write_is_atomic(small_case, tmp_path, monkeypatch):
    import genprobe.report.html as h

    (tmp_path / "report.html").write_text("old", encoding="utf-8")

    def boom(*a, **k):
        raise RuntimeError("render failed")

    monkeypatch.setattr(h, "render_report", boom)
    with pytest.raises(RuntimeError):
        h.write_report(small_case, tmp_path, seed_tables(), {})
    assert (tmp_path / "report.html").read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_element_ids_are_unique(small_case):
    html = render_report(small_case, seed_tables(), figures={})
    ids = re.findall(r'\sid="([^"]+)"', html)
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, dup
