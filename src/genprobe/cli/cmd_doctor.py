"""Every check on MODEL and how you run it, in one report; exit status gates a release in CI.

Run every genprobe check on MODEL under your settings and write report.html + doctor.json (every finding with its
evidence and the command that reproduces it alone).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._common import (
    MODEL_KINDS,
    Command,
    add_prompt_arguments,
    check_min,
    emit_json,
    fields_of,
    info,
    load_model_arg,
    model_path,
    option,
    out_dir,
    read_prompts,
    user_project_importable,
)
from ._sampler_args import add_sampler_arguments, sampler_flags_given, sampler_from_args

# genprobe.doctor.options.STAGES, spelled out so that building the parser does not import torch
STAGES = ("audit", "card", "quality", "inference", "attention", "degeneration", "fixes")
FILES = "report.html, doctor.json and prompts.txt"
EPILOG = """\
exit status: 0 healthy, 1 a bug found (a cache path that disagrees with recomputation, a padding leak, a broken
tokenizer round trip, your cache implementation raising), 4 warnings only (e.g. a degenerate rate above
--max-loop-rate, every generation degenerate, end-of-text equal to padding), 2 bad input.

stages: audit (the files read as data, nothing run), card, quality, inference (every cache path against full
recomputation, padding leak, --serving), attention, degeneration (greedy and your sampler), fixes (skipped by
--quick); docs/doctor.md lists what each checks.
"""


def options(p: argparse.ArgumentParser) -> None:
    add_prompt_arguments(p, help_default=" (default: held-out prompts of the model's language)")
    add_sampler_arguments(p)
    option(p, "--chat", False, "give each prompt as a user turn through the chat template")
    serving = "also check the serving engine's logits: vllm (in-process, extra genprobe[vllm]) or the URL of a live"
    option(p, "--serving", metavar="vllm|URL", help=serving + " OpenAI-compatible server of this model")
    option(p, "--quick", False, "the CI gate: fewer prompts and steps, no which-fix stage")
    option(p, "--max-loop-rate", type=float, metavar="R", help="warn (exit 4) when a degenerate rate exceeds R")
    option(p, "--with-edit", False, "also search the loop-repair weight edit (slow)")
    option(p, "--impl", metavar="MOD:FACTORY", help="also verify your cache implementation: factory(model)")
    option(p, "--hf-no-position-ids", False, "your code passes no position_ids: a left-padding leak is then a bug")
    option(p, "--only", [], "run these stages: " + " ".join(STAGES), choices=STAGES, metavar="STAGE")
    reference = "the original model: the quality stage's KL and top-1 against it"
    option(p, "--reference", metavar="FILE_OR_DIR", help=reference)
    option(p, "--seed", 0, "sampling seed")
    option(p, "--threads", 1, "torch CPU threads (as in `genprobe loops`)")
    option(p, "--out", type=Path, required=True, metavar="DIR", help=f"directory for {FILES}")


def run(args: argparse.Namespace) -> int:
    """Check the arguments (exit 2 on bad input), run every stage, write the files, print the verdict."""
    import torch

    from ..doctor.audit import ModelFiles, model_files
    from ..doctor.options import DoctorOptions
    from ..doctor.run import run_doctor

    out_dir(args.out, FILES)
    check_min(args, threads=1)
    torch.set_num_threads(args.threads)
    if args.impl:
        from ..verify.adapters import import_factory

        user_project_importable()
        import_factory(args.impl)  # bad input now; the factory runs later, where an exception in it is a finding
    audit_only = set(args.only) == {"audit"}  # read as data, not loaded: the audit takes seconds
    model = model_files(model_path(args)) if audit_only else load_model_arg(args)
    if args.chat and not isinstance(model, ModelFiles) and model.chat_template is None:
        raise ValueError(f"--chat: the model {model_path(args)} has no chat template")
    typed = tuple(sampler_flags_given(args, values=True))  # for the reproducing commands
    sampling = sampler_from_args(args, model.tokenizer) if typed else None
    opts = fields_of(
        DoctorOptions,
        args,
        prompts=read_prompts(args),
        sampling=sampling,
        only=tuple(args.only) or STAGES,
        hf_position_ids=not args.hf_no_position_ids,
        sampling_flags=typed,
    )
    rep = run_doctor(model, opts, model_arg=model_path(args), out=args.out, log=info)
    v = rep.verdict
    for f in rep.findings:
        if f.severity in ("bug", "warning"):
            info(f"{f.severity.upper()}: [{f.stage}] {f.title}")
    info(f"verdict: {v.verdict} (exit status {v.exit_status}); wrote {args.out / 'report.html'} and doctor.json")
    if args.json:
        emit_json(rep)
    return v.exit_status


COMMANDS = (Command("doctor", __doc__, run, options, EPILOG, model=MODEL_KINDS),)
