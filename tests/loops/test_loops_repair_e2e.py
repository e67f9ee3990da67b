"""A small end-to-end repair on the shared quick-trained checkpoint (tiny grid, small prompt sets)."""

import json

import pytest
import torch

from genprobe._io import json_safe
from genprobe.loops.pages import write_summary
from genprobe.loops.patch import apply_patch, load_patch, revert_patch, save_patch
from genprobe.loops.repair import repair
from genprobe.loops.study import RepairConfig, RepairInputs
from genprobe.model.arch import state_sha256
from genprobe.model.load import load_model


@pytest.fixture(autouse=True)
def _single_thread():
    """Tiny models decode faster on one thread, and far faster on a shared, loaded machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.slow
def test_small_repair_end_to_end(trained_ckpt, tmp_path):
    model = load_model(trained_ckpt)
    before = state_sha256(model.module)
    cfg = RepairConfig(
        n_direction=160,
        n_search=96,
        n_validate=64,
        search_prone=8,
        search_control=8,
        ks=(4, 16),
        subtract_alphas=(0.5, 1.0),
        project_alphas=(1.0,),
        regression_windows=16,
        batch_size=64,
    )
    report, patch = repair(model, RepairInputs.tang(model.tokenizer, cfg), cfg)
    assert state_sha256(model.module) == before  # the pipeline leaves the model exactly as it found it
    s = report.search
    assert len(s.candidates) == 3 * 2 * 3  # {L0, L1, L0+L1} × k ∈ {4, 16} × (2 subtract + 1 project)
    for c in s.candidates:
        assert c.regression.kl >= -1e-6 and len(c.columns) == len(c.spec.layers)
        assert all(len(cols) == c.spec.k for cols in c.columns.values())
    assert {a.layers[0] for a in report.locate.per_layer} == {0, 1}
    assert report.contrast.loop_positions > 0
    assert not report.end_token.banned  # the char vocabulary has no end token
    data = json_safe(report)
    json.dumps(data, allow_nan=False)  # repair.json is strict JSON
    if patch is None:
        assert report.verdict.startswith("no ") and (report.validation is None or not report.validation.significant)
    else:
        c = s.chosen
        assert c.regression.kl <= cfg.max_kl and c.regression.dloss <= cfg.max_dloss
        assert c.objective.degenerate_rate < s.baseline.degenerate_rate  # what decided: exact, near or repetitive
        v = report.validation
        assert v.before.n == v.after.n == 64
        assert v.loop_prone_before.degenerate_rate == 1.0
        assert v.before.chars is not None and v.before.chars.n == 64  # character-level figures beside tokens
        assert v.regression.kl == pytest.approx(c.regression.kl, abs=1e-5)  # same windows, same edit
        assert 0 < report.patch.fraction_changed < 0.01
        save_patch(patch, tmp_path / "patch")
        p = load_patch(tmp_path / "patch.json")
        assert apply_patch(model.module, p) == p.meta["sha256_after"]
        assert revert_patch(model.module, p) == before
    files = write_summary(data, tmp_path)
    assert files["png"].read_bytes()[:4] == b"\x89PNG"
    html = files["html"].read_text(encoding="utf-8")
    assert "Loop repair" in html and "near-loop rate" in html
