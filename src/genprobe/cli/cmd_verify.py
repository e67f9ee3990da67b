"""``genprobe verify-cache``: is a KV-cache implementation equivalent to full recomputation?

Compares logits step by step (prefill, greedy decode, chunked prefill, left-padded batch) and prints
the seed §3.9.8-style table. Exit status: 0 when every implementation under test is within the
allowed verdict, 1 when one is judged a bug (or, with ``--mutants``, when a mutant is not caught or
``cat_order`` is flagged), 2 on bad input — usable in another project's CI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ._common import add_json_flag, emit_json, info

FAIL_ON = {"bug": ("bug",), "suspicious": ("suspicious", "bug"), "small": ("small", "suspicious", "bug")}


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``verify-cache`` sub-command."""
    p = sub.add_parser(
        "verify-cache",
        help="check that a KV-cache implementation is equivalent to recomputation (logits, not text)",
        description="Verify a cached implementation against full recomputation, step by step: prefill "
        "(bit-identical?), N greedy decode steps, chunked prefill, a left-padded batch. Targets: a genprobe "
        "checkpoint (our engine), --hf DIR (any transformers causal LM and its own cache), or --impl "
        "MOD:FACTORY (your adapter: reset(), prefill(ids, attention_mask=None), step(ids)).",
    )
    p.add_argument("ckpt", nargs="?", type=Path, help="genprobe checkpoint directory (verifies the engine)")
    p.add_argument("--hf", type=Path, metavar="DIR", help="transformers model directory (loaded offline)")
    p.add_argument("--impl", metavar="MOD:FACTORY", help="user implementation: factory(model) or factory()")
    p.add_argument("--model", metavar="CKPT_OR_HF", help="model handed to --impl's factory and used as reference")
    p.add_argument(
        "--compiled", action="store_true",
        help="with CKPT: also verify the torch.compile'd decode path (StaticKVCache; the first run compiles, ~30 s)",
    )
    p.add_argument("--mutants", action="store_true", help="also run the planted-bug mutants (genprobe models)")
    p.add_argument("--steps", type=int, default=50, help="greedy decode steps after prefill (default 50)")
    p.add_argument("--prompt", action="append", metavar="TEXT", help="prompt text (repeatable)")
    p.add_argument("--chunk-sizes", default="1,4", help="comma-separated chunk sizes (default 1,4)")
    p.add_argument("--no-padded-batch", action="store_true", help="skip the left-padded batch comparison")
    p.add_argument(
        "--hf-no-position-ids", action="store_true",
        help="drive the HF model without position_ids (reproduces the left-padding position bug class)",
    )
    p.add_argument("--noise", type=float, default=1e-4, help="float-noise threshold (default 1e-4)")
    p.add_argument("--bug", type=float, default=1.0, help="bug threshold on max |Δlogit| (default 1.0)")
    p.add_argument(
        "--fail-on", choices=sorted(FAIL_ON), default="bug",
        help="lowest verdict of an implementation under test that makes the exit status 1 (default bug)",
    )
    add_json_flag(p)
    p.set_defaults(func=run)


# ---- loading -------------------------------------------------------------------------------------------
def _load_hf(d: Path):
    from transformers import AutoModelForCausalLM

    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"{d} is not a transformers model directory (config.json missing)")
    return AutoModelForCausalLM.from_pretrained(str(d), local_files_only=True, trust_remote_code=False).eval()


