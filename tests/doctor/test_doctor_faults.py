"""Issue #33: ``genprobe doctor`` finds a planted fault of each kind, with the right exit status — and the same run
without the fault does not report it (so each test fails when its check is removed)."""

from __future__ import annotations

import json
import shlex
import textwrap

import pytest

from .conftest import run_cli, tiny_llama_dir


def _doctor(out) -> dict:
    return json.loads((out / "doctor.json").read_text(encoding="utf-8"))


def _finding(d: dict, check: str) -> dict:
    got = [f for f in d["findings"] if f["check"] == check]
    assert got, f"no finding {check!r} in {[f['check'] for f in d['findings']]}"
    return got[0]


def test_wrong_cache_class_is_a_bug(trained_ckpt, tmp_path, monkeypatch):
    (tmp_path / "my_cache.py").write_text(
        textwrap.dedent(
            """
            from genprobe.verify.mutants import mutant

            def broken(model):  # a cache that overwrites its history instead of appending (no_cat)
                return mutant(model, "no_cat")
            """
        ),
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "doc"
    rc = run_cli("doctor", trained_ckpt, "--quick", "--only", "inference", "--impl", "my_cache:broken", "--out", out)
    d = _doctor(out)
    assert rc == 1 and d["exit_status"] == 1 and d["verdict"] == "bug"
    bad = _finding(d, "cache.my_cache:broken")
    assert bad["severity"] == "bug" and "--impl my_cache:broken" in bad["command"]
    assert _finding(d, "cache.engine")["severity"] == "ok"  # our own engine's cache passes beside it


def test_gpt2_without_position_ids_leaks_under_left_padding(gpt2_dir, tmp_path):
    out = tmp_path / "bare"
    rc = run_cli("doctor", gpt2_dir, "--quick", "--only", "inference", "--hf-no-position-ids", "--out", out)
    d = _doctor(out)
    assert rc == 1
    leak = _finding(d, "padding.no_position_ids")
    assert leak["severity"] == "bug" and leak["evidence"]["leak"] and "--no-position-ids" in leak["command"]
    assert _finding(d, "padding.leak")["severity"] == "ok"  # with position ids from the mask it is fine
    # the same model driven with position ids: the hazard is said, not a bug
    out2 = tmp_path / "with-ids"
    assert run_cli("doctor", gpt2_dir, "--quick", "--only", "inference", "--out", out2) == 0
    d2 = _doctor(out2)
    assert _finding(d2, "padding.no_position_ids")["severity"] == "info"
    # GPT2Config's default end token (50256) does not exist in a 64-token vocabulary: said in the model card
    out3 = tmp_path / "card"
    assert run_cli("doctor", gpt2_dir, "--only", "card", "--out", out3) == 4
    assert _finding(_doctor(out3), "generation.eos")["evidence"]["generation_eos"] == [50256]


@pytest.mark.parametrize(("pad", "severity", "rc"), [("</s>", "warning", 4), ("<pad>", "ok", 0)])
def test_end_of_text_equal_to_padding_warns(tmp_path, pad, severity, rc):
    d = tiny_llama_dir(tmp_path / "llama", eos="</s>", pad=pad)
    out = tmp_path / "doc"
    prompts = ("Hello world.", "A second, longer prompt")
    assert run_cli("doctor", d, "--only", "card", "--prompt", *prompts, "--out", out) == rc
    f = _finding(_doctor(out), "tokenizer.eos_pad")
    assert f["severity"] == severity and f["evidence"]["eos"]["id"] is not None


def test_lossy_tokenizer_round_trip_is_a_bug(tmp_path):
    d = tiny_llama_dir(tmp_path / "llama", lowercase=True)
    out = tmp_path / "doc"
    assert run_cli("doctor", d, "--only", "card", "--prompt", "Hello World", "--out", out) == 1
    f = _finding(_doctor(out), "tokenizer.round_trip")
    assert f["severity"] == "bug" and f["evidence"]["failures"][0]["decoded"] == "hello world"


def test_model_that_loops_on_every_prompt_warns(looping_ckpt, trained_ckpt, tmp_path):
    args = ("--quick", "--only", "degeneration", "--temperature", "1.0")
    out = tmp_path / "loops"
    assert run_cli("doctor", looping_ckpt, *args, "--out", out) == 4
    d = _doctor(out)
    for check in ("loops.greedy", "loops.your sampler"):
        f = _finding(d, check)
        assert f["severity"] == "warning" and "every generation degenerates" in f["title"]
        assert f["evidence"]["degenerate_rate"] == 1.0 and f["evidence"]["human_fpr"] is not None
    assert "--setting sample --temperature 1.0" in _finding(d, "loops.your sampler")["command"]
    # the trained model does not loop on every prompt when it samples
    out2 = tmp_path / "trained"
    run_cli("doctor", trained_ckpt, *args, "--out", out2)
    assert _finding(_doctor(out2), "loops.your sampler")["severity"] != "warning"


def test_max_loop_rate_turns_a_rate_into_a_warning(trained_ckpt, tmp_path):
    out = tmp_path / "gate"
    args = ("--quick", "--only", "degeneration", "--temperature", "1.0", "--max-loop-rate")
    assert run_cli("doctor", trained_ckpt, *args, "0", "--out", out) == 4
    assert _finding(_doctor(out), "loops.your sampler")["severity"] in ("warning", "ok")
    assert "--max-loop-rate 0" in _finding(_doctor(out), "loops.your sampler")["criterion"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--max-loop-rate", "1.5"), "(--max-loop-rate) must be in [0, 1]"),
        (("--chat",), "no chat template"),
        (("--with-edit", "--quick"), "quick mode leaves out"),
        (("--prompts", "/nonexistent/prompts.txt"), "prompt file not found"),
        (("--prompt", "白日依山盡" * 20), "context length 64"),  # 100 tokens + the scan's > the 64-token context
    ],
)
def test_bad_input_is_exit_2(trained_ckpt, tmp_path, extra, says, capsys):
    assert run_cli("doctor", trained_ckpt, *extra, "--out", tmp_path / "doc") == 2
    assert says in capsys.readouterr().err


