"""``genprobe attention``: per-head attention diagnostics, mask validation and the padding-leak test.

Usage (the first positional is either a model checkpoint or one of the two actions)::

    genprobe attention CKPT --text 白日依山盡 [--distance 8] [--out DIR] [--json]
    genprobe attention --hf DIR --text "hello world" [--out DIR]
    genprobe attention check-masks BATCH.jsonl [--pad-id N] [--json]      # exit 1 on findings
    genprobe attention padding-leak (CKPT | --hf DIR) [--no-position-ids]  # exit 1 on a leak

A checkpoint directory literally named ``check-masks`` / ``padding-leak`` must be written ``./check-masks``.

BATCH.jsonl: one JSON object per row, ``{"input_ids": [...], "attention_mask": [...],
"position_ids": [...]}`` (position_ids optional, all rows or none; ``"pad_token_id"`` may appear on any
row), or a single object whose values are lists of rows.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._common import add_json_flag, emit_json, info

ACTIONS = ("check-masks", "padding-leak")
DEFAULT_TEXT = "白日依山盡黃河入海流欲窮千里目更上一層樓"
LEAK_TEXTS = ("已驚飛。方從列子御", "白日依山盡黃河入海流", "春眠不覺曉處處聞啼鳥夜來風雨聲花落知多少")


def register(sub) -> None:
    """Add the ``attention`` sub-command."""
    p = sub.add_parser(
        "attention",
        help="attention entropy / long-range mass per head, mask validation, padding-leak test",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("target", nargs="?", help="checkpoint directory, or the action 'check-masks' / 'padding-leak'")
    p.add_argument("path", nargs="?", help="check-masks: the BATCH.jsonl file; padding-leak: the checkpoint")
    p.add_argument("--hf", metavar="DIR", help="a local transformers causal-LM directory (safetensors) instead of CKPT")
    p.add_argument("--text", action="append", help="text to analyse (padding-leak: repeatable, one sequence each)")
    p.add_argument("--ids", help="comma-separated token ids instead of --text (e.g. for an HF model without tokenizer)")
    p.add_argument("--distance", type=int, default=8, help="far-mass threshold d in positions (default 8)")
    p.add_argument("--local-window", type=int, default=2, help="local mass: keys 0..W positions back (default 2)")
    p.add_argument("--out", metavar="DIR", help="write attention.json, per-head heatmaps and entropy.png here")
    p.add_argument("--pad-id", type=int, help="pad token id (check-masks: overrides the file; padding-leak: default tokenizer's)")
    p.add_argument("--no-position-ids", action="store_true", help="padding-leak: do not pass position_ids (HF)")
    p.add_argument("--threshold", type=float, default=1e-4, help="padding-leak: max |Δlogit| tolerated (default 1e-4)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Dispatch on the first positional."""
    if args.target == "check-masks":
        return _check_masks(args)
    if args.target == "padding-leak":
        return _padding_leak(args, args.path)
    if args.path is not None:
        raise ValueError(f"unexpected extra argument {args.path!r} (actions are {', '.join(ACTIONS)})")
    return _analyse(args, args.target)