def _hf_encoder(d: Path):
    """A text → ids function for an HF directory: genprobe_tokenizer.json, else AutoTokenizer, else None."""
    gp = d / "genprobe_tokenizer.json"
    if gp.is_file():
        from ..corpus import CharTokenizer

        spec = json.loads(gp.read_text(encoding="utf-8"))
        tok = CharTokenizer.from_dict(spec.get("tokenizer", spec) if isinstance(spec, dict) else spec)
        return lambda text: _encode_char(tok, text)
    if any((d / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(d), local_files_only=True, trust_remote_code=False)
        return lambda text: list(tok.encode(text, add_special_tokens=False))
    return None


def _encode_char(tok, text: str) -> list[int]:
    rep = tok.encode_with_report(text)
    if rep.unknown_chars:
        info(f"note: {''.join(rep.unknown_chars)!r} not in the vocabulary → <unk> in prompt {text!r}")
    return list(rep.ids)


def _load_model(spec: str):
    """(kind, model, encoder) for a genprobe checkpoint or an HF directory."""
    from ..model.checkpoint import is_checkpoint, load_checkpoint

    d = Path(spec)
    if is_checkpoint(d):
        model, tok, _ = load_checkpoint(d)
        return "genprobe", model, (lambda text: _encode_char(tok, text))
    if (d / "config.json").is_file():
        return "hf", _load_hf(d), _hf_encoder(d)
    raise FileNotFoundError(f"{d} is neither a genprobe checkpoint nor a transformers model directory")


def _random_prompts(vocab: int, max_positions: int | None, steps: int, seed: int = 0) -> list[list[int]]:
    import torch

    room = 8 if max_positions is None else max(1, min(8, max_positions - steps))
    lengths = sorted({room, max(1, room * 5 // 8), max(1, room * 3 // 8)}, reverse=True)
    g = torch.Generator().manual_seed(seed)
    lo = 1 if vocab > 2 else 0
    return [torch.randint(lo, vocab, (n,), generator=g).tolist() for n in lengths]


def _vocab_of(obj: Any, hf=None) -> int:
    if hf is not None:
        return int(hf.config.vocab_size)
    cfg = getattr(obj, "cfg", None)
    if cfg is not None:
        return int(cfg.vocab_size)
    v = getattr(obj, "vocab_size", None)
    if v is None:
        raise ValueError("cannot tell the vocabulary size for random prompts: give --prompt or --model")
    return int(v)


# ---- the command ---------------------------------------------------------------------------------------
def _chunk_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--chunk-sizes expects comma-separated integers, got {text!r}") from None
    if any(s < 1 for s in sizes):
        raise ValueError(f"--chunk-sizes must all be >= 1, got {sizes}")
    return sizes


def run(args: argparse.Namespace) -> int:
    """Build targets, run the harness (and mutants), print the table; exit 1 on a bug."""
    from ..verify import CompiledEngineAdapter, EngineAdapter, FullRecompute, HFAdapter, HFReference, Thresholds, load_impl
    from ..verify.harness import ReferenceRun, verify_implementation
    from ..verify.mutants import DEFAULT_PROMPT, MUTANTS, mask_noop, report_row, run_mutant_reports

    targets = [x for x in (args.ckpt, args.hf, args.impl) if x is not None]
    if len(targets) != 1:
        raise ValueError("give exactly one target: CKPT, --hf DIR or --impl MOD:FACTORY")
    if args.compiled and args.ckpt is None:
        raise ValueError("--compiled verifies genprobe's own compiled decode path: give a genprobe CKPT")
    if args.model is not None and args.impl is None:
        raise ValueError("--model only goes with --impl")
    if args.steps < 0:
        raise ValueError(f"--steps must be >= 0, got {args.steps}")
    chunks = _chunk_sizes(args.chunk_sizes)
    th = Thresholds(noise=args.noise, bug=args.bug, suspicious=max(args.noise, min(1e-3, args.bug)))

    gpt = None  # a genprobe GPT, when there is one (mutants need it)
    encoder = None
    impls: list[Any] = []
    if args.ckpt is not None:
        kind, gpt, encoder = _load_model(str(args.ckpt))
        if kind != "genprobe":
            raise ValueError(f"{args.ckpt} is a transformers directory: use --hf {args.ckpt}")
        reference = FullRecompute(gpt)
        impls.append(EngineAdapter(gpt))
        if args.compiled:
            impls.append(CompiledEngineAdapter(gpt))
        vocab = gpt.cfg.vocab_size
    elif args.hf is not None:
        hf = _load_hf(args.hf)
        encoder = _hf_encoder(args.hf)
        reference = HFReference(hf)
        impls.append(HFAdapter(hf, pass_position_ids=not args.hf_no_position_ids))
        vocab = _vocab_of(None, hf)
        if args.mutants:
            from ..model.hf import from_hf_gpt2

            gpt = from_hf_gpt2(hf)  # mutants run over our GPT; only GPT-2 maps onto it
    else:
        if os.getcwd() not in sys.path:  # the user's project, as `python -m` would see it
            sys.path.insert(0, os.getcwd())
        model = None
        if args.model is not None:
            kind, model, encoder = _load_model(args.model)
            if kind == "genprobe":
                gpt, reference = model, FullRecompute(model)
            else:
                reference = HFReference(model)
        impl = load_impl(args.impl, model)
        if model is None:
            if not callable(getattr(impl, "full", None)):
                raise ValueError(
                    f"{args.impl} was built without a model: pass --model CKPT_OR_HF as the reference, or give "
                    "the adapter a full(ids, attention_mask=None) method that recomputes without a cache"
                )
            reference = impl
        impls.append(impl)
        vocab = gpt.cfg.vocab_size if gpt is not None else _vocab_of(impl, model)
    if args.mutants and gpt is None:
        raise ValueError("--mutants needs a genprobe checkpoint (or a GPT-2 model) to plant bugs into")

    max_pos = getattr(reference, "max_positions", None)
    if args.prompt:
        if encoder is None:
            raise ValueError("--prompt needs a tokenizer (genprobe checkpoint, genprobe_tokenizer.json or an HF tokenizer)")
        prompts = [encoder(t) for t in args.prompt]
        if any(not p for p in prompts):
            raise ValueError("a --prompt encodes to no tokens")
    elif gpt is not None and args.hf is None and encoder is not None:  # the seed's prompt
        prompts = [encoder(DEFAULT_PROMPT)]
    else:
        prompts = _random_prompts(vocab, max_pos, args.steps)

    run_ = ReferenceRun(reference, args.steps)
    reports = []
    for impl in impls:
        info(f"verifying {getattr(impl, 'name', type(impl).__name__)} on {len(prompts)} prompt(s), {args.steps} steps …")
        reports.append(
            verify_implementation(
                impl, run_, prompts, steps=args.steps, chunk_sizes=chunks, padded_batch=not args.no_padded_batch,
                thresholds=th, name=args.impl if args.impl else None,
            )
        )
    failing = [r.impl for r in reports if r.verdict in FAIL_ON[args.fail_on]]

    mutant_rows, noop = [], None
    if args.mutants:
        info(f"running {len(MUTANTS)} mutants …")
        mrun = run_ if isinstance(reference, FullRecompute) else None  # same reference: reuse trajectories
        mreports = run_mutant_reports(gpt, prompts, args.steps, chunk_sizes=chunks, thresholds=th, run=mrun)
        mutant_rows = [report_row(r, MUTANTS[r.impl]) for r in mreports]
        failing += [f"mutant {r['impl']} ({'not caught' if r['expected'] != 'pass' else 'flagged'})"
                    for r in mutant_rows if not r["as_expected"]]
        noop = mask_noop(gpt, prompts[0], args.steps, chunk=max(chunks) if max(chunks) > 1 else 4)

    rc = 1 if failing else 0
    print_table([report_row(r) for r in reports], mutant_rows, noop, th, file=sys.stderr if args.json else sys.stdout)
    if failing:
        info(f"FAIL: {', '.join(failing)}")
    if args.json:
        emit_json({
            "implementations": [r.to_dict() for r in reports],
            "mutants": mutant_rows,
            "mask_noop": noop,
            "prompts": prompts,
            "thresholds": th.to_dict(),
            "failing": failing,
            "exit_status": rc,
        })
    return rc


def _fmt_step(any_: int | None, above: int | None) -> str:
    if any_ is None:
        return "—"
    return f"{any_}" if any_ == above else f"{any_} (noise)" if above is None else f"{any_} / {above}"


def print_table(rows: list[dict], mutant_rows: list[dict], noop: dict | None, th, file=None) -> None:
    """The seed §3.9.8 table: one line per implementation, mutants below with their expectation."""
    out = file or sys.stdout
    head = f"{'implementation':<28} {'prefill exact':>13} {'first diff step':>16} {'max |Δlogit|':>13} " \
           f"{'worst phase':>12} {'text div.':>9} {'text-only catches':>17} {'verdict':>10}"
    print(head + (f" {'expected':>9} {'ok':>3}" if mutant_rows else ""), file=out)
    print("-" * (len(head) + (14 if mutant_rows else 0)), file=out)
    for r in rows + mutant_rows:
        line = (
            f"{r['impl'][:28]:<28} {('yes' if r['prefill_bit_identical'] else 'no'):>13} "
            f"{_fmt_step(r['first_any_diff_step'], r['first_diff_step']):>16} {r['max_abs_dlogit']:>13.4g} "
            f"{r['worst_phase']:>12} {r['text_divergences']:>9} {('yes' if r['text_only_would_catch'] else 'no'):>17} {r['verdict']:>10}"
        )
        if "expected" in r:
            line += f" {r['expected']:>9} {('✓' if r['as_expected'] else '✗'):>3}"
        print(line, file=out)
    print(
        f"verdict scale: < {th.noise:g} pass (float noise), < {th.suspicious:g} small, ≤ {th.bug:g} suspicious, "
        f"> {th.bug:g} bug. first diff step (greedy run): 0 = prefill, k = k-th decode step; "
        f"'(noise)' = differences only below {th.noise:g}. worst phase: where max |Δlogit| occurred.",
        file=out,
    )
    if noop:
        parts = ", ".join(f"{k} = {v:.4g}" for k, v in noop.items())
        print(f"mask no-op (no_mask vs correct on the same cached path): {parts}", file=out)