def test_every_reproducing_command_parses(trained_ckpt, tmp_path):
    from genprobe.cli import build_parser

    out = tmp_path / "doc"
    run_cli("doctor", trained_ckpt, "--quick", "--temperature", "0.8", "--out", out)
    parser = build_parser()
    commands = [f["command"] for f in _doctor(out)["findings"] if f["command"]]
    assert len(commands) >= 8
    for cmd in commands:
        words = shlex.split(cmd)
        assert words[0] == "genprobe"
        parser.parse_args(words[1:])  # exits (SystemExit) on an unknown flag or a bad value


class _FakeServing:
    def __init__(self, verdict: str):
        self.verdict = verdict

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "verdict_by_dtype": {"float32": self.verdict}, "phases": [], "errors": []}


@pytest.mark.parametrize(("verdict", "rc"), [("bug", 1), ("pass", 0)])
def test_serving_engine_disagreeing_is_a_bug(trained_ckpt, tmp_path, monkeypatch, verdict, rc):
    """vLLM's own run is tests/serving's (minutes of engine start-up); here its report decides the verdict."""
    import genprobe.serving.verify as sv

    calls = []
    monkeypatch.setattr("genprobe.doctor.inference.vllm_installed", lambda: True)
    monkeypatch.setattr(sv, "verify_serving", lambda *a, **k: calls.append(k) or _FakeServing(verdict))
    out = tmp_path / "doc"
    args = ("--quick", "--only", "inference", "--serving", "vllm", "--out", out)
    assert run_cli("doctor", trained_ckpt, *args) == rc
    f = _finding(_doctor(out), "serving.vllm")
    assert f["severity"] == ("bug" if verdict == "bug" else "ok") and calls[0]["dtypes"] == ("float32",)
    assert f["command"].startswith("genprobe verify-serving ")


def test_serving_without_the_extra_is_said(trained_ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr("genprobe.doctor.inference.vllm_installed", lambda: False)
    out = tmp_path / "doc"
    assert run_cli("doctor", trained_ckpt, "--quick", "--only", "inference", "--serving", "vllm", "--out", out) == 0
    f = _finding(_doctor(out), "serving.vllm")
    assert f["severity"] == "info" and "not installed" in f["title"]
    assert "not installed" in (out / "report.html").read_text(encoding="utf-8")


def test_user_code_errors_are_reported_not_raised(trained_ckpt, tmp_path, monkeypatch, capsys):
    (tmp_path / "raising_cache.py").write_text("def factory(model):\n    raise RuntimeError('my bug')\n")
    (tmp_path / "broken_module.py").write_text("raise ImportError('half-installed dependency')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "doc"
    args = ("--quick", "--only", "inference", "--out", out)
    assert run_cli("doctor", trained_ckpt, *args, "--impl", "raising_cache:factory") == 1
    f = _finding(_doctor(out), "cache.raising_cache:factory")
    assert f["severity"] == "bug" and "RuntimeError" in f["title"] and "my bug" in f["title"]
    assert run_cli("doctor", trained_ckpt, *args, "--impl", "broken_module:factory") == 2
    assert "half-installed dependency" in capsys.readouterr().err
    assert run_cli("doctor", trained_ckpt, *args, "--impl", "raising_cache") == 2


@pytest.mark.parametrize(("preset", "engine"), [("llama.cpp", "llama.cpp"), (None, None)])
def test_which_fix_runs_the_fixes_as_the_users_engine_does(trained_ckpt, tmp_path, monkeypatch, preset, engine):
    """The fixes compared are the ones the user's engine offers, run with that engine's semantics (its preset)."""
    import genprobe.doctor.fixes as fixes

    seen = []

    def fake_compare(model, prompts, cfg, **kw):
        seen.append(cfg)
        raise RuntimeError("stop after the configuration")  # the stage error is reported, the run goes on

    monkeypatch.setattr(fixes, "compare_fixes", fake_compare)
    extra = ("--preset", preset) if preset else ()
    run_cli("doctor", trained_ckpt, "--only", "fixes", *extra, "--out", tmp_path / "doc")
    assert seen and seen[0].engine == engine
    assert set(seen[0].methods) == {"greedy", *fixes.ENGINE_METHODS[preset or "genprobe"]}
