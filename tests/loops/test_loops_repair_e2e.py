"""A small end-to-end repair on the shared quick-trained checkpoint (tiny grid, small prompt sets)."""

import pytest
import torch

from genprobe.loops import apply_patch, load_patch, revert_patch, save_patch, state_sha256
from genprobe.loops.repair import RepairConfig, repair
from genprobe.loops.report import write_summary


@pytest.fixture(autouse=True)
def _single_thread():
    """Tiny models decode faster on one thread, and far faster on a shared, loaded machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.slow
def test_small_repair_end_to_end(trained, corpus, tmp_path):
    model, tok, _ = trained
    before = state_sha256(model)
    cfg = RepairConfig(n_direction=160, n_search=96, n_validate=64, search_prone=8, search_control=8, ks=(4, 16),
                       subtract_alphas=(0.5, 1.0), project_alphas=(1.0,), regression_windows=16, batch_size=64)
    report, patch = repair(model, tok, corpus.val, cfg)
    assert state_sha256(model) == before  # the pipeline leaves the model exactly as it found it
    s = report["search"]
    assert len(s["candidates"]) == 3 * 2 * 3  # {L0, L1, L0+L1} × k ∈ {4, 16} × (2 subtract + 1 project)
    for r in s["candidates"]:
        assert r["kl"] >= -1e-6 and len(r["columns"]) == len(r["layers"])
        assert all(len(c) == r["k"] for c in r["columns"].values())
    assert {r["layer"] for r in report["locate"]["per_layer"]} == {0, 1}
    assert report["contrast"]["loop_positions"] > 0
    if patch is None:
        assert report["verdict"].startswith("no ")
        assert "validation" not in report
    else:
        c = s["chosen"]
        assert c["kl"] <= cfg.max_kl and c["dloss"] <= cfg.max_dloss and c["loop_rate"] < s["base_loop_rate"]
        v = report["validation"]
        assert v["before"]["n"] == v["after"]["n"] == 64
        assert v["loop_prone_before"]["loop_rate"] == 1.0
        assert v["regression"]["kl"] == pytest.approx(c["kl"], abs=1e-5)  # same windows, same edit
        assert 0 < report["patch"]["fraction_changed"] < 0.01
        save_patch(patch, tmp_path / "patch")
        p = load_patch(tmp_path / "patch.json")
        assert apply_patch(model, p) == p.meta["sha256_after"]
        assert revert_patch(model, p) == before
    files = write_summary(report, tmp_path)
    assert files["png"].read_bytes()[:4] == b"\x89PNG"
    assert "Loop repair" in files["html"].read_text(encoding="utf-8")
