"""Issue #29: no never-called public function. Every module-level public function of the package is named somewhere
besides its own definition: by the package, a test, a benchmark, a script or a documentation page (an API the docs
show is used). ``serving.scan.scan_loops_backend``, a hook nothing called, was removed."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "src" / "genprobe"


def _text(*dirs: str, suffixes: tuple[str, ...]) -> str:
    return "\n".join(
        p.read_text(encoding="utf-8", errors="ignore")
        for d in dirs
        for p in (REPO / d).rglob("*")
        if p.suffix in suffixes and p.is_file() and ".egg-info" not in str(p)
    )


def test_every_public_function_is_used_somewhere():
    corpus = _text("src", "tests", "benchmarks", "scripts", suffixes=(".py", ".sh"))
    corpus += _text("docs", suffixes=(".md",)) + (REPO / "README.md").read_text(encoding="utf-8")
    words = Counter(re.findall(r"\w+", corpus))  # whole-word counts, once (a regex per name took 37 s)
    unused = []
    for path in PKG.rglob("*.py"):
        for name in re.findall(r"^def ([a-z][a-z0-9_]*)\(", path.read_text(encoding="utf-8"), re.M):
            if words[name] <= 1:
                unused.append(f"{path.relative_to(PKG)}:{name}")
    assert unused == []


def test_the_unused_scan_backend_hook_is_gone():
    assert "scan_loops_backend" not in (PKG / "serving" / "scan.py").read_text(encoding="utf-8")
