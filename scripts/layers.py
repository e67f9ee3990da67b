"""Check that genprobe's imports only point down its layers, and that no modules import each other in a circle.

Usage: python scripts/layers.py [SRC_DIR]   (default src/genprobe). Prints every upward import and every
import cycle, then the two counts; exits 1 when either is non-zero.

Every import counts: module-level, inside a function, under ``TYPE_CHECKING``; relative (``from ..engine``)
and absolute (``genprobe.engine``). Importing ``a.b.c`` also runs the ``__init__`` of ``a.b``, so a cycle
through a package's ``__init__`` is a cycle. The layers, bottom to top (a module may import its own
layer's sub-package or any lower layer; another sub-package of its own layer only where ``PEERS`` allows.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = "genprobe"
# Sub-package (or top-level module) -> layer; "" is genprobe/__init__.py.
LAYERS = {
    "_io": 0,
    "_templates": 0,
    "_version": 0,
    "registry": 0,
    "corpus": 0,
    "metrics": 0,
    "model": 1,
    "engine": 2,
    "verify": 3,
    "attention": 3,
    "loops": 3,
    "serving": 3,
    "experiments": 4,
    "report": 4,
    "doctor": 4,
    "api": 5,
    "cli": 5,
    "__main__": 5,
    "": 5,
}
# Same-layer imports between different sub-packages that are allowed (importer, imported), with why.
PEERS = {
    ("corpus", "registry"),  # the English corpus is a pinned download
    ("corpus", "_io"),  # JSON Lines files are read by the one reader, _io.read_jsonl (#45)
    ("registry", "_io"),  # every cache writer takes the cache lock of _io (#52)
    ("metrics", "_io"),  # results serialise through the one JSON form, _io.json_safe (#45)
    ("corpus", "metrics"),  # human text follows the prompts' script: Han characters as metrics.legit counts them
    ("serving", "loops"),  # a loop scan through vLLM reuses the scan's prompts, measures and tables
    ("serving", "verify"),  # verify-serving judges with verify's thresholds and verdicts
    ("experiments", "report"),  # the case study writes its report
    ("__main__", "cli"),  # `python -m genprobe` is the CLI
}


@dataclass(frozen=True)
class Import:
    """One import statement's edge: ``source`` (a module) imports ``target`` (a module) at ``path:line``."""

    source: str
    target: str
    path: str
    line: int


def module_names(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the package directory ``src``."""
    names = {}
    for f in sorted(src.rglob("*.py")):
        parts = [ROOT, *f.relative_to(src).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = f
    return names


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute dotted name ``from <...> import`` refers to, relative to ``module``."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(node: ast.AST, module: str, is_package: bool, known: dict[str, Path]) -> list[str]:
    """Modules one import node names: ``from pkg import sub`` names the submodule when it is one."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = _resolve(module, is_package, node)
    subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
    return subs if len(subs) == len(node.names) else [base, *subs]


def _owning_module(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies inside (an attribute path ends at its module)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in known:
            return ".".join(parts[:i])
    return None


def imports_in(src: Path) -> list[Import]:
    """Every intra-package import edge under ``src``, wherever the statement sits in the file."""
    known = module_names(src)
    edges = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            for name in _targets(node, module, is_package, known):
                target = _owning_module(name, known) if name.split(".")[0] == ROOT else None
                if target is not None and target != module:
                    edges.append(Import(module, target, str(path), getattr(node, "lineno", 0)))
    return edges


def component(module: str) -> str:
    """The sub-package (or top-level module) a dotted name belongs to; "" for the package root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward(edges: list[Import]) -> list[str]:
    """Imports of a higher layer, of a same-layer sub-package that ``PEERS`` does not allow, or of or from a
    sub-package that ``LAYERS`` does not place."""
    out = []
    for e in edges:
        a, b = component(e.source), component(e.target)
        if a not in LAYERS or b not in LAYERS:  # a new sub-package must be given its place first
            missing = a if a not in LAYERS else b
            out.append(f"{e.path}:{e.line}: {e.source} -> {e.target} ({missing} has no layer in LAYERS)")
            continue
        la, lb = LAYERS[a], LAYERS[b]
        if lb > la or (lb == la and a != b and (a, b) not in PEERS):
            names = f"layer {la} {a or ROOT} -> layer {lb} {b or ROOT}"
            out.append(f"{e.path}:{e.line}: {e.source} -> {e.target} ({names})")
    return sorted(out)


def _graph(edges: list[Import]) -> dict[str, set[str]]:
    """Module -> modules it imports, plus the ``__init__`` of every package the import enters from outside."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        parts = e.target.split(".")
        entered = {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
        own = {".".join(e.source.split(".")[:i]) for i in range(1, e.source.count(".") + 2)}
        graph.setdefault(e.source, set()).update(entered - own)
    return graph


def cycles(edges: list[Import]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted, largest first."""
    graph = _graph(edges)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found, key=lambda c: (-len(c), c))


def inside(edges: list[Import], cycle: list[str]) -> list[str]:
    """The imports that keep ``cycle`` together, as ``path:line: source -> target`` (the package ``__init__`` a
    target enters counts as that package)."""
    members = set(cycle)
    out = []
    for e in edges:
        entered = [m for m in _graph([e]).get(e.source, ()) if m in members]
        if e.source in members and entered:
            out.append(f"{e.path}:{e.line}: {e.source} -> {e.target}")
    return sorted(out)


def main() -> int:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "src/genprobe")
    edges = imports_in(src)
    ups, circles = upward(edges), cycles(edges)
    for line in ups:
        print("upward:", line)
    for c in circles:
        print(f"cycle ({len(c)} modules):", " <-> ".join(c))
        for line in inside(edges, c):
            print("   ", line)
    print(f"{len(edges)} intra-package imports; {len(ups)} upward; {len(circles)} cycles")
    return 1 if ups or circles else 0


if __name__ == "__main__":
    sys.exit(main())
