"""Search choice rule and limits (fake evaluator), scan aggregation, prompt sets, contrast labels, CLI apply/revert."""

import json

import pytest
import torch

from genprobe.loops import EditSpec, finalise, make_patch, mlp_sites, save_patch, state_sha256
from genprobe.loops.contrast import _labels
from genprobe.loops.search import Limits, choose, grid, run_search
from genprobe.loops.scan import scan_loops, summarise
from genprobe.metrics import detect_loop


@pytest.fixture(autouse=True)
def _single_thread():
    """Tiny models decode faster on one thread, and far faster on a shared, loaded machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _r(loop_rate, kl, dloss, changed=100, **kw):
    return {"loop_rate": loop_rate, "kl": kl, "dloss": dloss, "weights_changed": changed, **kw}


def test_choose_best_admissible_and_limits():
    lim = Limits(max_kl=0.1, max_dloss=0.02)
    rs = [
        _r(0.00, 0.50, 0.001, tag="too much KL"),
        _r(0.01, 0.05, 0.030, tag="too much loss"),
        _r(0.10, 0.09, 0.019, tag="ok but worse"),
        _r(0.05, 0.02, 0.010, changed=400, tag="best, big"),
        _r(0.05, 0.03, 0.010, changed=100, tag="best, small"),
        _r(None, 0.01, 0.0, tag="not measured"),
    ]
    assert choose(rs, base_loop_rate=0.3, limits=lim)["tag"] == "best, small"
    # boundaries are inclusive
    assert choose([_r(0.1, 0.1, 0.02)], 0.3, lim) is not None
    # nothing better than the baseline within the limits -> None ("no edit passed the limits")
    assert choose([_r(0.3, 0.01, 0.0), _r(0.0, 0.2, 0.0)], 0.3, lim) is None
    assert choose([], 0.3, lim) is None


def test_grid_size_and_validation():
    specs = grid([(0,), (1,), (0, 1)], [8, 32], ["subtract", "project"], {"subtract": [1, 2, 3, 4, 5], "project": [.1, .2, .3, .4, .5]})
    assert len(specs) == 3 * 2 * 2 * 5
    with pytest.raises(ValueError, match="no alpha grid"):
        grid([(0,)], [8], ["project"], {"subtract": [1.0]})
    with pytest.raises(ValueError, match="edit form"):
        EditSpec((0,), 4, "scale", 1.0)


def test_run_search_with_fake_evaluator_restores_model(tiny_model):
    sites = mlp_sites(tiny_model)
    torch.manual_seed(0)
    dirs = {l: torch.randn(s.d_model) for l, s in enumerate(sites)}
    units = {l: torch.rand(s.d_ff) for l, s in enumerate(sites)}
    before = state_sha256(tiny_model)
    seen = []

    def fake_eval(m):
        # a fake "loop rate" that falls with the amount of edit, and a KL that grows with it
        w = sites[0].down.weight.detach()
        delta = float((w - w0).abs().sum())
        seen.append(state_sha256(m))
        return {"loop_rate": max(0.0, 0.5 - delta), "kl": delta / 4, "dloss": 0.0}

    w0 = sites[0].down.weight.detach().clone()
    specs = grid([(0,), (1,)], [4], ["subtract"], {"subtract": [0.01, 0.05, 0.1, 0.5, 2.0]})
    res = run_search(tiny_model, specs, dirs, units, fake_eval)
    assert state_sha256(tiny_model) == before  # every candidate reverted exactly
    assert len(set(seen)) == len(specs)  # each candidate really evaluated an edited model
    best = choose(res, 0.5, Limits(max_kl=0.1, max_dloss=0.02))
    admissible = [r for r in res if r["kl"] <= 0.1]
    assert best["loop_rate"] == min(r["loop_rate"] for r in admissible)
    assert best["kl"] <= 0.1 and best["layers"] == [0]
    assert max(r["kl"] for r in res) > 0.1  # the limit really excluded something


def test_summarise_rates_and_histograms():
    recs = []
    for toks in ([1, 2, 3] + [7, 8] * 10, [5] * 3 + list(range(100, 110)) * 3, list(range(40)), list(range(50, 90))):
        info = detect_loop(toks)
        recs.append({"looping": info.looping, "period": info.period, "onset": info.onset, "hit_limit": True,
                     "distinct_2": 0.5, "seq_rep_4": 0.1, "longest_repeat": 3})
    s = summarise(recs)
    assert s["loops"] == 2 and s["loop_rate"] == 0.5
    assert s["short_loops"] == 1 and s["long_loops"] == 1  # period 2 vs period 10
    assert s["period_hist"] == {"2": 1, "10": 1}
    assert s["onset_hist"] == {"0-7": 2}
    lo, hi = s["loop_rate_ci95"]
    assert lo < 0.5 < hi


def test_scan_on_tiny_model_batches_consistently(tiny_model):
    prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11], [12]]
    a = scan_loops(tiny_model, prompts, 20, batch_size=4)
    b = scan_loops(tiny_model, prompts, 20, batch_size=1)
    assert [r["tokens"] for r in a.records] == [r["tokens"] for r in b.records]
    assert a.summary["n"] == 4 and all(len(r["tokens"]) == 20 for r in a.records)
    for r in a.records:
        assert r["looping"] == detect_loop(r["tokens"]).looping


def test_contrast_labels():
    rec = {"looping": True, "onset": 3, "period": 2}
    # prompt of 2 tokens + 9 generated: position t predicts generated index t+1-2
    loop, ref = _labels(2, 11, rec)
    assert ref == [1, 2, 3]  # predicts generated 0,1,2 (before onset)
    assert loop == [6, 7, 8, 9]  # predicts generated 5.. (after the first unit)
    loop, ref = _labels(2, 6, {"looping": False})
    assert loop == [] and ref == [1, 2, 3, 4]


def test_heldout_prompt_sets_are_disjoint_and_in_vocab(tokenizer, corpus):
    from genprobe.loops.prompts import prompt_sets

    sets = prompt_sets(tokenizer, {"a": 40, "b": 30, "c": 30})
    allp = sets["a"] + sets["b"] + sets["c"]
    assert len(set(allp)) == 100
    assert all(len(p) == 5 and all(ch in tokenizer.stoi for ch in p) for p in allp)
    assert not any(p in corpus.text for p in allp)  # never seen verbatim in training or validation text


def test_cli_apply_revert_roundtrip_and_refusal(tiny_cfg, corpus, tmp_path, capsys):
    from genprobe.cli import main
    from genprobe.corpus import CharTokenizer
    from genprobe.model import GPT
    from genprobe.model.checkpoint import load_checkpoint, save_checkpoint
    from genprobe._io import sha256_file

    tok = CharTokenizer.from_text(corpus.text, tiny_cfg.vocab_size - 2)
    torch.manual_seed(0)
    model = GPT(tiny_cfg).eval()
    save_checkpoint(tmp_path / "orig", model, tok, {"note": "tiny"})
    torch.manual_seed(3)
    dirs = {0: torch.randn(32), 1: torch.randn(32)}
    units = {0: torch.rand(64), 1: torch.rand(64)}
    patch = finalise(model, make_patch(model, EditSpec((0, 1), 5, "project", 1.0), dirs, units))
    save_patch(patch, tmp_path / "p")
    assert main(["loops", "apply", str(tmp_path / "orig"), str(tmp_path / "p.json"), "--out", str(tmp_path / "new"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["state_sha256"] == patch.meta["sha256_after"]
    m2, _, meta = load_checkpoint(tmp_path / "new")
    assert state_sha256(m2) == patch.meta["sha256_after"] and meta["summary"]["loop_patch"]["edit"]["form"] == "project"
    # applying twice is refused (exit 2, message names both hashes)
    assert main(["loops", "apply", str(tmp_path / "new"), str(tmp_path / "p.json"), "--in-place"]) == 2
    err = capsys.readouterr().err
    assert patch.meta["sha256_before"] in err and patch.meta["sha256_after"] in err
    assert main(["loops", "revert", str(tmp_path / "new"), str(tmp_path / "p.json"), "--out", str(tmp_path / "back")]) == 0
    m3, _, _ = load_checkpoint(tmp_path / "back")
    assert state_sha256(m3) == state_sha256(model) == patch.meta["sha256_before"]
    assert sha256_file(tmp_path / "back" / "model.safetensors") == sha256_file(tmp_path / "orig" / "model.safetensors")
    # reverting the original (unpatched) checkpoint is refused
    assert main(["loops", "revert", str(tmp_path / "orig"), str(tmp_path / "p.json"), "--in-place"]) == 2


def test_cli_scan_both_settings(trained_ckpt, capsys, tmp_path):
    from genprobe.cli import main

    assert main(["loops", "scan", "--ckpt", str(trained_ckpt), "--n", "12", "--new-tokens", "24", "--json",
                 "--out", str(tmp_path / "scan.json")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["scans"]) == {"chanting", "greedy"}
    for s in out["scans"].values():
        assert s["summary"]["n"] == 12 and 0.0 <= s["summary"]["loop_rate"] <= 1.0
    full = json.loads((tmp_path / "scan.json").read_text(encoding="utf-8"))
    recs = full["scans"]["chanting"]["records"]
    assert len(recs) == 12 and all(1 not in r["tokens"] for r in recs)  # <unk> banned in the chanting setting
    assert main(["loops", "scan", "--ckpt", str(trained_ckpt), "--new-tokens", "5"]) == 2
    assert "--new-tokens must be >= 16" in capsys.readouterr().err


def test_summary_files_without_an_edit(tmp_path):
    from genprobe.loops.report import write_summary

    cands = [{"form": f, "layers": [0], "k": 4, "alpha": a, "loop_rate": lr, "kl": kl, "dloss": 0.0}
             for f in ("subtract", "project") for a, lr, kl in ((0.5, 0.2, 0.01), (1.0, None, 0.5))]
    report = {
        "verdict": "no edit passed the limits", "sampler": {"greedy": True},
        "locate": {"base_loop_rate": 0.3, "per_layer": [{"layer": 0, "loop_rate": 0.25}], "ranking": [0]},
        "search": {"candidates": cands, "limits": {"max_kl": 0.1, "max_dloss": 0.02}, "base_loop_rate": 0.1,
                   "chosen": None, "admissible": 2},
    }
    files = write_summary(report, tmp_path)
    assert files["png"].read_bytes()[:4] == b"\x89PNG"
    html = files["html"].read_text(encoding="utf-8")
    assert "no edit passed the limits" in html and "Chosen edit" not in html
