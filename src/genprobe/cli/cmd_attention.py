"""Attention entropy / mass per head, mask validation, padding-leak test.

    genprobe attention heads MODEL [--prompt TEXT | --ids ID ...] [--distance 8] [--out DIR] [--json]
    genprobe attention check-masks BATCH.jsonl [--pad-id N] [--json]                 # exit 1 on findings
    genprobe attention padding-leak MODEL [--prompt TEXT ... | --ids ID ...] [--no-position-ids]  # exit 1 on a leak

MODEL is a genprobe checkpoint or a transformers directory. heads reports, per layer and head, the attention
entropy and where the probability mass goes (far keys, the first token, the query itself, the last few keys).

BATCH.jsonl: one JSON object per row, ``{"input_ids": [...], "attention_mask": [...],
"position_ids": [...]}`` (position_ids optional, all rows or none; ``"pad_token_id"`` may appear on any
row), or a single object whose values are lists of rows.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .._io import json_safe
from ._common import (
    MODEL_KINDS,
    Accumulate,
    Column,
    Command,
    Once,
    add_prompt_arguments,
    emit_json,
    fmt,
    info,
    integers,
    load_model_arg,
    option,
    read_prompts,
    table,
)

DEFAULT_TEXT = "白日依山盡黃河入海流欲窮千里目更上一層樓"
LEAK_TEXTS = ("已驚飛。方從列子御", "白日依山盡黃河入海流", "春眠不覺曉處處聞啼鳥夜來風雨聲花落知多少")
LONG_TABLE_HEADS = 64  # above this many heads, the text output is the compact grid (one line per layer)


def heads_options(h: argparse.ArgumentParser) -> None:
    add_prompt_arguments(h, help_default=f" (default: {DEFAULT_TEXT})")
    option(h, "--ids", nargs="+", action=Once, metavar="ID", help="token ids instead of --prompt (no tokenizer)")
    option(h, "--distance", 8, "far-mass threshold d in positions")
    option(h, "--local-window", 2, "local mass: keys 0..W positions back")
    option(h, "--out", metavar="DIR", help="write attention.json, heads.png (layers × heads) and entropy.png here")
    maps = "with --out: a query × key map per head of these layers (no LAYER: every layer)"
    option(h, "--maps", nargs="*", action=Accumulate, type=int, metavar="LAYER", help=maps)
    tables = f"one line per head (long), a grid per metric, or auto: long up to {LONG_TABLE_HEADS} heads"
    option(h, "--table", "auto", tables, choices=("auto", "long", "grid"))


def check_masks_options(c: argparse.ArgumentParser) -> None:
    c.add_argument("batch", metavar="BATCH.jsonl", help="one JSON object per row (see `genprobe attention -h`)")
    option(c, "--pad-id", type=int, help="pad token id (overrides the file's pad_token_id)")


def padding_leak_options(k: argparse.ArgumentParser) -> None:
    add_prompt_arguments(k, help_default=" (one sequence each; default: three Tang lines)")
    option(k, "--ids", nargs="+", action=Once, metavar="ID", help="token ids of one sequence instead of --prompt")
    option(k, "--pad-id", type=int, help="pad token id (default: the model's)")
    option(k, "--no-position-ids", False, "do not pass position_ids (transformers models)")
    option(k, "--threshold", 1e-4, "max |Δlogit| tolerated")


# ------------------------------------------------------------------------------------------------
def _sequences(args, model, default: tuple[str, ...]) -> list[list[int]]:
    """Token ids of each sequence: ``--ids``, else the prompts (or ``default``) through the model's tokenizer."""
    if args.ids:
        return [integers("--ids", args.ids)]
    if model.tokenizer is None:
        raise ValueError(f"{model.source} has no tokenizer: give token ids with --ids instead of text")
    seqs = [model.encode(t) for t in (read_prompts(args) or default)]
    if any(not s for s in seqs):
        raise ValueError("a prompt encodes to no tokens")
    return seqs


def run_heads(args) -> int:
    """Per-head attention statistics of one sequence; optional JSON, heads grid, entropy plot and per-head maps."""
    from ..attention.capture import capture_attention
    from ..attention.metrics import attention_report

    if args.maps is not None and not args.out:
        raise ValueError("--maps writes image files: give --out DIR too")
    model = load_model_arg(args)
    seqs = _sequences(args, model, (DEFAULT_TEXT,))
    if len(seqs) > 1:
        raise ValueError(f"heads analyses one sequence; got {len(seqs)} prompts")
    cap = capture_attention(model.module, seqs[0])
    if cap.note:
        info(f"note: {cap.note}")
    labels = [model.tokenizer.token_str(i) if model.tokenizer else str(i) for i in cap.tokens]
    rep = json_safe(attention_report(cap, distance=args.distance, local_window=args.local_window, tokens_text=labels))
    if args.out:
        from .._io import atomic_write_json
        from ..attention.plots import entropy_plot, head_heatmaps, heads_grid_plot

        out = Path(args.out)
        atomic_write_json(out / "attention.json", rep)
        heads_grid_plot(rep, out / "heads.png")
        entropy_plot(rep, out / "entropy.png")
        names = {"json": "attention.json", "heads_plot": "heads.png", "entropy_plot": "entropy.png"}
        files: dict[str, Any] = {k: str(out / name) for k, name in names.items()}
        maps = ""
        if args.maps is not None:
            files["heatmaps"] = [str(m) for m in head_heatmaps(cap, out, labels, layers=args.maps or None)]
            maps = f" and {len(files['heatmaps'])} per-head maps"
        info(f"wrote {out}/attention.json, heads.png, entropy.png{maps}")
        rep["files"] = files
    if args.json:
        emit_json({k: v for k, v in rep.items() if k != "per_position"} | {"per_position": "see attention.json"})
        return 0
    print(f"{len(cap.tokens)} tokens: {''.join(labels)}")
    grid = args.table == "grid" or (args.table == "auto" and cap.n_layer * cap.n_head > LONG_TABLE_HEADS)
    print(format_grid(rep) if grid else format_table(rep))
    if not args.out:
        info("(use --out DIR to save attention.json, the layers × heads heatmaps and the entropy plot)")
    return 0


