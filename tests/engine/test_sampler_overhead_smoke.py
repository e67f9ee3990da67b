"""The sampler-overhead benchmark runs end to end (tiny checkpoint, one repetition) and reports every ratio."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "sampler_overhead.py"


def test_sampler_overhead_benchmark_smoke(tmp_path, tiny_model, capsys):
    from genprobe.corpus.tokenizer import CharTokenizer
    from genprobe.model.checkpoint import save_checkpoint

    chars = list("白日依山盡，黃河入海流") + [chr(0x4E00 + i) for i in range(37)]
    ck = save_checkpoint(tmp_path / "ck", tiny_model, CharTokenizer(chars))
    spec = importlib.util.spec_from_file_location("sampler_overhead", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--ckpt", str(ck), "--reps", "1", "--new-tokens", "6", "--history", "32", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    gen = d["generation"]
    assert gen["tokens_agree"]["greedy"] is True and gen["tokens_agree"]["rep"] is True
    assert all(v > 0 for v in gen["ms_per_token"].values())
    assert {"ours_dry_over_ours_greedy", "ours_contrastive_over_ours_greedy"} <= set(gen["ratios"])
    assert d["processors"][0]["history"] == 32 and d["processors"][0]["ours_dry_over_hf_rep"] > 0
