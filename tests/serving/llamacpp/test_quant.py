"""The quantization study (genprobe quant-compare): its numbers on cases computed by hand, llama.cpp's quantize API
on a tiny model, the refusal of a type it cannot write, and the command writing its table.

Skipped with the reason (conftest) when llama.cpp's bindings are not installed.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from genprobe.metrics.stats import sign_test_p
from genprobe.serving.llamacpp.quant_study import (
    AgreementAccumulator,
    divergence_summary,
    intervals_overlap,
    kl_per_position,
)
from genprobe.serving.llamacpp.quantize import QUANT_TYPES, UnsupportedQuantTypeError, check_types
from genprobe.serving.verify import first_difference

NEG = -np.inf


# ---- the numbers, by hand --------------------------------------------------------------------------------------
def test_kl_of_a_distribution_with_itself_is_zero_and_top1_agrees_with_ties_and_minus_inf():
    ref = np.array([[1.0, 1.0, 0.0, NEG], [NEG, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    acc = AgreementAccumulator()
    acc.add(ref, ref.copy(), [0, 1, 2, 3])
    got = acc.result()
    assert got.positions == 3
    assert got.kl_mean == 0.0 and got.kl_max == 0.0
    assert got.top1_agreement == 1.0
    assert got.perplexity == got.reference_perplexity


def test_kl_and_perplexity_on_a_case_computed_by_hand():
    ref = np.array([[0.0, 0.0], [0.0, NEG]])  # (1/2, 1/2) and (1, 0)
    q = np.array([[math.log(3.0), 0.0], [0.0, 0.0]])  # (3/4, 1/4) and (1/2, 1/2)
    kl = kl_per_position(ref, q)
    assert kl[0] == pytest.approx(0.5 * math.log(4.0 / 3.0), abs=1e-12)
    assert kl[1] == pytest.approx(math.log(2.0), abs=1e-12)  # ref's -inf token adds nothing
    assert np.isinf(kl_per_position(np.array([[0.0, 0.0]]), np.array([[0.0, NEG]])))[0]  # q rules out a ref token
    acc = AgreementAccumulator()
    acc.add(ref, q, [5, 1, 0])  # next tokens 1 then 0
    got = acc.result()
    assert got.perplexity == pytest.approx(math.exp(-(math.log(0.25) + math.log(0.5)) / 2))
    assert got.reference_perplexity == pytest.approx(math.exp(-(math.log(0.5) + 0.0) / 2))
    assert got.top1_agreement == 1.0  # row 0: both argmax 0; row 1: q ties (0, 0) and the first index is ref's 0


def test_top1_tie_goes_to_the_first_index_as_llama_cpp_greedy():
    acc = AgreementAccumulator()
    acc.add(np.array([[2.0, 2.0, 0.0]]), np.array([[1.9, 2.0, 0.0]]), [0, 0])
    assert acc.result().top1_agreement == 0.0  # ref picks 0 (first of the tie), the other 1


def test_accumulator_refuses_mismatched_vocabularies_and_short_windows():
    acc = AgreementAccumulator()
    with pytest.raises(ValueError, match="vocabularies differ"):
        acc.add(np.zeros((2, 3)), np.zeros((2, 4)), [0, 1])
    with pytest.raises(ValueError, match=">= 2 tokens"):
        acc.add(np.zeros((1, 3)), np.zeros((1, 3)), [0])
    with pytest.raises(ValueError, match="no text positions"):
        acc.result()


def test_first_difference_and_its_summary():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert first_difference([1, 2, 3], [9, 2, 3]) == 0
    assert first_difference([1, 2, 3], [1, 2]) == 2
    div = divergence_summary([[1, 2, 3]] * 3, [[1, 2, 3], [0, 2, 3], [1, 2, 0]])
    assert (div.prompts, div.diverged, div.steps) == (3, 2, [None, 0, 2])
    assert div.median_step == 2.0  # sorted 0, 2, never
    assert div.histogram == {"0-7": 2, "never": 1}
    assert divergence_summary([[1]] * 3, [[1], [1], [0]]).median_step is None  # over half never diverge
    with pytest.raises(ValueError, match="2 reference generations but 1"):
        divergence_summary([[1], [1]], [[1]])


def test_sign_test_and_interval_overlap():
    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(3, 3) == 1.0
    assert sign_test_p(5, 0) == pytest.approx(2 / 32)
    assert sign_test_p(0, 5) == pytest.approx(2 / 32)
    assert intervals_overlap([0.1, 0.2], [0.2, 0.3])  # touching at a point counts
    assert not intervals_overlap([0.1, 0.2], [0.2001, 0.3])


def _loops(rate, ci, p=1.0):
    from types import SimpleNamespace

    return SimpleNamespace(loops=SimpleNamespace(degenerate_rate=rate, degenerate_rate_ci95=ci), sign_test_p=p)


def test_a_loop_change_needs_the_paired_test_or_apart_intervals():
    from genprobe.serving.llamacpp.quant_report import SIGNIFICANCE, loop_change

    ref = _loops(0.765, [0.725, 0.800])
    assert loop_change(_loops(0.812, [0.775, 0.845], p=0.025), ref) == 1  # overlapping, but paired: +60/-37
    assert loop_change(_loops(0.812, [0.775, 0.845], p=SIGNIFICANCE), ref) == 0  # exactly at the threshold: not
    assert loop_change(_loops(0.70, [0.66, 0.74], p=0.2), ref) == 0
    assert loop_change(_loops(0.50, [0.45, 0.55], p=0.2), ref) == -1  # intervals apart


def test_a_type_llama_cpp_cannot_be_asked_for_names_it_and_the_supported_list():
    with pytest.raises(UnsupportedQuantTypeError, match=r"'IQ2_XXS'.*supported: F32, F16, .*Q4_0"):
        check_types(["Q8_0", "IQ2_XXS"])
    with pytest.raises(UnsupportedQuantTypeError, match="no GGUF type given"):
        check_types([])
    assert check_types(["q8_0", "Q8_0", " q4_0"]) == ["Q8_0", "Q4_0"]
    assert set(QUANT_TYPES) >= {"F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0"}


# ---- llama.cpp on a tiny model -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny Llama + BPE trained for a few steps on Tang poems (a transformers directory, as `genprobe train`)."""
    from genprobe.corpus.tang import bundled_documents, corpus_split, split_texts
    from genprobe.model import hf_train
    from genprobe.model.hf_train import save_subword_dir

    docs = bundled_documents()[:900]
    split = corpus_split(docs, subword_poems=700, char_poems=400)
    run = hf_train.train_subword(
        split_texts(docs, split),
        split,
        hf_train.quick_model_config("llama"),
        replace(hf_train.quick_train_config(), steps=20),
        progress=False,
        heldout_docs=20,
    )
    out = tmp_path_factory.mktemp("quant") / "tiny-llama"
    save_subword_dir(out, run.model, run.tokenizer, run.summary)
    return out


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """Helper L2's random tiny Llama (tests/serving/llamacpp/models.py) as F32 GGUF, quantized to Q8_0 and Q4_0."""
    from genprobe.serving.llamacpp.quantize import quantize_all

    from .models import tiny_llama_gguf

    # The F32 file the other llama.cpp modules of this process converted (the converter: a subprocess importing torch)
    _, f32 = tiny_llama_gguf(tmp_path_factory.getbasetemp() / "llamacpp-tiny")
    return quantize_all(f32, tmp_path_factory.mktemp("gguf"), ["F32", "Q8_0", "Q4_0", "Q4_K_M"], stem="tiny")


