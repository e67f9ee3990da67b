"""Issue #46: faults that are not cache bugs — one corrupted weight matrix, a wrong tokenizer — found by the quality
stage against a reference (KL and top-1 per position), and without one by bits per character outside the range
calibrated on known-good models; the same model against itself is clean (so each test fails without its check)."""

from __future__ import annotations

import json

import pytest

from genprobe.doctor.quality import BPC_FACTOR, KNOWN_GOOD, Quality, quality_findings

from .conftest import run_cli, tiny_llama_dir


def _quality(out) -> tuple[int, dict]:
    d = json.loads((out / "doctor.json").read_text(encoding="utf-8"))
    return d["exit_status"], next(f for f in d["findings"] if f["check"].startswith("quality."))


@pytest.fixture(autouse=True)
def english(monkeypatch):
    """The tiny models' ASCII tokenizer reads the English held-out text (it reads Tang as unknown tokens)."""
    import genprobe.corpus.inputs as inputs

    monkeypatch.setattr(inputs, "corpus_of", lambda model: "english")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny Llama, a copy with one MLP down-projection scaled, a copy whose tokenizer lowercases its input."""
    import torch
    from transformers import LlamaForCausalLM

    base = tmp_path_factory.mktemp("quality")
    good = tiny_llama_dir(base / "good")
    bad = tiny_llama_dir(base / "scaled")
    m = LlamaForCausalLM.from_pretrained(bad)
    with torch.no_grad():
        m.model.layers[0].mlp.down_proj.weight.mul_(300.0)
    m.save_pretrained(bad)
    return good, bad, tiny_llama_dir(base / "lowercase", lowercase=True)


def test_against_itself_matches(models, tmp_path):
    good, _, _ = models
    assert run_cli("doctor", good, "--only", "quality", "--reference", good, "--out", tmp_path / "d") in (0, 4)
    _, f = _quality(tmp_path / "d")
    assert f["check"] == "quality.reference" and f["severity"] == "ok"
    assert f["evidence"]["kl_mean"] < 1e-6 and f["evidence"]["top1_agreement"] == 1.0


def test_one_scaled_mlp_matrix_diverges_from_the_reference(models, tmp_path):
    good, bad, _ = models
    assert run_cli("doctor", bad, "--only", "quality", "--reference", good, "--out", tmp_path / "d") == 1
    rc, f = _quality(tmp_path / "d")
    assert f["severity"] == "bug" and "diverges from the reference" in f["title"]
    assert len(f["evidence"]["kl_by_position"]) == f["evidence"]["tokens"] // f["evidence"]["windows"]


def test_a_wrong_tokenizer_is_named(models, tmp_path):
    good, _, lower = models
    assert run_cli("doctor", lower, "--only", "quality", "--reference", good, "--out", tmp_path / "d") == 1
    _, f = _quality(tmp_path / "d")
    assert f["severity"] == "bug" and "tokenizer differs" in f["title"]


@pytest.mark.parametrize(("above", "severity"), [(0.0, "ok"), (1e-3, "warning")])
def test_bits_per_character_threshold_is_exact(above, severity):
    """Without a reference: at the calibrated limit it passes, just above it warns."""
    limit = round(BPC_FACTOR * max(KNOWN_GOOD["english"].values()), 3)
    q = Quality("english", 8, 1016, 30.0, limit + above, 0.01)
    (f,) = quality_findings(q, "cmd")
    assert f.check == "quality.perplexity" and f.severity == severity
    (g,) = quality_findings(Quality("tang", 8, 1016, 30.0, 9.0), "cmd")
    assert g.severity == "info" and "not judged" in g.title  # no known-good model of that language: said, not judged
    (h,) = quality_findings(Quality("english", 8, 1016, 30.0, 9.0, 0.51), "cmd")
    assert h.severity == "info" and "not checked" in h.title  # mostly unknown tokens: not the model's language
