"""Issue #29: ``loops scan`` goes through ``genprobe.scan_loop_settings``; the library gives what the CLI prints."""

from __future__ import annotations

import json

import genprobe
from genprobe.cli import main


def test_scan_loop_settings_gives_what_loops_scan_prints(trained_ckpt, capsys):
    argv = ["loops", "scan", str(trained_ckpt), "--n", "6", "--max-new-tokens", "20", "--no-calibrate", "--json"]
    assert main(argv) == 0
    cli = json.loads(capsys.readouterr().out)
    model = genprobe.load(trained_ckpt)
    from genprobe.corpus.inputs import heldout_openings
    from genprobe.loops.scan import ScanOptions

    seen = []
    res = genprobe.scan_loop_settings(
        model,
        heldout_openings(model.tokenizer, 6, 5),
        options=ScanOptions(20),
        chars_unit=True,
        prompt_source="tang-heldout-openings",
        on_scan=lambda name, r, s: seen.append(name),
    )
    assert isinstance(res, genprobe.LoopScans) and seen == ["chanting", "greedy"] == list(res.scans)
    lib = res.to_dict(with_records=False)
    assert lib["model"] == cli["model"] and lib["prompts"] == cli["prompts"] == 6
    for name in ("chanting", "greedy"):
        assert lib["scans"][name]["summary"] == cli["scans"][name]["summary"]
        assert lib["scans"][name]["examples"] == cli["scans"][name]["examples"]
    assert lib == cli
    # one setting: scan_loops is scan_loop_settings with the default sampler
    one = genprobe.scan_loops(model, heldout_openings(model.tokenizer, 6, 5), max_new_tokens=20)
    chanting = res.scans["chanting"].summary
    assert (one.summary.degenerate_rate, one.summary.loop_rate) == (chanting.degenerate_rate, chanting.loop_rate)
