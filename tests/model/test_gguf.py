"""GGUF in: a file written the way llama.cpp writes one loads back to the exact model, every command takes it,
bad files are one-line errors. The real SmolLM2 file is checked when `genprobe fetch smollm2` has run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf", reason="the gguf extra is not installed (pip install 'genprobe[gguf]')")

sys.path.insert(0, str(Path(__file__).parent))
from gguf_tiny import write_tiny_gguf  # noqa: E402

import genprobe  # noqa: E402
from genprobe.model.errors import ModelLoadError, UnsupportedArchitectureError  # noqa: E402
from genprobe.model.gguf import convert_gguf, inspect_gguf  # noqa: E402

Q8 = ("blk.0.ffn_down.weight", "blk.1.attn_q.weight")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    path = d / "tiny.gguf"
    ref, bpe = write_tiny_gguf(path, q8_names=Q8)
    return path, ref, bpe


def _logits(module, ids):
    with torch.no_grad():
        return module(torch.tensor([ids])).logits[0]


def test_gguf_loads_to_the_model_it_was_written_from(tiny):
    path, ref, _ = tiny
    model = genprobe.load(path)
    ids = [5, 17, 40, 41, 99, 3, 250, 7]
    # exact: dequantization is exact, and q/k come back un-permuted (a wrong rotary layout moves every logit)
    assert torch.equal(_logits(model.module, ids), _logits(ref, ids))
    assert model.arch == "llama" and model.kind == "hf"


def test_describe_records_each_tensor_quantization_type(tiny):
    path, _, _ = tiny
    gguf = genprobe.load(path).describe()["gguf"]
    assert gguf["tensor_types"]["blk.0.ffn_down.weight"] == "Q8_0"
    assert gguf["tensor_types"]["blk.0.ffn_up.weight"] == "F32"
    assert gguf["type_counts"] == {"F32": 18, "Q8_0": 2}
    assert gguf["architecture"] == "llama"


def test_tokenizer_and_chat_template_come_from_the_file(tiny):
    path, _, bpe = tiny
    model = genprobe.load(path)
    text = "The quick brown fox jumps over the lazy dog."
    assert model.encode(text) == bpe.encode(text).ids
    assert model.decode(model.encode(text)) == text
    assert model.eos_id == 2
    assert model.chat_prompt("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def _cli(capsys, *args: str) -> subprocess.CompletedProcess:
    """The genprobe command in this process (a subprocess would pay torch's import for every call)."""
    from genprobe.cli import main

    capsys.readouterr()
    rc = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out, err)


def test_cli_generate_on_gguf_equals_transformers_greedy(tiny, capsys):
    path, ref, bpe = tiny
    prompt = "The quick brown"
    run = _cli(
        capsys,
        "generate",
        str(path),
        "--prompt",
        prompt,
        "--greedy",
        "--max-new-tokens",
        "12",
        "--ignore-eos",
        "--json",
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)["tokens"]
    ids = torch.tensor([bpe.encode(prompt).ids])
    with torch.no_grad():
        want = ref.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=2)
    assert got == want[0, ids.shape[1] :].tolist()


def test_a_directory_holding_one_gguf_loads_and_two_are_refused(tiny, tmp_path):
    path, ref, _ = tiny
    (tmp_path / path.name).write_bytes(path.read_bytes())
    ids = [9, 8, 7]
    assert torch.equal(_logits(genprobe.load(tmp_path).module, ids), _logits(ref, ids))
    (tmp_path / "second.gguf").write_bytes(path.read_bytes())
    with pytest.raises(ModelLoadError, match="holds 2 GGUF files"):
        genprobe.load(tmp_path)


def test_convert_gguf_writes_a_safetensors_directory_once(tiny, tmp_path):
    path, ref, _ = tiny
    out = convert_gguf(path, tmp_path / "conv")
    written = {p.name for p in out.iterdir()}
    assert {"config.json", "genprobe_gguf.json", "model.safetensors", "tokenizer.json"} <= written
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    model = genprobe.load(out)
    ids = [1, 2, 3, 100]
    assert torch.equal(_logits(model.module, ids), _logits(ref, ids))
    assert model.describe()["gguf"]["type_counts"] == {"F32": 18, "Q8_0": 2}
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert convert_gguf(path, out) == out and (out / "model.safetensors").stat().st_mtime_ns == mtime  # idempotent
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ModelLoadError, match="already exists"):
        convert_gguf(path, other)


