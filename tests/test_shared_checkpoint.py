"""The bundled test checkpoint is the one the quick recipe trains (else every fresh run trains it again, ~75 s of a
core: after changing the recipe, ``python tests/shared_checkpoint.py --bundle``)."""

from __future__ import annotations

import json
from dataclasses import asdict

import torch

from genprobe.model.train import quick_train_config

from .shared_checkpoint import BUNDLED


def test_the_bundled_checkpoint_is_the_quick_recipes_and_the_fixture_uses_it(trained_ckpt):
    bundled = sorted(BUNDLED.glob("tang-quick-*"))
    assert len(bundled) == 1, bundled  # --bundle removes the stale one
    summary = json.loads((bundled[0] / "genprobe.json").read_text(encoding="utf-8"))["summary"]
    assert summary["train_config"] == json.loads(json.dumps(asdict(quick_train_config())))
    if summary["torch"] == torch.__version__:
        assert trained_ckpt == bundled[0]
    else:  # another torch trains its own (its sums may differ in the last bits)
        assert trained_ckpt.parent != BUNDLED
