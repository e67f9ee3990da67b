"""The command × model-kind matrix's models and cells (shared by test_command_matrix.py and its vLLM half).

One tiny model of each kind MODEL can name: the tests' trained Tang checkpoint (a genprobe checkpoint), a tiny random
Llama with a byte-level BPE saved as a ``transformers`` directory, the same Llama written as GGUF the way llama.cpp's
converter writes one, and the catalog name ``smollm2`` resolved in a cache directory of the test's own whose
"fetched" SmolLM2 is that Llama (``GENPROBE_CACHE_DIR`` points there while a name cell runs). What each command takes
is its own declaration (``genprobe.cli.matrix.model_kinds_of``); a cell passes when the command runs (exit 0, or 4 for
doctor's warnings, and its ``--json`` output parses) where it takes the kind, and refuses in one line (exit 2, naming
the kinds it takes) where it does not.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from gguf_tiny import CHAT_TEMPLATE, TEXT, write_tiny_gguf  # noqa: E402

from genprobe.cli import main  # noqa: E402
from genprobe.cli.matrix import COLUMNS, Row, model_kinds_of  # noqa: E402
from genprobe.model.kinds import ModelKind, kinds_phrase  # noqa: E402

TANG_PROMPTS = ["白日依山盡", "春眠不覺曉", "國破山河在"]
TANG_TEXT = [  # longer than the checkpoint's 64-character window, which the regression check reads whole
    "白日依山盡，黃河入海流。欲窮千里目，更上一層樓。春眠不覺曉，處處聞啼鳥。夜來風雨聲，花落知多少。"
    "國破山河在，城春草木深。感時花濺淚，恨別鳥驚心。烽火連三月，家書抵萬金。白頭搔更短，渾欲不勝簪。"
]
ENGLISH_PROMPTS = ["The quick brown fox", "Rain fell on the town", "A tiny model writes"]
#: The smallest repair that runs every stage: two prompts per set, one edit size and form
REPAIR_SIZES = ["--n-direction", "2", "--n-search", "6", "--n-validate", "6", "--ks", "4", "--forms", "subtract"]
#: Exit statuses that mean "ran": doctor exits 4 on warnings (a random model has some)
RAN = {"doctor": (0, 4)}
LLAMACPP_MISSING = "install_llamacpp.sh"


@dataclass
class MatrixModels:
    """MODEL arguments by kind, and what the cells need beside them."""

    args: dict[str, str]  # kind -> MODEL argument
    cache: Path  # GENPROBE_CACHE_DIR of the name cells
    prompts: dict[str, Path]  # kind -> a prompt file in the model's language
    texts: dict[str, Path]  # kind -> held-out text in the model's language (loops' regression check)
    patches: dict[str, Path]  # kind -> a loop patch made for that model (apply / revert)
    patched: dict[str, Path]  # kind -> that model with its patch applied (what revert reads)
    gpt2_dir: Path  # a GPT-2 transformers directory (what import-hf reads): the checkpoint exported
    work: Path  # where cells write

    def model_arg(self, row: Row, kind: str) -> str:
        """import-hf reads GPT-2 directories: its transformers cell is the checkpoint's export; revert reads a
        patched model."""
        if row.command == ("import-hf",) and kind == ModelKind.TRANSFORMERS:
            return str(self.gpt2_dir)
        if row.command == ("loops", "revert") and kind in self.patched:
            return str(self.patched[kind])
        return self.args[kind]


def save_tiny_llama(root: Path) -> tuple[Path, Path]:
    """(transformers directory, GGUF file) of one tiny Llama + BPE: the GGUF holds the directory's weights."""
    from transformers import PreTrainedTokenizerFast

    gguf = root / "tiny-llama.gguf"
    model, bpe = write_tiny_gguf(gguf, heads=(2, 1))  # head width 32: vLLM's CPU attention has no kernel for 16
    hf = root / "tiny-llama"
    model.save_pretrained(hf)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|im_start|>", pad_token="<|endoftext|>"
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(hf)
    return hf, gguf


