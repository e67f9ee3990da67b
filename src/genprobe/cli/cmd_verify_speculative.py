"""Check speculative decoding: greedy identical to plain greedy, sampled distributed as the model.

Is genprobe's speculative decoding the model's own decoding? Greedy: token-identical to plain greedy on every prompt
(first divergence reported). Sampled: the exact distribution of the first --exact-tokens tokens against the target's
(total variation), and with --samples a two-sample test with its p-value and the smallest shift it detects. --mutants
runs the planted-bug decoders: each must be caught. Exit 0 when everything passed (and every mutant was caught), 1
otherwise, 2 on bad input.
"""

from __future__ import annotations

import argparse

from ._common import (
    Column,
    Command,
    add_max_new_tokens,
    add_prompt_arguments,
    emit_json,
    fmt,
    info,
    option,
    read_prompts,
    table,
)

DRAFT_HELP = (
    "what proposes tokens: 'lookup' (prompt lookup, 2-grams), 'layers:N' (the model's first N layers), or a model "
    "with the same vocabulary and at most its size (default: the first half of the model's layers)"
)


def options(p: argparse.ArgumentParser) -> None:
    option(p, "--draft", metavar="DRAFT", help=DRAFT_HELP)
    option(p, "--k", 4, "tokens proposed per round")
    add_max_new_tokens(p, 32)
    add_prompt_arguments(p, help_default=" (default: a loop-prone and an ordinary prompt of random ids)")
    option(p, "--exact-tokens", 3, "tokens whose joint distribution is enumerated")
    option(p, "--exact-k", 1, "tokens proposed per round in the exact check")
    option(p, "--top-k", 3, "the sampler of the sampled checks: top-k at τ=1")
    option(p, "--samples", 0, "samples per side of the two-sample test (0: not run)")
    option(p, "--seed", 0, "seed of the random prompts and the samples")
    option(p, "--mutants", False, "also run the planted-bug decoders (each must be caught)")


def run(args: argparse.Namespace) -> int:
    """Verify, print the table, exit 1 on a failure."""
    from ..engine.samplers.stages import SamplerConfig
    from ..model.load import load_model

    if args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1 (the exact check enumerates the kept tokens), got {args.top_k}")
    if args.samples < 0 or 0 < args.samples < 20:
        raise ValueError(f"--samples must be 0 (off) or >= 20 per side, got {args.samples}")
    from ..verify.speculative import verify_speculative

    draft = args.draft
    if draft is not None and draft != "lookup" and not draft.startswith("layers:"):
        draft = load_model(draft)
    given = ("k", "max_new_tokens", "exact_tokens", "exact_k", "samples", "seed", "mutants")
    sampler = SamplerConfig(temperature=1.0, top_k=args.top_k)
    r = verify_speculative(
        args.model, draft, prompts=read_prompts(args), sampler=sampler, **{k: getattr(args, k) for k in given}
    )
    rc = 0 if r.verdict == "pass" and r.mutants_ok else 1
    if args.json:
        emit_json(r)
        return rc
    g, e, t, s = r.greedy, r.exact, r.two_sample, r.greedy.stats
    print(f"speculative decoding of {r.model}: draft {r.draft}, k {r.k}")
    print(
        f"  greedy      {g.verdict:11s} {g.identical_prompts}/{g.prompts} prompts token-identical ({g.tokens} tokens); "
        f"acceptance {fmt(s['acceptance_rate'], '.2f')}, tokens/target forward {fmt(s['tokens_per_forward'], '.2f')}"
    )
    if g.first_divergence:
        info(f"  first divergence: {g.first_divergence}")
    if g.error:
        print(f"  greedy error: {g.error}")
    if e is not None:
        print(
            f"  exact       {e.verdict:11s} TV {fmt(e.total_variation, '.2e')} (tolerance {e.tolerance:g}) over the "
            f"first {e.tokens} tokens, k {e.k}: {e.sequences} sequences, {e.runs} replays, {e.drafted} drafts"
        )
        if e.error:
            print(f"  exact error: {e.error}")
    if t is not None:
        print(
            f"  two-sample  {t.verdict:11s} p {t.p_value:.3g} (alpha {t.alpha:g}, {t.samples} samples per side, "
            f"{t.tokens} tokens); detects a shift of {t.min_detectable_shift:.3f} in one token's probability "
            f"with power {t.power:g}"
        )
    if r.mutants:
        print(table(MUTANTS, r.mutants))
    print(f"verdict: {r.verdict}" + ("" if r.mutants is None else f"; mutants {'ok' if r.mutants_ok else 'NOT ok'}"))
    return rc


MUTANTS: tuple[Column, ...] = (
    ("  mutant", -26, lambda m: f"  {m.name}"),
    ("greedy", -11, lambda m: m.greedy),
    ("exact", -11, lambda m: m.exact),
    ("TV", 9, lambda m: fmt(m.total_variation, ".2e")),
    ("margin", 8, lambda m: "—" if m.margin is None else f"{m.margin:.3g}x"),
    ("", -6, lambda m: "ok" if m.ok else "MISSED" if m.expected == "caught" else "FAILED"),
)


COMMANDS = (Command("verify-speculative", __doc__, run, options, model=("checkpoint", "transformers", "name")),)
