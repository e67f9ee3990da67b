"""The speed benchmark runs end to end (tiny checkpoint, tiny settings) and its engines agree."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def ckpt(tmp_path, tiny_model):
    from genprobe.corpus.tokenizer import CharTokenizer
    from genprobe.model.checkpoint import save_checkpoint

    chars = list("白日依山盡，黃河入海流") + [chr(0x4E00 + i) for i in range(37)]
    return save_checkpoint(tmp_path / "ck", tiny_model, CharTokenizer(chars))


def _has_ct2() -> bool:
    return importlib.util.find_spec("ctranslate2") is not None


def _speed_argv(ckpt, out, batches: list[str], engines: list[str]) -> list[str]:
    """generate_speed.py's arguments for a smoke run: 2 repetitions of 6 tokens, JSON, its files under ``out``."""
    fixed = ["--ckpt", str(ckpt), "--out", str(out), "--reps", "2", "--new-tokens", "6", "--json"]
    return [*fixed, "--batch", *batches, "--engines", *engines]


def test_generate_speed_benchmark_smoke(ckpt, tmp_path, capsys):
    """Every engine but vLLM (its CPU kernels have no head size 16, and tests/serving covers it), at one batch size:
    each compiled engine is a build of its own per batch size (the rows per batch size: the test below)."""
    mod = _load("generate_speed")
    engines = [e for e in mod.ENGINES if e != "vllm" and (e not in ("ct2", "ct2-1t") or _has_ct2())]
    assert mod.main(_speed_argv(ckpt, tmp_path / "o", ["1"], engines)) == 0
    cap = capsys.readouterr()
    d = json.loads(cap.out)
    assert [r["batch"] for r in d["rows"]] == [1]
    ct2 = importlib.util.find_spec("ctranslate2") is not None
    narrow = {"cached-bf16", "compiled-bf16", "cached-int8", "compiled-int8"}  # opt-in engines, named explicitly
    expected = {"cached", "compiled", "naive", "hf"} | narrow | ({"ct2", "ct2-1t"} if ct2 else set())
    for r in d["rows"]:
        # weight-only engines: checked against their own eager engine; their match with the float32 model reported
        assert set(r["opt_in_tokens_matching_float32"]) == narrow
        assert all(0.0 <= v <= 1.0 for v in r["opt_in_tokens_matching_float32"].values())
        assert "compiled-bf16/hf" in r["ratios"] and "compiled-int8/hf" in r["ratios"]
        assert set(r["tokens_per_s"]) == expected and all(v > 0 for v in r["tokens_per_s"].values())
        assert r["all_agree"] is True and set(r["greedy_tokens_agree"]) == expected
        assert set(r["ttft_ms"]) == expected and all(v > 0 for v in r["ttft_ms"].values())
        assert all(len(s["wall"]) == 2 for s in r["series"].values())  # interleaved repetitions, all kept
        assert "compiled/hf" in r["ratios"] and ("compiled/ct2" in r["ratios"]) == ct2
        assert set(r["memory_mb"]) == expected
    assert "2 repetition(s)" in cap.err  # fewer than 3: the benchmark says a busy repetition can decide
    assert (tmp_path / "o" / "speed-default.json").exists()
    assert "| batch |" in (tmp_path / "o" / "speed-default.md").read_text()


def test_generate_speed_gives_a_row_per_batch_size(ckpt, tmp_path, capsys):
    """Each batch size is a row of its own, its engines rebuilt for it and their tokens checked at that size; with
    engines that compile nothing (a weight-only one among them, checked against its own eager engine)."""
    mod = _load("generate_speed")
    engines = {"cached", "naive", "hf", "cached-int8"}
    assert mod.main(_speed_argv(ckpt, tmp_path / "o", ["1", "3"], sorted(engines))) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["batch"] for r in d["rows"]] == [1, 3]
    for r in d["rows"]:
        assert set(r["tokens_per_s"]) == engines and all(v > 0 for v in r["tokens_per_s"].values())
        assert r["all_agree"] is True and set(r["greedy_tokens_agree"]) == engines
        assert set(r["opt_in_tokens_matching_float32"]) == {"cached-int8"} and set(r["memory_mb"]) == engines
        assert all(len(s["wall"]) == 2 for s in r["series"].values())
    table = (tmp_path / "o" / "speed-default.md").read_text()
    assert "| 1 |" in table and "| 3 |" in table