def test_the_converter_refuses_our_own_bpe_unless_its_pre_tokenizer_is_named(tiny_dir, tmp_path):
    """llama.cpp's converter refuses a BPE it has never hashed, leaving no file; the study names the pre-tokenizer
    (gpt-2 for the Llama reference: test_the_command_writes_the_table converts the same directory that way)."""
    from genprobe.serving.llamacpp.quantize import convert_to_gguf

    with pytest.raises(RuntimeError, match="pre-tokenizer was not recognized"):
        convert_to_gguf(tiny_dir, tmp_path / "refused.gguf")
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_quantize_writes_each_type_and_records_what_llama_cpp_wrote(tiny_files):
    f32, q8, q4 = tiny_files["F32"], tiny_files["Q8_0"], tiny_files["Q4_0"]
    assert set(f32.type_counts) == {"F32"} and f32.bits_per_weight == pytest.approx(32.0)
    assert q8.main_type == "Q8_0" and q8.type_counts.get("Q8_0", 0) > 0
    assert q4.main_type == "Q4_0" and q4.type_counts.get("Q4_0", 0) > 0
    assert f32.bits_per_weight > q8.bits_per_weight > q4.bits_per_weight  # Q8_0: 8.5, Q4_0: 4.5 + norms in F32
    assert 8.0 < q8.bits_per_weight < 10.0 and 4.0 < q4.bits_per_weight < 7.0
    assert not q4.shape_fallbacks  # 64- and 128-wide rows fit Q4_0's 32-blocks
    assert q8.seconds > 0 and q4.path.endswith("tiny-Q4_0.gguf")
    assert all(not name.endswith("norm.weight") for name in q4.off_target)  # 1-D norms are not "off target"


