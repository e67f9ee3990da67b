"""``genprobe generate``: stream text from a genprobe checkpoint or a transformers model directory."""

from __future__ import annotations

import argparse
import math
import sys
import warnings

from ._common import add_json_flag, emit_json, info
from ._sampler_args import add_sampler_arguments, sampler_from_args


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``generate`` sub-command."""
    p = sub.add_parser(
        "generate",
        help="generate text (greedy or sampled) from a checkpoint or HF model directory",
        description="Generate text after --prompt, streaming it to stdout. Sampling parameters are validated; "
        "greedy is an explicit argmax (bans and penalties still apply).",
    )
    p.add_argument("model", metavar="CKPT_OR_HF_DIR", help="genprobe checkpoint dir or transformers model dir")
    p.add_argument("--prompt", required=True, help="prompt text")
    add_sampler_arguments(p)
    p.add_argument("--max-new-tokens", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eos-id", type=int, default=None, help="stop when this token id is generated")
    p.add_argument("--show-unk", action="store_true", help="print <unk> instead of dropping it")
    p.add_argument("--top", type=int, default=0, metavar="N", help="per step, show the top-N candidates and entropy")
    p.add_argument(
        "--compile", action="store_true",
        help="genprobe checkpoints: run decode steps through torch.compile (compiling takes ~15-30 s once per "
        "process and batch size; pays off for long generations, not for one short prompt)",
    )
    p.add_argument("--mode", choices=["cached", "naive"], default="cached", help=argparse.SUPPRESS)
    add_json_flag(p)
    p.set_defaults(func=run)


def _decode(tok, ids: list[int], show_unk: bool) -> str:
    try:
        return tok.decode(ids, show_unk=show_unk)
    except TypeError:  # a tokenizer without show_unk
        return tok.decode(ids)


def _token_str(tok, t: int, show_unk: bool = True) -> str:
    if hasattr(tok, "token_str"):
        return tok.token_str(t)
    return _decode(tok, [t], show_unk)


def _encode_prompt(tok, text: str) -> tuple[list[int], list[str]]:
    if hasattr(tok, "encode_with_report"):
        r = tok.encode_with_report(text)
        return r.ids, r.unknown_chars
    return tok.encode(text), []


def run(args: argparse.Namespace) -> int:
    """Handler of ``genprobe generate``."""
    import torch

    from ..engine.generate import generate
    from ..engine.hf_adapter import load_causal_lm

    if args.top < 0:
        raise ValueError(f"--top must be >= 0, got {args.top}")
    if not args.prompt:
        raise ValueError("--prompt is empty: give at least one character")
    model, tok = load_causal_lm(args.model)
    ids, unknown = _encode_prompt(tok, args.prompt)
    if unknown:
        info(
            f"warning: {len(unknown)} prompt character(s) are not in the vocabulary and become <unk>: "
            f"{''.join(unknown)!r} (a different script, e.g. simplified vs traditional?)"
        )
    cfg = sampler_from_args(args, tok)
    steps: list[dict] = []
    stream = not args.json and not args.top  # --top prints a per-step table after generating
    if stream:
        sys.stdout.write(_decode(tok, ids, args.show_unk))
        sys.stdout.flush()
    want_probs = bool(args.top) or args.json

    def on_token(step: int, row: list[int]) -> None:
        t = row[0]
        if t < 0:
            return
        if stream:
            sys.stdout.write(_decode(tok, [t], args.show_unk))
            sys.stdout.flush()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the prompt's <unk> warning was already shown once, above
        res = generate(
            model,
            [ids],
            args.max_new_tokens,
            sampler=cfg,
            mode=args.mode,
            seed=args.seed,
            eos_id=args.eos_id,
            return_probs=want_probs,
            on_token=on_token,
            compile=args.compile,
        )
    if args.compile:
        from ..engine.compiled import compile_error

        if compile_error() is not None:
            info(f"warning: torch.compile failed, decoded eagerly instead ({compile_error()})")
    tokens = res.tokens[0]
    for i, t in enumerate(tokens):
        entry: dict = {"step": i, "token": t, "text": _token_str(tok, t)}
        if res.step_probs is not None:
            pr = res.step_probs[i][0]
            nz = pr[pr > 0]
            entry["prob"] = float(pr[t])
            entry["entropy_nats"] = float(-(nz * nz.log()).sum())
            entry["kept"] = int((pr > 0).sum())
            if args.top:
                v, k = torch.topk(pr, min(args.top, pr.numel()))
                entry["top"] = [
                    {"token": int(j), "text": _token_str(tok, int(j)), "prob": float(p)} for p, j in zip(v, k) if p > 0
                ]
        steps.append(entry)
    text = _decode(tok, tokens, args.show_unk)
    if args.json:
        emit_json(
            {
                "model": str(args.model),
                "prompt": args.prompt,
                "prompt_tokens": ids,
                "unknown_prompt_chars": unknown,
                "text": text,
                "tokens": tokens,
                "finished": res.finished[0],
                "sampler": cfg.to_dict(),
                "seed": args.seed,
                "token_forwards": res.token_forwards,
                "steps": steps,
            }
        )
        return 0
    if args.top:
        for s in steps:
            cands = "  ".join(f"{c['text']}:{c['prob']:.3f}" for c in s["top"])
            sys.stdout.write(
                f"step {s['step']:3d} → {s['text']!s:6} p={s['prob']:.3f}  H={s['entropy_nats']:.2f} nats "
                f"({s['entropy_nats'] / math.log(2):.2f} bits)  kept={s['kept']}  | {cands}\n"
            )
        sys.stdout.write(_decode(tok, ids, args.show_unk) + text + "\n")
    else:
        sys.stdout.write("\n")
    sys.stdout.flush()
    return 0
