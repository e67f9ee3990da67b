"""Generate text (greedy or sampled) from a checkpoint or HF model directory.

Generate text after each prompt (one prompt streams to stdout; several run as one left-padded batch). Sampling
parameters are validated; greedy is an explicit argmax (bans and penalties still apply).
"""

from __future__ import annotations

import argparse
from typing import Any

from ._common import (
    MODEL_KINDS,
    Command,
    add_max_new_tokens,
    add_prompt_arguments,
    add_weight_dtype,
    check_min,
    emit_json,
    info,
    load_model_arg,
    option,
    read_prompts,
)
from ._sampler_args import add_sampler_arguments, sampler_from_args

MODES = ("cached", "naive")


def options(p: argparse.ArgumentParser) -> None:
    prompts = add_prompt_arguments(p, required=True)
    ids = "a prompt as token ids (a model without a tokenizer); repeat the flag for several prompts; prints new ids"
    option(prompts, "--ids", nargs="+", action="append", type=int, metavar="ID", help=ids)
    add_sampler_arguments(p)
    add_max_new_tokens(p, 50)
    option(p, "--seed", 0, "sampling seed")
    option(p, "--eos-id", type=int, help="stop at this token id (default: the tokenizer's end-of-text token)")
    option(p, "--ignore-eos", False, "never stop early at the end-of-text token")
    option(p, "--chat", False, "render each prompt as a user turn through the chat template; print only the reply")
    option(p, "--show-unk", False, "print <unk> instead of dropping it")
    option(p, "--top", 0, "per step, show the top-N candidates and entropy", metavar="N")
    option(p, "--compile", False, "decode through the compiled fast path (compiling takes 15 s-2 min, then cached)")
    add_weight_dtype(p)
    option(p, "--mode", "cached", "cached: KV cache; naive: recompute every step (the reference)", choices=MODES)


def run(args: argparse.Namespace) -> int:
    """Handler of ``genprobe generate``."""
    from ..engine.generate import generate
    from ..engine.runner import format_steps

    check_min(args, top=0)
    if args.ids and args.chat:
        raise ValueError("--chat renders text through the chat template: give --prompt, not --ids")
    model = load_model_arg(args)
    tok = model.tokenizer
    texts, prompts, unknown = _encode(args, model)
    sampler = sampler_from_args(args, tok)

    def show(ids: list[int]) -> str:
        assert tok is not None
        return tok.decode(ids, show_unk=args.show_unk) if tok.kind == "char" else tok.decode(ids)  # type: ignore[call-arg]

    stream = len(prompts) == 1 and not args.json and not args.top and tok is not None
    if stream and not args.chat:
        print(show(prompts[0]), end="", flush=True)

    def on_token(step: int, row: list[int]) -> None:
        if row[0] >= 0:
            print(show([row[0]]), end="", flush=True)

    eos = None if args.ignore_eos else (args.eos_id if args.eos_id is not None else model.eos_id)
    res = generate(
        model,
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
    if args.compile:
        from ..engine.fast.compiled import compile_error

        if compile_error() is not None:
            info(f"warning: torch.compile failed, decoded eagerly instead ({compile_error()})")
    results = _results(res, texts, prompts, unknown, tok, show, args.top)
    for r, ids, new in zip(results, prompts, res.tokens, strict=True):
        if args.top and not args.json:
            print(format_steps(r["steps"]))
        if not stream and not args.json:  # without a tokenizer the ids are the output
            print(" ".join(map(str, new)) if tok is None else ("" if args.chat else show(ids)) + show(new))
    if stream:
        print()
    if args.json:
        echoed = {k: getattr(args, k) for k in ("seed", "chat", "weight_dtype", "narrow_output")}
        common = {"model": str(model.source), "sampler": sampler, **echoed, "token_forwards": res.token_forwards}
        emit_json(common | results[0] if len(results) == 1 else common | {"results": results})
    return 0


def _encode(args: argparse.Namespace, model: Any) -> tuple[list[Any], list[list[int]], list[list[str]]]:
    """The prompts as (texts, None with --ids; token ids; each prompt's characters outside the vocabulary)."""
    from ..engine.loaded import encode_prompts

    if not args.ids:  # the texts (rendered through the chat template with --chat) encoded
        given = read_prompts(args) or []  # one prompt source is required
        texts: list[Any] = [model.chat_prompt(t) for t in given] if args.chat else list(given)
        prompts, unknown = encode_prompts(model, texts)  # names --ids when the model has no tokenizer
        for chars in filter(None, unknown):
            info(
                f"warning: {len(chars)} prompt character(s) are not in the vocabulary and become <unk>: "
                f"{''.join(chars)!r} (a different script, e.g. simplified vs traditional?)"
            )
        return texts, prompts, unknown
    V = model.vocab_size  # each id inside the vocabulary [0, V): the error names the limit
    for i, ids in enumerate(args.ids):
        if bad := [t for t in ids if not 0 <= t < V]:
            which = f" (prompt {i + 1})" if len(args.ids) > 1 else ""
            raise ValueError(
                f"--ids{which}: token id {bad[0]} is outside the model's vocabulary: ids must be in [0, {V}), "
                f"i.e. at most {V - 1}"
            )
    return [None] * len(args.ids), args.ids, [[] for _ in args.ids]


def _results(
    res: Any, texts: list[Any], prompts: list[list[int]], unknown: list[list[str]], tok: Any, show: Any, top: int
) -> list[dict[str, Any]]:
    """One JSON row per prompt (``show`` decodes ids to text when there is a tokenizer)."""
    token_str = tok.token_str if tok is not None else str
    return [
        {
            "prompt": text if text is not None or tok is None else show(ids),
            "prompt_tokens": ids,
            "unknown_prompt_chars": unknown[row],
            "text": show(new) if tok is not None else None,
            "tokens": new,
            "finished": res.finished[row],
            "steps": res.step_stats(token_str, row=row, top=top),  # emit_json writes their JSON form
        }
        for row, (text, ids, new) in enumerate(zip(texts, prompts, res.tokens, strict=True))
    ]


COMMANDS = (Command("generate", __doc__, run, options, model=MODEL_KINDS),)