def test_a_k_quant_on_rows_shorter_than_its_block_falls_back_and_the_record_says_so(tiny_files):
    """64-wide rows cannot hold Q4_K's 256-value blocks: llama.cpp writes Q5_0 instead (tensor_type_fallback)."""
    km = tiny_files["Q4_K_M"]
    assert km.main_type == "Q4_K" and "Q4_K" not in km.type_counts
    assert km.type_counts.get("Q5_0", 0) > 0
    assert km.shape_fallbacks and set(km.shape_fallbacks) <= set(km.off_target)
    assert "by llama.cpp's shape fallback" in km.describe()


def test_quantized_logits_differ_and_f32_agrees_with_itself(tiny_files):
    from genprobe.serving.llamacpp.engine import LlamaCppModel

    ids = list(range(3, 40))
    with LlamaCppModel(tiny_files["F32"].path, n_ctx=64, kv_type="f32") as m:
        ref, again = m.logits(ids), m.logits(ids)
    with LlamaCppModel(tiny_files["Q4_0"].path, n_ctx=64, kv_type="f32") as m:
        q4 = m.logits(ids)
    with LlamaCppModel(tiny_files["Q8_0"].path, n_ctx=64, kv_type="f32") as m:
        q8 = m.logits(ids)
    same = AgreementAccumulator()
    same.add(ref, again, ids)
    assert same.result().kl_max == 0.0 and same.result().top1_agreement == 1.0  # llama.cpp is deterministic
    kl = {}
    for name, logits in (("Q8_0", q8), ("Q4_0", q4)):
        acc = AgreementAccumulator()
        acc.add(ref, logits, ids)
        kl[name] = acc.result().kl_mean
    assert 0.0 < kl["Q8_0"] < kl["Q4_0"]


def test_quantize_refuses_an_unknown_type_before_touching_files(tiny_files, tmp_path):
    from genprobe.serving.llamacpp.quantize import quantize_gguf

    with pytest.raises(UnsupportedQuantTypeError, match=r"'Q9_9'.*supported:"):
        quantize_gguf(tiny_files["F32"].path, tmp_path / "x.gguf", "Q9_9")
    assert not list(tmp_path.iterdir())


