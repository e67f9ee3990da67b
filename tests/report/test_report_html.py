"""The offline HTML report and figures, built from a small synthetic case (no full case run)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from genprobe.corpus import CharTokenizer
from genprobe.experiments.exposure import run_exposure
from genprobe.experiments.findings import findings
from genprobe.experiments.sampling import run_sampling
from genprobe.experiments.seed import seed_tables
from genprobe.experiments.timing import run_cache_scaling, run_cache_timing
from genprobe.model import GPT, GPTConfig
from genprobe.report import write_figures, write_report
from genprobe.report.html import headline_rows, render_report


@pytest.fixture(scope="module")
def small_case(corpus):
    """A case dict from a tiny random model: real structure, fake numbers where they cost time."""
    tok = CharTokenizer.from_text(corpus.text, 60)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=32, d_ff=64, block_size=64)).eval()
    seed = seed_tables()
    case = {
        "meta": {"genprobe": "test", "torch": torch.__version__, "threads": 1, "device": "cpu", "quick": True,
                 "created_utc": "2026-01-01T00:00:00Z", "seconds": {"sampling": 0.1}},
        "model": {"params": model.num_parameters(), "val_loss": 4.0, "unigram_ce": 5.0, "coverage_1200": 0.5, "unk_share": 0.5},
        "decoding": _fake_decoding(),
        "sampling": run_sampling(model, tok),
        "exposure": run_exposure(model, tok, corpus, quick=True),
        "cache_exact": {"prefill_max_abs_dlogit": 0.0, "incremental_max_abs_dlogit": 1e-6, "chunk4_max_abs_dlogit": 1e-6,
                        "verdict": "pass"},
        "cache_bugs": [dict(r, verdict="pass" if r["impl"] in ("correct", "cat_order") else "bug", as_expected=True)
                       for r in seed["cache_bugs"]],
        "mask_noop": dict(seed["mask_noop"]),
        "cache_timing": run_cache_timing(model, [3, 4, 5], new_tokens=4, batches=(1, 2), reps=1),
        "cache_scaling": run_cache_scaling([3, 4, 5], tok.vocab_size, new_tokens=(2, 4), reps=1,
                                           cfg=GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=32, d_ff=64, block_size=16)),
    }
    return case


def _fake_decoding() -> dict:
    seed = seed_tables()["decoding"]
    rows = []
    for i, r in enumerate(seed["rows"]):
        rows.append({**r, "sampler": {"greedy": i < 2}, "text": "春江", "text_with_unk": "春江<unk></script>",
                     "longest_repeat_text": "。，", "looping": i == 0, "loop_period": 2 if i == 0 else None,
                     "loop_onset": 0 if i == 0 else None, "loop_unit": "。，" if i == 0 else None})
    return {"prompt": "春江潮水连海平", "prompt_unknown_chars": ["连"], "new_tokens": 50, "rows": rows,
            "sampling_bans_unk": True, "rows_sampling_with_unk": [], "other_prompts": []}


def test_report_is_self_contained(small_case, tmp_path):
    figs = write_figures(small_case, tmp_path)
    assert set(figs) == {"fig_decoding_distinct2.png", "fig_entropy_temperature.png",
                         "fig_cache_compute_vs_speed.png", "fig_perturbation_shadow.png"}
    for name in figs:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path = write_report(small_case, tmp_path, figures=figs)
    html = path.read_text(encoding="utf-8")
    # no external resource of any kind: every src/href is inline data or an in-page anchor
    for attr in re.findall(r'(?:src|href)="([^"]*)"', html):
        assert attr.startswith(("data:", "#")), attr
    assert "http://" not in html and "https://" not in html and "@import" not in html
    assert html.count("data:image/png;base64,") == 4
    for el in ("lab-tau", "lab-topk", "lab-topp", "lab-kept", "lab-draw", "trap-a", "trap-b", "kv-len",
               "kv-naive-count", "kv-cached-count", "headline", "findings"):
        assert f'id="{el}"' in html, el


def test_embedded_data_survives_script_breakout(small_case):
    case = json.loads(json.dumps(small_case))
    case["sampling"]["distribution"]["tokens"][5] = "</script><b>x"
    html = render_report(case, figures={})
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
    f = {x["claim"]: x for x in findings(case)}
    assert not f["KV cache: prefill Δ = 0.0, incremental < 1e-4"]["holds"]
    assert "does NOT hold" in render_report(case, figures={})


def test_report_write_is_atomic(small_case, tmp_path, monkeypatch):
    import genprobe.report.html as h

    (tmp_path / "report.html").write_text("old", encoding="utf-8")

    def boom(*a, **k):
        raise RuntimeError("render failed")

    monkeypatch.setattr(h, "render_report", boom)
    with pytest.raises(RuntimeError):
        h.write_report(small_case, tmp_path)
    assert (tmp_path / "report.html").read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_element_ids_are_unique(small_case):
    html = render_report(small_case, figures={})
    ids = re.findall(r'\sid="([^"]+)"', html)
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, dup
