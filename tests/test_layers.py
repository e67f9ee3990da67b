"""The layering contract (issue #29): every import points down the layers, and no modules import each other in a
circle. The checker is ``scripts/layers.py``; the layers and the allowed same-layer imports are its ``LAYERS``
and ``PEERS``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "genprobe"


@pytest.fixture(scope="module")
def layers():
    """scripts/layers.py as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("genprobe_layers_script", REPO / "scripts" / "layers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def edges(layers):
    """Every intra-package import of src/genprobe (parsed once for this file's tests)."""
    return layers.imports_in(SRC)


def _tree(root: Path, files: dict[str, str]) -> Path:
    """A fake ``genprobe`` package under ``root``: every file of ``files`` (path -> source) plus ``__init__``s."""
    pkg = root / "genprobe"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for d in [pkg, *(p for p in pkg.rglob("*") if p.is_dir())]:
        (d / "__init__.py").touch()
    return pkg


def test_no_import_points_up(layers, edges):
    assert len(edges) > 100  # the checker sees the package's imports at all
    ups = layers.upward(edges)
    assert not ups, "imports that point up the layers:\n" + "\n".join(ups)


def test_no_import_cycles(layers, edges):
    found = layers.cycles(edges)
    shown = [" <-> ".join(c) + "\n  " + "\n  ".join(layers.inside(edges, c)) for c in found]
    assert not found, "import cycles:\n" + "\n".join(shown)


def test_every_sub_package_has_a_layer(layers):
    placed = {layers.component(m) for m in layers.module_names(SRC)}
    assert placed <= set(layers.LAYERS), f"sub-packages without a layer: {sorted(placed - set(layers.LAYERS))}"


def test_a_planted_upward_import_is_reported(layers, tmp_path):
    """Function-level and TYPE_CHECKING imports count; a same-layer import outside PEERS counts too."""
    pkg = _tree(
        tmp_path,
        {
            "engine/y.py": "X = 1\n",
            "model/x.py": "def f():\n    from ..engine.y import X\n    return X\n",
            "model/t.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import genprobe.engine.y\n",
            "report/r.py": "from ..experiments import e\n",
            "experiments/e.py": "",
        },
    )
    ups = layers.upward(layers.imports_in(pkg))
    shown = "\n".join(ups)
    assert "model/x.py:2: genprobe.model.x -> genprobe.engine.y (layer 1 model -> layer 2 engine)" in shown
    assert "model/t.py:3: genprobe.model.t -> genprobe.engine.y" in shown
    assert "genprobe.report.r -> genprobe.experiments.e (layer 4 report -> layer 4 experiments)" in shown
    assert len(ups) == 3, ups


def test_a_planted_cycle_is_reported_through_a_package_init(layers, tmp_path):
    """m imports engine.y, which runs engine/__init__, which imports a, which (at call time) imports m."""
    pkg = _tree(
        tmp_path,
        {
            "engine/__init__.py": "from . import a\n",
            "engine/a.py": "def f():\n    from ..model import m\n",
            "engine/y.py": "",
            "model/m.py": "from ..engine import y\n",
        },
    )
    planted = layers.imports_in(pkg)
    assert layers.cycles(planted) == [["genprobe.engine", "genprobe.engine.a", "genprobe.model.m"]]
    kept_by = layers.inside(planted, layers.cycles(planted)[0])
    assert any(line.endswith("engine/a.py:2: genprobe.engine.a -> genprobe.model.m") for line in kept_by), kept_by


def test_a_clean_tree_passes(layers, tmp_path):
    pkg = _tree(tmp_path, {"engine/y.py": "from ..model import x\n", "model/x.py": "import torch\n"})
    planted = layers.imports_in(pkg)
    assert [(e.source, e.target) for e in planted] == [("genprobe.engine.y", "genprobe.model.x")]
    assert layers.upward(planted) == [] and layers.cycles(planted) == []