def fake_catalog_cache(root: Path, hf: Path, gguf: Path) -> Path:
    """A genprobe cache whose fetched ``smollm2`` is the tiny Llama (directory and GGUF), with the real cache's
    English corpus (``genprobe fetch english``, which scripts/test.sh runs) and llama.cpp source tree beside it."""
    from genprobe.model.catalog import SMOLLM2
    from genprobe.registry import cache_root
    from genprobe.serving.llamacpp.engine import LLAMA_CPP_PYTHON_VERSION

    cache = root / "cache"
    models = SMOLLM2.directory(cache).parent
    models.mkdir(parents=True)
    SMOLLM2.directory(cache).symlink_to(hf, target_is_directory=True)
    SMOLLM2.gguf_path(cache).symlink_to(gguf)
    (cache / "data").symlink_to(cache_root() / "data", target_is_directory=True)
    tree = f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"  # the converter quant-compare runs (from install_llamacpp.sh)
    (cache / tree).symlink_to(cache_root() / tree, target_is_directory=True)
    return cache


def random_patch(module: Any, path: Path) -> Path:
    """A loop patch of random directions on every layer of ``module`` (exact, hash-checked like a repair's)."""
    from genprobe.loops.patch import EditSpec, finalise, make_patch, save_patch
    from genprobe.model.arch import mlp_sites

    sites = mlp_sites(module)
    gen = torch.Generator().manual_seed(0)
    dirs = {i: torch.randn(s.d_model, generator=gen) for i, s in enumerate(sites)}
    means = {i: torch.ones(s.d_ff) for i, s in enumerate(sites)}
    patch = make_patch(module, EditSpec(tuple(dirs), 4, "subtract", 0.5), dirs, means)
    finalise(module, patch)
    save_patch(patch, path)
    return path.with_suffix(".json")


def build_matrix_models(trained_ckpt: Path, root: Path) -> MatrixModels:
    """Every kind's model, prompt file and patch, under ``root``."""
    from genprobe.model.hf_dir import export_hf_dir
    from genprobe.model.load import load_model

    hf, gguf = save_tiny_llama(root)
    cache = fake_catalog_cache(root, hf, gguf)
    ckpt = root / "tang-ckpt"
    shutil.copytree(trained_ckpt, ckpt)  # cells may write beside it (apply --in-place is not used, but be safe)
    gpt2 = root / "tang-gpt2"
    export_hf_dir(ckpt, gpt2)
    prompts, texts = {}, {}
    for kind in COLUMNS:
        tang = kind == ModelKind.CHECKPOINT
        prompts[kind] = root / f"prompts-{kind}.txt"
        prompts[kind].write_text("\n".join(TANG_PROMPTS if tang else ENGLISH_PROMPTS) + "\n", "utf-8")
        texts[kind] = root / f"text-{kind}.txt"
        texts[kind].write_text("\n".join(TANG_TEXT if tang else TEXT) + "\n", "utf-8")
    patches = {
        ModelKind.CHECKPOINT.value: random_patch(load_model(ckpt).module, root / "ckpt-patch"),
        ModelKind.TRANSFORMERS.value: random_patch(load_model(hf).module, root / "llama-patch"),
    }
    args = {"checkpoint": str(ckpt), "transformers": str(hf), "gguf": str(gguf), "name": "smollm2"}
    patched = {}
    for kind, patch in patches.items():
        patched[kind] = root / f"patched-{kind}"
        assert main(["loops", "apply", args[kind], str(patch), "--out", str(patched[kind])]) == 0
    return MatrixModels(args, cache, prompts, texts, patches, patched, gpt2, root / "work")


def rows(engine: str | None = None) -> list[Row]:
    """The declared rows; ``engine="vllm"`` only those that start vLLM, None every other one."""
    every = model_kinds_of()
    vllm = [r for r in every if r.backend == "vllm"]
    return vllm if engine == "vllm" else [r for r in every if r not in vllm]


def cell_argv(row: Row, kind: str, models: MatrixModels, extra: list[str], model: str | None = None) -> list[str]:
    """The command line of one cell: the command, MODEL (or ``model``), the row's smallest options, ``extra``."""
    out = models.work / f"{row.label.replace(' ', '-')}-{kind}"
    given = model if model is not None else models.model_arg(row, kind)
    return [*row.command, given, *row_options(row, kind, models, out), *extra]


