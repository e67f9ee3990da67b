"""The speed benchmark runs end to end (tiny checkpoint, one repetition) and its four engines agree."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "generate_speed.py"


def test_generate_speed_benchmark_smoke(tmp_path, tiny_model, capsys):
    from genprobe.corpus import CharTokenizer
    from genprobe.model.checkpoint import save_checkpoint

    ck = save_checkpoint(tmp_path / "ck", tiny_model, CharTokenizer(list("白日依山盡，黃河入海流") + [chr(0x4E00 + i) for i in range(37)]))
    spec = importlib.util.spec_from_file_location("generate_speed", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--ckpt", str(ck), "--batch", "1", "3", "--reps", "1", "--new-tokens", "6", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["batch"] for r in d["rows"]] == [1, 3]
    for r in d["rows"]:
        assert r["greedy_tokens_agree"] is True
        assert set(r["tokens_per_s"]) == {"cached", "compiled", "naive", "hf"} and all(v > 0 for v in r["tokens_per_s"].values())
