"""Loop scans carry their calibration: human false-positive rates beside every rate, the character view only where
characters are the unit, the human text chosen by the prompts' script, and the CLI's --human-text/--no-calibrate."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
import torch

from genprobe import registry
from genprobe._io import json_safe
from genprobe.cli import main
from genprobe.corpus.inputs import human_sequences, is_cjk
from genprobe.loops.scan import ScanOptions, annotate_scan, detector_settings, engine_batches, scan_batches, scan_table
from genprobe.metrics.calibrate import calibrate_loop_settings
from genprobe.metrics.degeneracy import LoopSettings

from .conftest import save_tiny_qwen2

LENGTH = 20


def calibration(length: int = LENGTH, chars_unit: bool = True, quoting_every: int = 0):
    """A calibration on synthetic human text (distinct tokens; optionally one self-quoting sequence in k)."""
    rng = random.Random(0)
    seqs = []
    for i in range(200):
        s = rng.sample(range(1000), length)
        if quoting_every and i % quoting_every == 0:
            s = s[: length // 2] + s[: length // 2]  # the second half copies the first: compression ~10
        seqs.append(s)
    return calibrate_loop_settings(seqs, source="synthetic", chars_unit=chars_unit)


def scan_loops(model, prompts, options, calibration=None):
    """The engine's scan with a calibration, composed as ``scan_loop_settings`` composes it: the calibration's
    detector settings (:func:`detector_settings`), then its human rates (:func:`annotate_scan`)."""
    options = replace(options, loop=detector_settings(calibration, options.loop))
    return annotate_scan(scan_batches(engine_batches(model), prompts, options), calibration)


@pytest.fixture(autouse=True)
def _single_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_scan_uses_the_calibrated_settings_and_reports_human_rates(tiny_model):
    cal = calibration(quoting_every=5)
    assert cal.settings != LoopSettings()  # the synthetic human text moved a threshold
    prompts = [[i % 50, (3 * i) % 50] for i in range(6)]
    res = scan_loops(
        tiny_model,
        prompts,
        ScanOptions(LENGTH, batch_size=3, decode=lambda ids: "".join(map(str, ids))),
        calibration=cal,
    )
    assert res.settings.loop == json_safe(cal.settings) and res.calibration is cal
    assert res.settings.calibration == json_safe(cal)
    d = res.to_dict(with_records=False)
    assert set(d["summary"]["human_fpr"]) == {"exact", "near", "any_loop", "repetitive", "degenerate"}
    assert d["summary"]["human_fpr"]["degenerate"] == json_safe(cal.heldout_fpr["degenerate"])
    table = scan_table(res.summary)
    assert "human text (held out)" in table and "chars" in table  # chars_unit=True: the char column is shown
    line = next(ln for ln in table.splitlines() if "degenerate (any of them)" in ln)
    h = cal.heldout_fpr["degenerate"]
    assert line.rstrip().endswith(f"[{100 * h.ci95[0]:.1f}–{100 * h.ci95[1]:.1f}]")


def test_scan_refuses_a_calibration_of_another_length_or_conflicting_settings(tiny_model):
    prompts = [[1, 2], [3, 4]]
    with pytest.raises(ValueError, match="calibration is for 20-token sequences but the scan generated 24"):
        scan_loops(tiny_model, prompts, ScanOptions(24), calibration=calibration())
    cal = calibration(quoting_every=5)
    with pytest.raises(ValueError, match="not both"):
        scan_loops(tiny_model, prompts, ScanOptions(LENGTH, loop=LoopSettings()), calibration=cal)
    plain = scan_loops(
        tiny_model, prompts, ScanOptions(LENGTH)
    )  # default settings, then the calibration of other settings
    with pytest.raises(ValueError, match="other detector settings"):
        annotate_scan(plain, cal)


def test_character_view_is_not_a_verdict_for_a_subword_tokenizer(tiny_model):
    prompts = [[1, 2], [3, 4]]
    res = scan_loops(
        tiny_model,
        prompts,
        ScanOptions(LENGTH, decode=lambda ids: "ab" * len(ids)),
        calibration=calibration(chars_unit=False),
    )
    assert res.summary.chars is not None  # still measured and kept in the JSON ...
    d = res.to_dict(with_records=False)["summary"]
    assert d["chars_unit"] is False and "not a verdict" in d["chars_note"]
    table = scan_table(res.summary)
    header = table.splitlines()[1]
    assert "chars" not in header and "characters: not shown" in table  # ... but not printed as a verdict
    uncalibrated = scan_loops(tiny_model, prompts, ScanOptions(LENGTH, decode=lambda ids: "ab" * len(ids)))
    assert "chars" in scan_table(uncalibrated.summary).splitlines()[1]  # unknown unit: shown as before
    assert uncalibrated.summary.human_fpr is None and "human text" not in scan_table(uncalibrated.summary)


def test_human_text_follows_the_prompts_script(tmp_path, monkeypatch):
    assert is_cjk(["床前明月光"]) and not is_cjk(["The council met today"]) and not is_cjk([])

    class Words:
        kind = "subword"

        def encode(self, text):
            return [sum(map(ord, w)) % 997 for w in text.split()]

        def decode(self, ids):
            return " ".join(map(str, ids))

    doc = " ".join(f"word{i}" for i in range(100))
    f = tmp_path / "human.txt"
    f.write_text((doc + "\n") * 3, encoding="utf-8")
    seqs, source = human_sequences(Words(), 10, ["any prompt"], human_text=f)
    assert source == f"file:{f}" and len(seqs) == 30 and all(len(s) == 10 for s in seqs)
    monkeypatch.setenv(registry.CACHE_ENV, str(tmp_path / "empty-cache"))  # English corpus not fetched
    with pytest.raises(FileNotFoundError, match="genprobe fetch english"):
        human_sequences(Words(), 10, ["The council met today"])
    with pytest.raises(ValueError, match="only 3 human sequences of 100 tokens"):
        human_sequences(Words(), 100, ["x"], human_text=f)


def test_cli_scan_calibrates_on_the_given_human_text_or_not_at_all(tmp_path, capsys, monkeypatch):
    hf_dir = save_tiny_qwen2(tmp_path / "qwen")
    human = tmp_path / "human.txt"
    human.write_text(
        "\n".join(f"line {i} of a plain human text that says a new thing each time {i * 7}" for i in range(80)),
        encoding="utf-8",
    )
    args = ["loops", "scan", str(hf_dir), "--prompt", "hello there", "--max-new-tokens", "16", "--setting", "greedy"]
    assert main(args + ["--human-text", str(human), "--json"]) == 0
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert out["calibration"]["source"] == f"file:{human}" and out["calibration"]["length"] == 16
    assert out["calibration"]["chars_unit"] is False  # a byte-level BPE
    s = out["scans"]["greedy"]
    assert s["settings"]["loop"] == out["calibration"]["settings"] and "human_fpr" in s["summary"]
    assert "detectors: calibrated on" in cap.err and "human text (held out)" in cap.err
    assert main(args + ["--no-calibrate", "--json"]) == 0
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert out["calibration"] is None and out["scans"]["greedy"]["settings"]["loop"] == json_safe(LoopSettings())
    assert "--no-calibrate" in cap.err
    monkeypatch.setenv(registry.CACHE_ENV, str(tmp_path / "empty-cache"))  # Latin prompts, corpus not fetched
    assert main(args) == 2
    assert "genprobe fetch english" in capsys.readouterr().err


def test_char_tokenizer_human_text_keeps_unknown_characters_apart():
    from genprobe.corpus.inputs import _ids
    from genprobe.corpus.tokenizer import CharTokenizer

    tok = CharTokenizer.from_text("床前明月光", 10)
    ids = _ids(tok, "床甲乙甲")  # 甲 and 乙 are outside the vocabulary
    assert ids[0] == tok.stoi["床"] and ids[1] != ids[2] and ids[1] == ids[3] and 1 not in ids


def test_calibrate_loops_takes_the_human_text_of_the_models_own_prompts(trained_ckpt, tmp_path):
    """Without prompts or a file, the char model's held-out Tang openings (genprobe.corpus.inputs) choose the Tang
    human text; any other model must say which (its prompts' script, or a file)."""
    import genprobe

    cal = genprobe.calibrate_loops(genprobe.load(trained_ckpt), length=LENGTH)
    assert cal.source == "tang:heldout-poems"
    with pytest.raises(ValueError, match="pass prompts"):
        genprobe.calibrate_loops(genprobe.load(save_tiny_qwen2(tmp_path / "q")), length=LENGTH)
