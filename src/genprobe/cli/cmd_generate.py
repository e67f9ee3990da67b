"""``genprobe generate MODEL``: stream text from a genprobe checkpoint or a transformers model directory."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import TYPE_CHECKING, Any

from .._io import json_safe
from ._common import (
    add_json_flag,
    add_max_new_tokens,
    add_model_argument,
    add_prompt_arguments,
    add_weight_dtype,
    emit_json,
    info,
    load_model_arg,
    read_prompts,
)
from ._sampler_args import add_sampler_arguments, sampler_from_args

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.runner import GenerationResult
    from ..engine.samplers import SamplerConfig
    from ..model.load import Model, Tokenizer


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``generate`` sub-command."""
    p = sub.add_parser(
        "generate",
        help="generate text (greedy or sampled) from a checkpoint or HF model directory",
        description="Generate text after each prompt (one prompt streams to stdout; several run as one left-padded "
        "batch). Sampling parameters are validated; "
        "greedy is an explicit argmax (bans and penalties still apply).",
    )
    add_model_argument(p)
    prompts = add_prompt_arguments(p, required=True)
    prompts.add_argument(
        "--ids",
        nargs="+",
        action="append",
        type=int,
        metavar="ID",
        help="a prompt as token ids instead of text (a model without a tokenizer); repeat the flag for several "
        "prompts; prints the ids generated, and their text when the model has a tokenizer",
    )
    add_sampler_arguments(p)
    add_max_new_tokens(p, 50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--eos-id", type=int, default=None, help="stop at this token id (default: the tokenizer's end-of-text token)"
    )
    p.add_argument("--ignore-eos", action="store_true", help="never stop early at the end-of-text token")
    p.add_argument(
        "--chat",
        action="store_true",
        help="render each prompt as one user turn through the model's chat template (instruction-tuned models) "
        "and print only the reply",
    )
    p.add_argument("--show-unk", action="store_true", help="print <unk> instead of dropping it")
    p.add_argument("--top", type=int, default=0, metavar="N", help="per step, show the top-N candidates and entropy")
    p.add_argument(
        "--compile",
        action="store_true",
        help="genprobe checkpoints and Llama-family transformers models: decode through the compiled fast path "
        "(compiling takes ~15-30 s per batch size for our models, ~2 min for SmolLM2, then cached on disk; pays "
        "off for long generations and scans, not for one short prompt)",
    )
    add_weight_dtype(p)
    p.add_argument(
        "--mode",
        choices=["cached", "naive"],
        default="cached",
        help="cached: KV cache (default); naive: recompute the whole sequence every step (the reference)",
    )
    add_json_flag(p)
    p.set_defaults(func=run)


def _encode(model, texts: list[str]) -> list[list[int]]:
    tok = model.tokenizer
    for t in texts:
        unknown = tok.unknown_chars(t)
        if unknown:
            info(
                f"warning: {len(unknown)} prompt character(s) are not in the vocabulary and become <unk>: "
                f"{''.join(unknown)!r} (a different script, e.g. simplified vs traditional?)"
            )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reported once, above
        return [model.encode(t) for t in texts]


def check_ids(prompts: list[list[int]], vocab_size: int) -> list[list[int]]:
    """``--ids`` prompts, each id inside the vocabulary ``[0, vocab_size)``; the error names the limit."""
    for i, ids in enumerate(prompts):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            which = f" (prompt {i + 1})" if len(prompts) > 1 else ""
            raise ValueError(
                f"--ids{which}: token id {bad[0]} is outside the model's vocabulary: ids must be in [0, {vocab_size}), "
                f"i.e. at most {vocab_size - 1}"
            )
    return [list(ids) for ids in prompts]


def _show(tok, ids: list[int], show_unk: bool) -> str:
    return tok.decode(ids, show_unk=show_unk) if tok.kind == "char" else tok.decode(ids)


def run(args: argparse.Namespace) -> int:
    """Handler of ``genprobe generate``."""
    from ..engine.generate import generate
    from ..engine.runner import engine_model

    if args.top < 0:
        raise ValueError(f"--top must be >= 0, got {args.top}")
    if args.ids and args.chat:
        raise ValueError("--chat renders text through the chat template: give --prompt, not --ids")
    model = load_model_arg(args)
    tok, texts, prompts = _prompts(args, model)
    sampler = sampler_from_args(args, tok)
    stream = len(prompts) == 1 and not args.json and not args.top and tok is not None
    if stream and not args.chat and tok is not None:
        sys.stdout.write(_show(tok, prompts[0], args.show_unk))
        sys.stdout.flush()

    def on_token(step: int, row: list[int]) -> None:
        if row[0] >= 0 and tok is not None:
            sys.stdout.write(_show(tok, [row[0]], args.show_unk))
            sys.stdout.flush()

    eos = None if args.ignore_eos else (args.eos_id if args.eos_id is not None else model.eos_id)
    res = generate(
        engine_model(model),
        prompts,
        args.max_new_tokens,
        sampler=sampler,
        mode=args.mode,
        seed=args.seed,
        eos_id=eos,
        return_probs=bool(args.top) or args.json,
        on_token=on_token if stream else None,
        compile=args.compile,
    )
    _warn_if_compile_failed(args)
    results = _print_results(args, tok, texts, prompts, res, stream)
    if stream:
        print()
    if args.json:
        _emit_json(args, model, sampler, res, results)
    return 0


def _prompts(args: argparse.Namespace, model: "Model") -> tuple["Tokenizer | None", list[str | None], list[list[int]]]:
    """The tokenizer, each prompt's text (None for ``--ids``) and its token ids: ``--ids`` checked against the
    vocabulary, or the texts (rendered through the chat template with ``--chat``) encoded."""
    tok = model.tokenizer
    if args.ids:
        prompts = check_ids(args.ids, model.vocab_size)
        return tok, [None] * len(prompts), prompts
    given = read_prompts(args)
    assert given is not None  # one prompt source is required (add_prompt_arguments(required=True))
    tok = model._require_tokenizer()  # names --ids when there is none
    rendered = [model.chat_prompt(t) for t in given] if args.chat else list(given)
    return tok, list(rendered), _encode(model, rendered)


def _print_results(
    args: argparse.Namespace,
    tok: "Tokenizer | None",
    texts: list[str | None],
    prompts: list[list[int]],
    res: "GenerationResult",
    stream: bool,
) -> list[dict[str, Any]]:
    """Each row's result (what ``--json`` reports), its steps printed with ``--top`` and, when not streamed and
    not ``--json``, its text (or ids without a tokenizer) printed as the row is done."""
    from ..engine.steps import format_steps, step_stats

    results: list[dict[str, Any]] = []
    for row, (text, ids, new) in enumerate(zip(texts, prompts, res.tokens, strict=True)):
        steps = step_stats(new, res.step_probs, tok.token_str if tok is not None else str, row=row, top=args.top)
        results.append(
            {
                "prompt": text if text is not None or tok is None else _show(tok, ids, args.show_unk),
                "prompt_tokens": ids,
                "unknown_prompt_chars": tok.unknown_chars(text) if tok is not None and text is not None else [],
                "text": _show(tok, new, args.show_unk) if tok is not None else None,
                "tokens": new,
                "finished": res.finished[row],
                "steps": [json_safe(s) for s in steps],
            }
        )
        if args.top and not args.json:
            print(format_steps(steps))
        if not stream and not args.json:
            if tok is None:  # no tokenizer: the ids are the output
                print(" ".join(str(i) for i in new))
            else:
                print(("" if args.chat else _show(tok, ids, args.show_unk)) + results[-1]["text"])
    return results


def _emit_json(
    args: argparse.Namespace,
    model: "Model",
    sampler: "SamplerConfig",
    res: "GenerationResult",
    results: list[dict[str, Any]],
) -> None:
    """``--json``: the run's settings with the one result's fields, or with ``results`` for several prompts."""
    common = {
        "model": str(model.source),
        "sampler": json_safe(sampler),
        "seed": args.seed,
        "chat": args.chat,
        "weight_dtype": args.weight_dtype,
        "narrow_output": args.narrow_output,
        "token_forwards": res.token_forwards,
    }
    emit_json(common | results[0] if len(results) == 1 else common | {"results": results})


def _warn_if_compile_failed(args: argparse.Namespace) -> None:
    if args.compile:
        from ..engine.fast.compiled import compile_error

        if compile_error() is not None:
            info(f"warning: torch.compile failed, decoded eagerly instead ({compile_error()})")