def test_reading_a_file_parses_its_header_once(tiny, monkeypatch):
    """Our check and transformers' config, tokenizer and weights share one reader (the header is parsed in Python:
    ~5 s a parse for SmolLM2's vocabulary); outside the read, gguf.GGUFReader is the package's own again."""
    import gguf

    from genprobe.model.gguf import read_gguf

    real = gguf.GGUFReader
    opened: list[str] = []

    def counting(path, mode="r"):
        opened.append(str(path))
        return real(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", counting)
    module, _, summary = read_gguf(tiny[0])
    assert len(opened) == 1 and summary.architecture == "llama"
    assert gguf.GGUFReader is counting  # put back as it was found
    ids = [5, 17, 40, 41]
    assert torch.equal(_logits(module, ids), _logits(tiny[1], ids))
    # keeping the Q8_0 blocks as int8 reads them from that same parse
    opened.clear()
    blocked = genprobe.load(tiny[0], weight_dtype=torch.int8)
    assert len(opened) == 1 and torch.equal(_logits(blocked.module, ids), _logits(tiny[1], ids))


def test_a_load_builds_the_tensor_name_map_once(tiny, monkeypatch):
    """transformers rebuilds gguf's tensor-name map for every submodule it walks (1,191 times, 19 s, in a 4-bit
    SmolLM2 load); inside a read, one map per architecture serves them all, and the package's function is back after."""
    import gguf

    real = gguf.get_tensor_name_map
    built: list[tuple] = []

    def counting(arch, n_blocks):
        built.append((arch, n_blocks))
        return real(arch, n_blocks)

    monkeypatch.setattr(gguf, "get_tensor_name_map", counting)
    blocked = genprobe.load(tiny[0], weight_dtype=torch.int8)  # transformers' weights, then the Q8_0 blocks' names
    assert len(built) == 1, built
    assert gguf.get_tensor_name_map is counting
    ids = [5, 17, 40, 41]
    assert torch.equal(_logits(blocked.module, ids), _logits(tiny[1], ids))


# ---- bad inputs: one line, exit 2, nothing written ----------------------------------------------
def _bad_files(tiny, d: Path) -> dict[str, Path]:
    import gguf

    path = tiny[0]
    truncated = d / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    text = d / "notes.gguf"
    text.write_text("this is a text file, not a model\n")
    unsupported = d / "bert.gguf"
    w = gguf.GGUFWriter(str(unsupported), "bert")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"truncated": truncated, "text": text, "unsupported": unsupported}


@pytest.mark.parametrize(
    "kind, message",
    [("truncated", "truncated"), ("text", "is not a GGUF file"), ("unsupported", "architecture 'bert'")],
)
def test_bad_gguf_is_a_one_line_error_and_nothing_is_written(tiny, tmp_path, kind, message, capsys):
    bad = _bad_files(tiny, tmp_path)[kind]
    out = tmp_path / "out"
    for args in (("convert-gguf", str(bad), "--out", str(out)), ("generate", str(bad), "--prompt", "x")):
        run = _cli(capsys, *args)
        assert run.returncode == 2, run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], run.stderr
        assert "Traceback" not in run.stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["bert.gguf", "notes.gguf", "truncated.gguf"])


def test_inspect_refuses_each_bad_file_with_its_own_error(tiny, tmp_path):
    bad = _bad_files(tiny, tmp_path)
    with pytest.raises(ModelLoadError, match="truncated"):
        inspect_gguf(bad["truncated"])
    with pytest.raises(ModelLoadError, match="starts with b'this'"):
        inspect_gguf(bad["text"])
    from genprobe.model.gguf import check_supported

    with pytest.raises(UnsupportedArchitectureError, match="bert"):
        check_supported(inspect_gguf(bad["unsupported"]))


def test_inspect_lists_special_ids_outside_the_vocabulary(tiny, tmp_path):
    assert inspect_gguf(tiny[0]).bad_special_ids == {}
    write_tiny_gguf(tmp_path / "eos.gguf", planted={"eos_token_id": 999999})
    assert inspect_gguf(tmp_path / "eos.gguf").bad_special_ids == {"tokenizer.ggml.eos_token_id": 999999}


def test_an_unfetched_catalog_name_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("GENPROBE_CACHE_DIR", str(tmp_path))
    with pytest.raises(ModelLoadError, match="genprobe fetch smollm2"):
        genprobe.load("smollm2")
    assert not any(tmp_path.iterdir())  # nothing fetched implicitly


# ---- the real model, when fetched (scripts/test.sh fetches it: ~40 s download + ~40 s conversion) --------
def test_real_smollm2_greedy_equals_transformers(capsys):
    from genprobe.model.catalog import SMOLLM2

    d = SMOLLM2.directory()
    if not (d / "model.safetensors").is_file():
        pytest.skip(f"SmolLM2 is not fetched into {d}: run `genprobe fetch smollm2`")
    model = genprobe.load("smollm2")
    info = model.describe()
    assert info["parameters"] == 134_515_008 and info["gguf"]["type_counts"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    prompts = ["The capital of France is", "Once upon a time, in a small village,"]
    run = _cli(capsys, "generate", "smollm2", "--prompt", *prompts, "--greedy", "--max-new-tokens", "16", "--json")
    assert run.returncode == 0, run.stderr
    got = [r["tokens"] for r in json.loads(run.stdout)["results"]]
    for prompt, tokens in zip(prompts, got, strict=True):
        ids = torch.tensor([model.encode(prompt)])
        with torch.no_grad():
            want = model.module.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=model.pad_id)
        want_new = want[0, ids.shape[1] :].tolist()
        assert tokens == want_new[: len(tokens)] and (len(tokens) == 16 or tokens[-1] == model.eos_id)
