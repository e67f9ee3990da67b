"""Loop scans through llama.cpp on a tiny random Llama (F32 GGUF, F32 KV cache): the same tokens and per-prompt
verdicts as our engine's scan (greedy and chanting), sampled scans through llama.cpp's own sampler chain repeat
with their seed, a setting the chain cannot express is refused, and ``loops scan --backend llama.cpp`` writes
the same records as ``--backend genprobe``.

Skipped with the reason (conftest) when llama.cpp's bindings are not installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from models import tiny_llama_gguf  # noqa: E402

from genprobe._io import json_safe

EOS, UNK = 2, 0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(transformers directory, F32 GGUF) of the tiny Llama; built once per session."""
    torch.set_num_threads(1)
    return tiny_llama_gguf(tmp_path_factory.getbasetemp() / "llamacpp-tiny")


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    return [[int(t) for t in rng.integers(3, 96, n)] for n in rng.integers(1, 12, 24)]  # 1-token prompts too


@pytest.fixture(scope="module")
def engine(tiny):
    from genprobe.serving.llamacpp.engine import LlamaCppModel

    with LlamaCppModel(tiny[1], n_ctx=64, kv_type="f32") as m:
        yield m


@pytest.mark.parametrize("setting", ["greedy", "chanting"])
def test_per_prompt_verdicts_equal_our_engine_on_f32(tiny, engine, prompts, setting):
    import genprobe
    from genprobe.loops.scan import ScanOptions, chanting_sampler, engine_batches, greedy_sampler, scan_batches
    from genprobe.serving.llamacpp.scan import llamacpp_batches

    sampler = greedy_sampler() if setting == "greedy" else chanting_sampler(UNK)
    ours = scan_batches(
        engine_batches(genprobe.load(str(tiny[0]))), prompts, ScanOptions(32, sampler, eos_id=EOS, unk_id=UNK)
    )
    theirs = scan_batches(llamacpp_batches(engine), prompts, ScanOptions(32, sampler, 7, eos_id=EOS, unk_id=UNK))
    assert [r.tokens for r in theirs.records] == [r.tokens for r in ours.records]
    assert [r.measures.degenerate for r in theirs.records] == [r.measures.degenerate for r in ours.records]
    assert [r.measures.period for r in theirs.records] == [r.measures.period for r in ours.records]
    assert 0 < ours.summary.degenerate < len(prompts)  # both verdicts occur: the comparison can fail
    assert json_safe(theirs.summary) == json_safe(ours.summary)
    assert json_safe(theirs.settings) == json_safe(ours.settings)
    assert all(EOS not in r.tokens and len(r.tokens) == 32 for r in theirs.records)  # banned, never a stop


def test_sampled_scans_use_llama_cpp_chain_and_repeat_with_their_seed(engine, prompts):
    from genprobe.engine.samplers.stages import SamplerConfig
    from genprobe.loops.scan import ScanOptions, scan_batches
    from genprobe.serving.llamacpp.scan import llamacpp_batches

    cfg = SamplerConfig.preset("llama.cpp", repetition_penalty=1.3)
    a = scan_batches(llamacpp_batches(engine), prompts[:6], ScanOptions(24, cfg, seed=5, eos_id=EOS, unk_id=UNK))
    b = scan_batches(llamacpp_batches(engine), prompts[:6], ScanOptions(24, cfg, 2, 5, eos_id=EOS, unk_id=UNK))
    c = scan_batches(llamacpp_batches(engine), prompts[:6], ScanOptions(24, cfg, seed=6, eos_id=EOS, unk_id=UNK))
    assert [r.tokens for r in a.records] == [r.tokens for r in b.records]  # seed + i per prompt, whatever the batch
    assert [r.tokens for r in a.records] != [r.tokens for r in c.records]
    assert all(EOS not in r.tokens for r in a.records)


def test_a_setting_the_chain_cannot_express_is_refused_before_generating(engine, prompts):
    from genprobe.engine.samplers.stages import SamplerConfig, UnsupportedSamplerError
    from genprobe.loops.scan import ScanOptions, scan_batches
    from genprobe.serving.llamacpp.scan import llamacpp_batches

    with pytest.raises(UnsupportedSamplerError):
        scan_batches(llamacpp_batches(engine), prompts, ScanOptions(24, SamplerConfig(no_repeat_ngram=3), eos_id=EOS))
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        scan_batches(llamacpp_batches(engine), [[5], []], ScanOptions(24, eos_id=EOS))


def test_the_command_writes_the_same_records_as_our_engine(tiny, tmp_path, capsys):
    from genprobe.cli import main

    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("the quick brown fox\na cat sat\nover the lazy dog\n0 1 2 3\nthe mat again\n")
    common = ["loops", "scan", str(tiny[1]), "--prompts", str(prompt_file), "--no-calibrate", "--setting", "both"]
    common += ["--max-new-tokens", "24", "--no-progress"]
    for backend in ("genprobe", "llama.cpp"):
        extra = ["--kv-type", "f32"] if backend == "llama.cpp" else []
        assert main([*common, "--backend", backend, *extra, "--out", str(tmp_path / backend)]) == 0
    capsys.readouterr()
    ours = json.loads((tmp_path / "genprobe" / "scan.json").read_text())
    theirs = json.loads((tmp_path / "llama.cpp" / "scan.json").read_text())
    assert theirs["backend"] == "llama.cpp" and theirs["llama.cpp"]["kv_type"] == "f32"
    for name in ("chanting", "greedy"):
        a, b = ours["scans"][name]["records"], theirs["scans"][name]["records"]
        assert [r["tokens"] for r in b] == [r["tokens"] for r in a]
        assert [r["degenerate"] for r in b] == [r["degenerate"] for r in a]


def test_a_model_that_is_not_gguf_is_refused_with_what_to_give(tiny):
    from genprobe.serving.llamacpp.scan import gguf_file_for

    assert gguf_file_for(tiny[1]) == tiny[1]
    with pytest.raises(ValueError, match="GGUF"):
        gguf_file_for(tiny[0])