def format_table(rep: dict) -> str:
    """One line per (layer, head) of an attention report's JSON form, then the layer's mean line."""
    from ..attention.metrics import METRICS

    metric = lambda k: lambda h: fmt(h[k], ".3f")  # noqa: E731
    cols: list[Column] = [
        ("layer", 5, lambda h: h["layer"]),
        ("head", 4, lambda h: "mean" if h["head"] is None else h["head"]),
    ]
    names = ("H(nats)", "H/lnN", f">{rep['distance']} far", "sink", "diag", "local")
    cols += [(n, max(6, len(n)), metric(k)) for n, k in zip(names, METRICS, strict=True)]
    rows = [h for layer in rep["layers"] for h in [*(h for h in rep["heads"] if h["layer"] == layer["layer"]), layer]]
    return table(cols, rows, rule=True)


def format_grid(rep: dict) -> str:
    """Compact text form for deep models: per grid metric, one line per layer and one column per head."""
    from ..attention.metrics import GRID_METRICS, head_matrix, title

    blocks = []
    for metric in GRID_METRICS:
        cell = lambda h: lambda row: fmt(row[1][h], ".2f")  # noqa: E731
        cols: list[Column] = [("layer", 5, lambda row: row[0]), *((str(h), 5, cell(h)) for h in range(rep["n_head"]))]
        grid = table(cols, enumerate(head_matrix(rep, metric)))
        blocks.append(f"{title(rep, metric)} — rows: layers, columns: heads\n{grid}")
    return "\n\n".join(blocks)


def run_check_masks(args) -> int:
    """Validate a batch file; exit status 1 when any rule is violated."""
    from ..attention.masks import check_masks, load_batch_jsonl

    batch = load_batch_jsonl(args.batch)
    pad = args.pad_id if args.pad_id is not None else batch["pad_token_id"]
    findings = check_masks(batch["input_ids"], batch["attention_mask"], batch["position_ids"], pad)
    rows = len(batch["input_ids"])
    if args.json:
        emit_json({"file": args.batch, "rows": rows, "pad_token_id": pad, "findings": findings, "ok": not findings})
    else:
        for f in findings:
            print(f)
        print(f"{rows} rows, {len(findings)} finding(s)" + ("" if findings else ": masks look valid"))
    return 1 if findings else 0


def run_padding_leak(args) -> int:
    """Each sequence alone vs inside padded batches; exit status 1 on a leak."""
    from ..attention.leak import padding_leak

    model = load_model_arg(args)
    pad = args.pad_id if args.pad_id is not None else model.pad_id
    seqs = _sequences(args, model, LEAK_TEXTS)
    rep = padding_leak(model.module, seqs, pad, position_ids=not args.no_position_ids, threshold=args.threshold)
    if args.json:
        emit_json(rep)
        return 1 if rep.leak else 0
    ids = "yes" if rep.position_ids else "no"
    print(f"padding leak — {rep.model}, position_ids={ids}, threshold {rep.threshold:g}")
    cols: list[Column] = [("seq", 4, lambda s: s.index), ("len", 4, lambda s: s.length)]
    delta = lambda side: lambda s: f"{s.delta[side]:.2e}"  # noqa: E731
    cols += [(f"Δ {side}", 10, delta(side)) for side in rep.sides]
    print(table([*cols, (" verdict", 8, lambda s: "LEAK" if s.leak else "ok")], rep.sequences))
    print(f"max |Δlogit| = {rep.max_delta:.3e} → {rep.verdict}")
    return 1 if rep.leak else 0


ANY: dict[str, Any] = {"model": MODEL_KINDS, "optional_model": True}
HEADS = "entropy and attention mass per layer and head, heatmaps"
CHECK_MASKS = "validate input_ids / attention_mask / position_ids batches (exit 1)"
PADDING_LEAK = "logits alone vs inside left/right-padded batches (exit 1 on a leak)"
ACTIONS = (
    Command("heads", HEADS, run_heads, heads_options, **ANY),
    Command("check-masks", CHECK_MASKS, run_check_masks, check_masks_options),
    Command("padding-leak", PADDING_LEAK, run_padding_leak, padding_leak_options, **ANY),
)
COMMANDS = (Command("attention", __doc__, actions=ACTIONS),)
