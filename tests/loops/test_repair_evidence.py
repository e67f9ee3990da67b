"""Issue #46: a repair verdict no larger than its evidence — sets too small for any significant change are refused
up front with the minimum sizes, and an edit whose held-out change is not significant writes no patch."""

from __future__ import annotations

import pytest

from genprobe._io import json_safe
from genprobe.metrics.stats import ALPHA, MIN_PAIRS, sign_test_p

from ..doctor.conftest import run_cli


def test_sign_test_threshold_is_six_pairs():
    assert sign_test_p(MIN_PAIRS, 0) < ALPHA <= sign_test_p(MIN_PAIRS - 1, 0)  # 0.031 < 0.05 <= 0.0625
    assert sign_test_p(0, 0) == 1.0 and sign_test_p(3, 3) == 1.0
    assert sign_test_p(7, 1) == pytest.approx(2 * 9 / 256)  # C(8,0) + C(8,1) over 2^8, both tails


@pytest.mark.parametrize(("flag", "named"), [("--n-validate", "--n-validate 1:"), ("--n-search", "--n-search 1:")])
def test_repair_refuses_sets_too_small_for_significance(trained_ckpt, tmp_path, capsys, flag, named):
    sizes = {"--n-direction": "8", "--n-search": "8", "--n-validate": "8"} | {flag: "1"}
    args = [a for kv in sizes.items() for a in kv]
    assert run_cli("loops", "repair", trained_ckpt, *args, "--out", tmp_path / "r") == 2
    err = capsys.readouterr().err
    assert (
        named in err
        and "--n-validate 6" in err
        and "significant" in err
        and not (tmp_path / "r" / "patch.json").exists()
    )


@pytest.mark.parametrize(("fixed", "new", "p_value", "written"), [(0, 0, 1.0, False), (6, 0, 0.031, True)])
def test_only_a_significant_held_out_change_writes_a_patch(trained_ckpt, monkeypatch, fixed, new, p_value, written):
    """The issue's held-out rates 1.000 → 1.000: an edit that passed the limits but changed nothing held out (the
    search's choice and the validation's counts are forced, so that the gate is what is tested)."""
    import genprobe.loops.repair as rp
    from genprobe.loops.repair import repair
    from genprobe.loops.study import RepairConfig, RepairInputs
    from genprobe.model.load import load_model

    real = rp.validate_stage

    def counted(study, patch, before, texts, probe):
        v = real(study, patch, before, texts, probe)
        v.fixed, v.new_loops, v.p_value = fixed, new, p_value
        return v

    monkeypatch.setattr(rp, "validate_stage", counted)
    monkeypatch.setattr(rp, "choose", lambda cands, baseline, limits: next((c for c in cands if c.objective), None))
    model = load_model(trained_ckpt)
    cfg = RepairConfig(
        n_direction=16,
        n_search=8,
        n_validate=6,
        max_new_tokens=16,
        search_prone=4,
        search_control=4,
        ks=(4,),
        forms=("subtract",),
        subtract_alphas=(1.0,),
        regression_windows=4,
        transfer=0,
        plain_greedy_check=0,
        max_kl=10.0,  # every edit admitted: the held-out evidence alone decides
        max_dloss=10.0,
    )
    report, patch = repair(model, RepairInputs.tang(model.tokenizer, cfg), cfg)
    if report.search.chosen is None:
        pytest.skip(report.verdict)
    assert (patch is not None) == written
    assert report.verdict.startswith("no significant change") != written
    assert json_safe(report)["validation"]["significant"] is written
