"""Code-hygiene figures for the library/CLI issue: long functions, HTML written in Python, loaders, flag spellings.

Usage: python scripts/hygiene.py [SRC_DIR]   (default src/genprobe). Prints one JSON object.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

LONG = 60
HTML_TAG = re.compile(
    r"</?(html|head|body|div|span|table|tr|td|th|p|h[1-6]|ul|li|section|figure|img|script|style|a|code|pre|details"
    r"|summary)\b[^>]*>",
    re.I,
)
LOADER_CALLS = ("from_pretrained(", "load_checkpoint(", "load_model(")


def long_functions(src: Path) -> list[str]:
    """Functions longer than LONG lines, as path:name:lines."""
    out = []
    for f in sorted(src.rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LONG:
                    out.append(f"{f.relative_to(src)}:{node.name}:{n}")
    return out


def html_lines_in_python(src: Path) -> int:
    """Lines of .py files that contain an HTML tag inside the code (hand-written HTML)."""
    return sum(
        1 for f in src.rglob("*.py") for line in f.read_text(encoding="utf-8").splitlines() if HTML_TAG.search(line)
    )


def model_loading_sites(src: Path) -> list[str]:
    """Modules outside the loader that call a model-loading function themselves."""
    sites = []
    for f in sorted(src.rglob("*.py")):
        text = f.read_text(encoding="utf-8")
        for call in LOADER_CALLS:
            for m in re.finditer(re.escape(call), text):
                line = text[: m.start()].count("\n") + 1
                if not text.splitlines()[line - 1].lstrip().startswith(("def ", "#", '"""')):
                    sites.append(f"{f.relative_to(src)}:{line}:{call[:-1]}")
    return sites


def main() -> None:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "src/genprobe")
    longs = long_functions(src)
    print(
        json.dumps(
            {
                "functions_over_60_lines": len(longs),
                "long_functions": longs,
                "html_lines_in_python": html_lines_in_python(src),
                "model_loading_call_sites": model_loading_sites(src),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
