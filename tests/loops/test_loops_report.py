"""The repair page: rendered from the package template with autoescaping, with and without an edit."""

from genprobe._io import json_safe
from genprobe.loops.pages import rate_rows, write_summary
from genprobe.loops.scan import loop_rates
from genprobe.metrics.degeneracy import measure_loops


def _rates(gens):
    return json_safe(loop_rates([measure_loops(g) for g in gens]))


def _report(with_edit: bool) -> dict:
    cands = [
        {"form": f, "layers": [0], "k": 4, "alpha": a, "degenerate_rate": lr, "kl": kl, "dloss": 0.0}
        for f in ("subtract", "project")
        for a, lr, kl in ((0.5, 0.2, 0.01), (1.0, None, 0.5))
    ]
    rep = {
        "verdict": "no edit passed the limits",
        "sampler": {"greedy": True},
        "timings_s": {"total": 1.0},
        "end_token": {"id": 0, "banned": True, "note": "the end-of-text token (id 0) is banned"},
        "locate": {
            "base_degenerate_rate": 0.3,
            "base_loop_rate": 0.2,
            "ranking": [0],
            "per_layer": [{"layer": 0, "degenerate_rate": 0.25, "loop_rate": 0.1}],
            "all_layers": None,
        },
        "search": {
            "candidates": cands,
            "limits": {"max_kl": 0.1, "max_dloss": 0.02},
            "base_loop_rate": 0.1,
            "chosen": None,
            "admissible": 2,
        },
        "validation": None,
        "patch": None,
    }
    if with_edit:
        before = _rates(["ab" * 20, "春江潮水連海平" * 3])
        after = _rates(["abcdefghijklmnopqrstuvwxyz", "春江潮水連海平"])
        rep.update(
            verdict="edit passed the limits",
            search=dict(rep["search"], chosen=cands[0]),
            patch={
                "edit": {"layers": [0]},
                "weights_changed": 128,
                "total_parameters": 1000,
                "fraction_changed": 0.128,
            },
            validation={
                "before": before,
                "after": after,
                "loop_prone_before": before,
                "loop_prone_after": after,
                "regression": {"kl": 0.01, "dloss": 0.001, "loss": 4.0, "base_loss": 4.0},
                "new_loops": 0,
                "new_exact_loops": 0,
                "samples": [
                    {
                        "prompt": "<script>x</script>",
                        "before": "a<b",
                        "after": "c&d",
                        "before_period": 2,
                        "after_period": None,
                        "before_near_period": 2,
                        "after_near_period": None,
                    }
                ],
            },
        )
    return rep


def test_summary_files_without_an_edit(tmp_path):
    files = write_summary(_report(False), tmp_path)
    assert files["png"].read_bytes()[:4] == b"\x89PNG"
    html = files["html"].read_text(encoding="utf-8")
    assert "no edit passed the limits" in html and "Chosen edit" not in html
    assert "end-of-text token (id 0) is banned" in html


def test_summary_with_an_edit_escapes_text_and_shows_every_measure(tmp_path):
    html = write_summary(_report(True), tmp_path)["html"].read_text(encoding="utf-8")
    assert "&lt;script&gt;x&lt;/script&gt;" in html and "<script>x" not in html  # autoescaping on
    assert "a&lt;b" in html and "c&amp;d" in html
    for label in (
        "exact loop rate",
        "near-loop rate",
        "repetitive tail",
        "degenerate",
        "tail compression",
        "seq-rep-4",
        "distinct-2",
        "longest repeat",
    ):
        assert label in html
    assert "data:image/png;base64," in html


def test_rate_rows_carry_cis_for_rates():
    rows = rate_rows(_rates(["ab" * 20]), _rates(["abcdefghij" * 2]))
    first = rows[0]
    assert first["label"].startswith("exact loop rate") and first["before"].startswith("100.0% [")
    assert any(r["strong"] and r["label"].startswith("degenerate") for r in rows)
