"""The test-suite's trained Tang checkpoint (the quick recipe, 600 steps): built once, cached on disk.

Not a test module: ``tests/conftest.py`` takes the checkpoint from :func:`trained_checkpoint`, and
``scripts/test.sh`` runs this file while lint and types check (``python tests/shared_checkpoint.py``), on the core
mypy leaves free, so that the tests start with it built (≈75 s of one core) instead of one pytest worker training
while the other waits for the file.

Cached under ``$GENPROBE_TEST_CACHE`` (default ``<repo>/.test-cache``), keyed by the recipe and the torch version; a
file lock lets one process train while the others wait (pytest-xdist workers, or this script and a test run).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

from filelock import FileLock

REPO = Path(__file__).resolve().parents[1]


def trained_checkpoint() -> Path:
    """Path of a Tang checkpoint trained with the quick recipe on the default corpus and tokenizer (trained unless
    cached)."""
    import torch

    from genprobe.corpus import CharTokenizer, load_corpus
    from genprobe.model.checkpoint import is_checkpoint, save_checkpoint
    from genprobe.model.train import quick_train_config, train

    tc = quick_train_config()
    key = hashlib.sha256(json.dumps(asdict(tc), sort_keys=True).encode() + torch.__version__.encode()).hexdigest()[:12]
    root = Path(os.environ.get("GENPROBE_TEST_CACHE", REPO / ".test-cache"))
    d = root / f"tang-quick-{key}"
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f"tang-quick-{key}.lock")):  # one process trains, the others wait
        if not is_checkpoint(d):
            corpus = load_corpus()  # the default corpus and tokenizer, as the fixtures of conftest.py
            tokenizer = CharTokenizer.from_text(corpus.text, 1200)
            r = train(corpus, tokenizer, tc=tc, progress=False)
            save_checkpoint(d, r.model, tokenizer, r.summary)
    return d


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)  # beside mypy: one core each
    print(trained_checkpoint())