# ------------------------------------------------------------------------------------------------
def load_model(ckpt: str | None, hf_dir: str | None):
    """(model, encode(text)->ids, decode_token(id)->str, pad_id) for a checkpoint or an HF directory."""
    if (ckpt is None) == (hf_dir is None):
        raise ValueError("give exactly one model: a checkpoint directory or --hf DIR")
    if ckpt is not None:
        from ..model.checkpoint import load_checkpoint

        model, tok, _ = load_checkpoint(ckpt)
        return model, tok.encode, tok.token_str, 0
    d = Path(hf_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"--hf directory not found: {d}")
    from transformers import AutoModelForCausalLM

    # Eager attention is the only implementation that returns weights; never run remote code or unpickle.
    model = AutoModelForCausalLM.from_pretrained(
        d, attn_implementation="eager", local_files_only=True, use_safetensors=True, trust_remote_code=False
    ).eval()
    tok = None
    if any((d / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")):
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(d, local_files_only=True, trust_remote_code=False)
        except Exception as exc:  # noqa: BLE001 - unreadable tokenizer: ids only
            info(f"note: could not load the tokenizer of {d} ({exc}); use --ids")

    def encode(text: str) -> list[int]:
        if tok is None:
            raise ValueError(f"{d} has no tokenizer; pass --ids instead of --text")
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise ValueError(f"text {text!r} encodes to no tokens")
        return ids

    def token_str(i: int) -> str:
        return str(i) if tok is None else tok.decode([i])

    pad = getattr(tok, "pad_token_id", None) if tok is not None else None
    if pad is None:
        pad = getattr(model.config, "pad_token_id", None) or getattr(model.config, "eos_token_id", None) or 0
    if isinstance(pad, list):
        pad = pad[0]
    return model, encode, token_str, int(pad)


def _ids_from(args, encode) -> list[list[int]]:
    if args.ids:
        try:
            return [[int(t) for t in args.ids.split(",") if t.strip()]]
        except ValueError:
            raise ValueError(f"--ids must be comma-separated integers, got {args.ids!r}") from None
    return [encode(t) for t in (args.text or [DEFAULT_TEXT])]


def _analyse(args, ckpt: str | None) -> int:
    from ..attention.capture import capture_attention
    from ..attention.metrics import attention_report, format_table

    if ckpt is None and args.hf is None:
        raise ValueError("give a checkpoint directory, --hf DIR, or an action (check-masks, padding-leak)")
    model, encode, token_str, _ = load_model(ckpt, args.hf)
    ids = _ids_from(args, encode)[0]
    cap = capture_attention(model, ids)
    if cap.note:
        info(f"note: {cap.note}")
    labels = [token_str(i) for i in cap.tokens]
    rep = attention_report(cap, distance=args.distance, local_window=args.local_window, tokens_text=labels)
    if args.out:
        from .._io import atomic_write_json
        from ..attention.plots import entropy_plot, head_heatmaps

        out = Path(args.out)
        atomic_write_json(out / "attention.json", rep)
        maps = head_heatmaps(cap, out, labels)
        entropy_plot(rep, out / "entropy.png")
        rep["files"] = {"json": str(out / "attention.json"), "entropy_plot": str(out / "entropy.png"),
                        "heatmaps": [str(m) for m in maps]}
        info(f"wrote {out}/attention.json, entropy.png and {len(maps)} heatmaps")
    if args.json:
        emit_json({k: v for k, v in rep.items() if k != "per_position"} | {"per_position": "see attention.json"})
    else:
        print(f"{len(cap.tokens)} tokens: {''.join(labels)}")
        print(format_table(rep))
        if not args.out:
            info("(use --out DIR to save attention.json, per-head heatmaps and the entropy plot)")
    return 0


def _check_masks(args) -> int:
    from ..attention.masks import check_masks, load_batch_jsonl

    if not args.path:
        raise ValueError("check-masks needs a BATCH.jsonl file")
    batch = load_batch_jsonl(args.path)
    pad = args.pad_id if args.pad_id is not None else batch["pad_token_id"]
    findings = check_masks(batch["input_ids"], batch["attention_mask"], batch["position_ids"], pad)
    if args.json:
        emit_json({"file": args.path, "rows": len(batch["input_ids"]), "pad_token_id": pad,
                   "findings": [f.to_dict() for f in findings], "ok": not findings})
    else:
        for f in findings:
            print(f)
        print(f"{len(batch['input_ids'])} rows, {len(findings)} finding(s)" + ("" if findings else ": masks look valid"))
    return 1 if findings else 0


def _padding_leak(args, ckpt: str | None) -> int:
    from ..attention.leak import format_leak, padding_leak

    model, encode, _, pad = load_model(ckpt, args.hf)
    if args.pad_id is not None:
        pad = args.pad_id
    seqs = _ids_from(args, encode) if (args.text or args.ids) else [encode(t) for t in LEAK_TEXTS]
    rep = padding_leak(model, seqs, pad, position_ids=not args.no_position_ids, threshold=args.threshold)
    if args.json:
        emit_json(rep.to_dict())
    else:
        print(format_leak(rep))
    return 1 if rep.leak else 0