def row_options(row: Row, kind: str, models: MatrixModels, out: Path) -> list[str]:
    """The smallest options that run each command through its path (``out``: the cell's own directory)."""
    prompts = ["--prompts", str(models.prompts[kind])]
    one_prompt = ["--prompt", (TANG_PROMPTS if kind == ModelKind.CHECKPOINT else ENGLISH_PROMPTS)[0]]
    loops = [*prompts, "--max-new-tokens", "16", "--no-progress", "--no-calibrate", "--json"]
    val = ["--val-text", str(models.texts[kind])]
    by_command: dict[tuple[str, ...], list[str]] = {
        ("generate",): [*prompts, "--max-new-tokens", "2", "--json"],
        ("verify-cache",): [*prompts, "--max-new-tokens", "3", "--json"],
        ("verify-speculative",): [*prompts, "--max-new-tokens", "3", "--exact-tokens", "2", "--json"],
        ("verify-serving",): ["--max-new-tokens", "2", "--dtypes", "float32", "--json"],
        ("quant-compare",): [
            "--types",
            "Q8_0",
            "--n-prompts",
            "2",
            "--max-new-tokens",
            "16",
            "--json",
            "--out",
            str(out),
        ],
        ("attention", "heads"): [*one_prompt, "--json"],
        ("attention", "padding-leak"): [*one_prompt, "--json"],
        ("loops", "scan"): [*loops, "--setting", "greedy"],
        ("loops", "locate"): [*loops, *val, "--out", str(out)],
        ("loops", "repair"): [*loops, *val, *REPAIR_SIZES, "--out", str(out)],
        ("loops", "compare"): [*loops, "--methods", "greedy", "--timing-rounds", "1", "--out", str(out)],
        ("loops", "apply"): [str(models.patches.get(kind, "patch.json")), "--out", str(out), "--json"],
        ("loops", "revert"): [str(models.patches.get(kind, "patch.json")), "--out", str(out), "--json"],
        ("doctor",): [*prompts, "--quick", "--only", "card", "inference", "--out", str(out), "--json"],
        ("phenomena",): [*prompts, "--count", "2", "--max-new-tokens", "16", "--no-timing", "--json"],
        ("case",): ["--quick", "--only", "cache_bugs", "--no-progress", "--out", str(out), "--json"],
        ("export-hf",): [str(out), "--json"],
        ("import-hf",): [str(out), "--json"],
        ("convert-gguf",): ["--out", str(out), "--json"],
    }
    backend = ["--backend", row.backend] if row.backend else []
    return [*by_command[row.command], *backend]


def run_cell(argv: list[str], kind: str, models: MatrixModels, capsys, monkeypatch) -> tuple[int, str, str]:
    """``genprobe ARGV`` in this process (torch is imported once), with the name cells' cache; (exit, out, err)."""
    if kind == ModelKind.NAME:
        monkeypatch.setenv("GENPROBE_CACHE_DIR", str(models.cache))
    capsys.readouterr()
    try:
        rc = main(argv)
    finally:
        if kind == ModelKind.NAME:
            monkeypatch.delenv("GENPROBE_CACHE_DIR")
    out, err = capsys.readouterr()
    return rc, out, err


def check_cell(row: Row, kind: str, rc: int, out: str, err: str, engine_missing: str | None = None) -> None:
    """A taken kind runs (or, where the engine's extra is not installed, says so in one line); another is refused
    in one line naming what the command takes."""
    where = f"{row.label} on a {kind}: exit {rc}\n{err[-3000:]}"
    if kind not in row.kinds:
        assert rc == 2, where
        lines = err.strip().splitlines()
        assert len(lines) == 1, where
        assert f"takes {kinds_phrase(tuple(ModelKind(k) for k in row.kinds))};" in lines[0], where
        assert ModelKind(kind).phrase in lines[0], where
        return
    if engine_missing is not None:
        assert rc == 2 and len(err.strip().splitlines()) == 1 and engine_missing in err, where
        return
    assert rc in RAN.get(row.command[0], (0,)), where
    json.loads(out)  # --json: the summary on stdout parses


def url_refused(row: Row, rc: int, err: str) -> None:
    """A URL is a URL (not the path ``http:/host/v1``): one line, exit 2 — where the command takes a live endpoint,
    the line asks for the reference it needs before anything is asked of the address."""
    where = f"{row.label} on a URL: exit {rc}\n{err[-2000:]}"
    assert rc == 2 and len(err.strip().splitlines()) == 1, where
    if ModelKind.URL in row.kinds:
        assert "give --reference MODEL" in err, where
        return
    assert "http://127.0.0.1:9/v1 is a URL: live endpoints are not supported yet" in err, where
