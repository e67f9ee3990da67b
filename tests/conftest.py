"""Shared fixtures: a tiny random model, and one quickly trained Tang checkpoint.

The trained checkpoint (the quick recipe, 600 steps) is bundled in ``tests/data`` for the recipe and torch of this
commit; with another torch it is trained once (≈75 s of a core) and cached under ``$GENPROBE_TEST_CACHE`` — also
under ``pytest -n N`` (pytest-xdist, what ``scripts/test.sh`` runs), where a file lock lets one worker train while
the others wait for the file (see shared_checkpoint.py).

Under xdist each worker runs torch on one thread (two workers on two cores, not four threads fighting), and
the vLLM tests run on one worker (``--dist loadgroup``): a started engine per configuration is reused across
them, and each engine holds its own copy of the model and torch. So do the tests of each compiled-decode file (see
:data:`XDIST_GROUPS`). genprobe's kernels and AOT packages are built once under a file lock (a worker needing one
being built waits for it); Inductor's own code may be built by two workers at once, written atomically by torch.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from genprobe.corpus.tang import load_corpus
from genprobe.corpus.tokenizer import CharTokenizer
from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT

# The compiled path's AOT programs build inside the call that needs them, as the tests of that path expect; the
# background build a user gets by default has its own test (tests/engine/test_aot_background.py).
os.environ.setdefault("GENPROBE_AOT_BACKGROUND", "0")

REPO = Path(__file__).resolve().parents[1]
XDIST_GROUPS = {  # worker group -> the test files that share it
    "vllm": (
        "matrix/test_command_matrix_vllm.py",
        "serving/test_engine_options.py",
        "serving/test_loops_cli_vllm.py",
        "serving/test_monitor_vllm.py",
        "serving/test_sampling_map.py",
        "serving/test_scan_vllm.py",
        "serving/test_verify_serving.py",
    ),
    # Each file of compiled-decode tests on one worker: its tests compile the same few shapes (10-30 s of a core
    # each, cold), often for the same model, which one process compiles once and then reuses; spread over the
    # workers, as single tests are, both processes would compile them, at the same time. xdist sends the groups
    # with the most tests first, so the other worker runs the short tests meanwhile.
    "torch-compile": ("engine/test_compiled_decode.py",),
    "torch-compile-stepwise": ("engine/test_compiled_stepwise.py",),
    "aot": ("engine/test_aot_decode.py",),
    "weight-only": ("engine/test_weight_only.py",),
    "llama-family": ("engine/test_llama_family.py",),
    "speed-benchmark": ("engine/test_generate_speed_smoke.py",),
}

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the marks into the scheduler's groups
def pytest_collection_modifyitems(config, items):
    """Pin the tests of :data:`XDIST_GROUPS` to one worker each (a no-op without xdist)."""
    group_of = {f: g for g, files in XDIST_GROUPS.items() for f in files}
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(REPO / "tests").as_posix()
        if rel in group_of:
            item.add_marker(pytest.mark.xdist_group(group_of[rel]))
            if getattr(config.option, "loadgroup", False):  # set by xdist under -n with --dist loadgroup
                _group_node_id(item, group_of[rel])


def _group_node_id(item: pytest.Item, group: str) -> None:
    """Suffix the test's id with ``@group``, which is how xdist's loadgroup scheduler reads a group. xdist 3.8
    does it by assigning ``item._nodeid``, which pytest 9 no longer reads (ids are ``item._id``), so every group
    would be scattered over the workers; on an older pytest xdist's own suffix follows ours (same group)."""
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # pytest < 9: xdist's own hook works
        return
    item._id = NodeId.parse(f"{item.nodeid}@{group}")


@pytest.fixture(scope="session")
def corpus():
    """The default corpus (first 4,003 poems)."""
    return load_corpus()


@pytest.fixture(scope="session")
def tokenizer(corpus):
    """The default 1,200-character tokenizer."""
    return CharTokenizer.from_text(corpus.text, 1200)


@pytest.fixture
def tiny_cfg() -> GPTConfig:
    """A small random config for fast structural tests."""
    return GPTConfig(vocab_size=50, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=32)


@pytest.fixture
def tiny_model(tiny_cfg) -> GPT:
    """A seeded random tiny GPT in eval mode."""
    torch.manual_seed(0)
    return GPT(tiny_cfg).eval()


@pytest.fixture(scope="session")
def trained_ckpt() -> Path:
    """Path of a Tang checkpoint trained with the quick recipe (shared by all tests; see shared_checkpoint.py)."""
    # By path: under --import-mode=importlib the tests directory is not on sys.path.
    spec = importlib.util.spec_from_file_location("shared_checkpoint", Path(__file__).with_name("shared_checkpoint.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path: Path = module.trained_checkpoint()
    return path


@pytest.fixture(scope="session")
def trained(trained_ckpt):
    """(model, tokenizer, meta) of the shared trained checkpoint."""
    from genprobe.model.checkpoint import load_checkpoint

    return load_checkpoint(trained_ckpt)
