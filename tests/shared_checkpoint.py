"""The test-suite's trained Tang checkpoint (the quick recipe, 600 steps): bundled, else built once and cached.

Not a test module: ``tests/conftest.py`` takes the checkpoint from :func:`trained_checkpoint`.

Training it costs ≈75 s of a core, an eighth of a fresh test run on the 2-core machines, so the checkpoint the recipe
trains is committed under ``tests/data/tang-quick-<key>/`` (1.7 MB of safetensors and the tokenizer's JSON), where
``<key>`` hashes the recipe and the torch version. A checkout whose recipe or torch differs from the bundled one's
trains its own instead, once, under ``$GENPROBE_TEST_CACHE`` (default ``<repo>/.test-cache``): a file lock lets one
process train while the others wait (pytest-xdist workers, or ``python tests/shared_checkpoint.py`` beside a test
run); it trains into a temporary directory beside the checkpoint and renames it, so a run killed while training
leaves nothing that looks trained, and the next one removes what it left (genprobe._io.write_once, #52). After a
change of the recipe or of torch, ``python tests/shared_checkpoint.py --bundle`` trains the new
checkpoint into ``tests/data`` (removing the stale one) for the next commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from genprobe._io import fault_point, temp_beside, write_once

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "tests" / "data"  # tang-quick-<key>/: the checkpoint of the current recipe and torch


def recipe_key() -> str:
    """Hash of the quick recipe and the torch version: what the trained weights depend on."""
    import torch

    from genprobe.model.train import quick_train_config

    tc = quick_train_config()
    return hashlib.sha256(json.dumps(asdict(tc), sort_keys=True).encode() + torch.__version__.encode()).hexdigest()[:12]


def trained_checkpoint() -> Path:
    """Path of a Tang checkpoint trained with the quick recipe on the default corpus and tokenizer: the bundled one
    when it is of this recipe and torch, else one trained here (unless cached)."""
    from genprobe.model.checkpoint import is_checkpoint

    key = recipe_key()
    bundled = BUNDLED / f"tang-quick-{key}"
    if is_checkpoint(bundled):
        return bundled
    root = Path(os.environ.get("GENPROBE_TEST_CACHE", REPO / ".test-cache"))
    d = root / f"tang-quick-{key}"
    # One process trains, the others wait for it and then load what it wrote.
    write_once(d, is_checkpoint, lambda: _train_atomically(d), f"the test checkpoint {d}")
    return d


def _train_atomically(d: Path) -> None:
    """Train into a temporary directory beside ``d``, then rename it to ``d``."""
    tmp = temp_beside(d, directory=True)
    try:
        _train_into(tmp)
        fault_point("checkpoint:trained")
        if d.exists():  # an incomplete directory a killed run of the older, in-place save left
            shutil.rmtree(d)
        os.replace(tmp, d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _train_into(d: Path) -> None:
    from genprobe.corpus.tang import load_corpus
    from genprobe.corpus.tokenizer import CharTokenizer
    from genprobe.model.checkpoint import save_checkpoint
    from genprobe.model.train import quick_train_config, train

    corpus = load_corpus()  # the default corpus and tokenizer, as the fixtures of conftest.py
    tokenizer = CharTokenizer.from_text(corpus.text, 1200)
    r = train(corpus, tokenizer, tc=quick_train_config(), progress=False)
    save_checkpoint(d, r.model, tokenizer, r.summary)


def bundle() -> Path:
    """Train the checkpoint of the current recipe into ``tests/data`` and remove any bundled one of another."""
    key = recipe_key()
    target = BUNDLED / f"tang-quick-{key}"
    for stale in BUNDLED.glob("tang-quick-*"):
        if stale != target:
            shutil.rmtree(stale)
    if not target.exists():
        _train_into(target)
    return target


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)  # as the pytest workers train it (a product's sums can differ in order with threads)
    print(bundle() if "--bundle" in sys.argv[1:] else trained_checkpoint())