def test_the_command_writes_the_table(tiny_dir, tmp_path, capsys):
    from genprobe.cli import main

    out = tmp_path / "study"
    argv = ["quant-compare", str(tiny_dir), "--types", "Q8_0", "Q4_0", "Q4_K_M", "--out", str(out), "--n-prompts", "6"]
    argv += ["--max-new-tokens", "16", "--text-windows", "3", "--window-tokens", "24", "--json"]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert [r["type"] for r in got["rows"]] == ["F32", "Q8_0", "Q4_0", "Q4_K_M"]
    assert any(f.startswith("Q4_K_M is mostly Q5_0, not Q4_K") for f in got["findings"])
    f32 = got["rows"][0]
    assert f32["logits"]["kl_max"] == 0.0 and f32["logits"]["top1_agreement"] == 1.0
    assert f32["divergence"]["diverged"] == 0
    assert f32["decode_tokens_per_s"] > 0 and f32["decode_tokens_per_cpu_s"] > 0
    assert got["rows"][2]["logits"]["kl_mean"] > 0.0
    assert got["engine_check"]["top1_agreement"] > 0.9 and got["engine_check"]["kl_max"] < 1e-3
    assert got["rows"][1]["loops"]["human_fpr"]["degenerate"]["n"] > 0  # calibrated: human FPR beside the rates
    table = (out / "quant-tiny-llama.md").read_text(encoding="utf-8")
    assert "| Q4_0 |" in table and "| F32 |" in table and "Findings:" in table
    assert json.loads((out / "quant-tiny-llama.json").read_text(encoding="utf-8")) == got  # the whole study


def test_the_command_refuses_an_unknown_type(tiny_dir, tmp_path, capsys):
    from genprobe.cli import main

    assert main(["quant-compare", str(tiny_dir), "--types", "Q4_0", "IQ1_S", "--out", str(tmp_path)]) == 2
    assert "'IQ1_S'" in capsys.readouterr().err


def test_the_command_says_how_to_install_when_the_bindings_are_missing(tiny_dir, tmp_path, capsys, monkeypatch):
    import genprobe.serving.llamacpp.engine as pkg
    from genprobe.cli import main

    monkeypatch.setattr(
        pkg, "llama_cpp_problem", lambda: f"llama.cpp's Python bindings are not installed; {pkg.INSTALL_HINT}"
    )
    assert main(["quant-compare", str(tiny_dir), "--types", "Q4_0", "--out", str(tmp_path / "none")]) == 2
    assert "scripts/install_llamacpp.sh" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()  # refused before converting anything


GPT2_SPLIT = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


@pytest.mark.parametrize(
    "pre, normalizer, name",
    [
        (GPT2_SPLIT, None, "gpt-2"),  # HF's ByteLevel regex is llama.cpp's gpt-2 split
        ({**GPT2_SPLIT, "add_prefix_space": True}, None, None),  # a prefix space tokenizes differently
        ({**GPT2_SPLIT, "use_regex": False}, None, None),  # no split at all
        ({"type": "Sequence", "pretokenizers": [{"type": "Split"}, GPT2_SPLIT]}, None, None),  # a regex of its own
        (GPT2_SPLIT, {"type": "NFC"}, None),  # a normalizer llama.cpp's gpt-2 does not apply
    ],
)
def test_only_gpt2s_own_split_is_named_for_an_unknown_bpe(tmp_path, pre, normalizer, name):
    """Where llama.cpp's converter does not know a BPE's hash, the study names the pre-tokenizer only when it is
    GPT-2's split exactly; anything else stays refused by the converter (a wrong name would tokenize differently)."""
    from types import SimpleNamespace

    from genprobe.serving.llamacpp.quant_study import _pre_tokenizer

    (tmp_path / "tokenizer.json").write_text(json.dumps({"normalizer": normalizer, "pre_tokenizer": pre}))
    assert _pre_tokenizer(SimpleNamespace(kind="transformers", source=str(tmp_path), arch="llama")) == name


def test_a_failed_quantization_names_llamas_last_lines_and_leaves_no_file(tmp_path, monkeypatch):
    """llama.cpp's log of the call is captured to a temporary file; on failure its tail goes into the error, and
    neither it nor a partial output stays behind."""
    import tempfile

    from genprobe.serving.llamacpp.quantize import quantize_gguf

    logs = tmp_path / "tmp"
    logs.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(logs))
    src = tmp_path / "not-a.gguf"
    src.write_bytes(b"GGUF" + b"\0" * 60)  # a header and nothing a loader can read
    with pytest.raises(RuntimeError, match=r"llama_model_quantize failed writing Q8_0 from .*not-a\.gguf"):
        quantize_gguf(src, tmp_path / "out.gguf", "Q8_0")
    assert list(logs.iterdir()) == [] and not (tmp_path / "out.gguf").exists()