def test_generate_speed_scaling_writes_table_and_plot(ckpt, tmp_path, capsys):
    mod = _load("generate_speed")
    out = tmp_path / "o"
    argv = [
        "--ckpt",
        str(ckpt),
        "--batch",
        "2",
        "--reps",
        "1",
        "--new-tokens",
        "4",
        "--engines",
        "cached",
        "compiled",
        "hf",
        "--no-memory",
        "--scaling",
        "--scaling-batches",
        "1",
        "2",
        "--contexts",
        "12",
        "32",
        "--out",
        str(out),
        "--json",
    ]
    assert mod.main(argv) == 0
    d = json.loads(capsys.readouterr().out)["scaling"]
    assert [r["batch"] for r in d["batch"]] == [1, 2] and [r["context"] for r in d["context"]] == [12, 32]
    for r in d["batch"]:
        assert set(r["tokens_per_s"]) == {"cached", "compiled", "hf"}
    assert (out / "scaling-default.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| context |" in (out / "scaling-default.md").read_text()


def test_busy_spread_flags_one_slow_repetition_without_letting_it_decide_the_median():
    stats = _load("bench_stats")
    s = stats.Series(wall=[1.0, 1.02, 3.0], cpu=[1.0, 1.0, 1.0])
    assert s.median == 1.02 and s.best == 1.0 and not s.busy  # one busy repetition: the median ignores it
    s = stats.Series(wall=[1.0, 1.6, 1.7], cpu=[1.0, 1.0, 1.0])
    assert s.busy  # most repetitions disturbed: flagged


def test_profile_breaks_a_step_down_per_engine(ckpt, tmp_path, capsys):
    prof = _load("bench_profile")
    argv = [
        "--ckpt",
        str(ckpt),
        "--batch",
        "2",
        "--reps",
        "1",
        "--new-tokens",
        "5",
        "--engines",
        "cached",
        "compiled",
        "--out",
        str(tmp_path),
    ]
    assert prof.main(argv) == 0
    d = json.loads((tmp_path / "profile-default-b2.json").read_text())
    assert set(d["engines"]) == {"cached", "compiled"} and all(c["step_us"] != 0 for c in d["engines"].values())
    model = _load("generate_speed").load_bundle("default", str(ckpt))[0].model
    assert d["roofline"]["weight_bytes"] == 4 * sum(p.numel() for p in model.parameters())  # float32 weights
    assert any("addmm" in o["op"] or "mm" in o["op"] for o in d["eager_top_ops"])
    assert "step" in capsys.readouterr().out


def test_alternating_processes_give_one_ratio_per_round_and_their_median(ckpt, tmp_path, capsys):
    """bench_alternate.py: one generate_speed.py process per group per round, ratios per round, median of them."""
    mod = _load("bench_alternate")
    argv = ["--rounds", "2", "--group", "cached", "--group", "hf", "--ours", "cached", "--out", str(tmp_path)]
    argv += ["--", "--ckpt", str(ckpt), "--batch", "1", "2", "--reps", "1", "--new-tokens", "4"]
    assert mod.main(argv) == 0
    out = capsys.readouterr().out
    assert "round 1:" in out and "round 2:" in out and "round 3:" not in out and "| 1 |" in out and "| 2 |" in out
    d = json.loads((tmp_path / "alternate-default.json").read_text())
    assert len(d["rounds"]) == 2 and set(d["median_ratio"]) == {"1", "2"}
    assert set(d["versus"]) == {"cached/hf"}  # ours against transformers alone, from the same rounds
    for merged in d["rounds"]:  # both processes' engines landed in every round's rows
        assert all(set(speeds) == {"cached", "hf"} for speeds in merged.values())
    r1 = [m["1"]["cached"] / m["1"]["hf"] for m in d["rounds"]]
    assert d["median_ratio"]["1"] == pytest.approx(sorted(r1)[0] / 2 + sorted(r1)[1] / 2)
    with pytest.raises(SystemExit, match="exactly one"):
        mod.main(["--group", "cached hf", "--ours", "cached"])


def test_engines_rated_beside_ours_are_not_its_peers(tmp_path, monkeypatch, capsys):
    """--versus compiled-bf16: rated against the same peers as --ours, and never counted as one of ours' peers
    (our own approximation beating our float32 path says nothing about CTranslate2)."""
    mod = _load("bench_alternate")
    speeds = {"compiled": 100.0, "compiled-bf16": 180.0, "ct2": 80.0, "hf": 50.0}
    monkeypatch.setattr(mod, "run_group", lambda model, engines, passthrough: {1: {e: speeds[e] for e in engines}})
    groups = ["--group", "compiled", "--group", "compiled-bf16", "--group", "ct2", "--group", "hf"]
    assert mod.main(["--rounds", "3", *groups, "--versus", "compiled-bf16", "--out", str(tmp_path)]) == 0
    d = json.loads((tmp_path / "alternate-default.json").read_text())
    assert d["median_ratio"] == {"1": pytest.approx(100 / 80)}  # against ct2 (the best peer), not compiled-bf16
    assert d["versus"] == {
        "compiled/hf": {"1": pytest.approx(2.0)},
        "compiled-bf16": {"1": pytest.approx(180 / 80)},
        "compiled-bf16/hf": {"1": pytest.approx(3.6)},
    }
    assert "compiled / best of ct2, hf per round" in capsys.readouterr().out


def test_a_process_with_one_engine_still_checks_its_tokens(tiny_model):
    """With no eager engine timed beside it, the reference tokens are generated untimed: a wrong engine shows."""
    mod = _load("generate_speed")
    from bench_engines import Bundle

    from genprobe.engine.generate import generate

    bundle = Bundle(tiny_model, None, "tiny")
    prompts, n = [[3, 4, 5], [6, 7, 8]], 5
    right = generate(tiny_model, prompts, n, compile=True).tokens
    wrong = [[(t + 1) % tiny_model.cfg.vocab_size for t in row] for row in right]
    refs = mod.reference_tokens(bundle, prompts, n, {"compiled": right})
    assert mod.same_tokens(right, refs["cached"], 2, n) and not mod.same_tokens(wrong, refs["cached"], 2, n)
    refs = mod.reference_tokens(bundle, prompts, n, {"compiled-bf16": right})  # its own model's eager tokens
    assert refs["cached-bf16"] == generate(bundle.bf16(), prompts, n).tokens
    refs = mod.reference_tokens(bundle, prompts, n, {"compiled-int8": right, "compiled": right})
    assert set(refs) == {"cached", "cached-int8"}
    assert refs["cached-int8"] == generate(bundle.narrow("int8"), prompts, n).tokens
