"""``genprobe loops scan|locate|repair|apply|revert|compare MODEL``: loop observatory, directional weight repair,
and the comparison of the repair with decode-time samplers.

Prompts and validation text: ``--prompts FILE`` / ``--prompt TEXT ...`` and ``--val-text FILE`` for any
model; ``--tang-prompts`` / ``--tang-val`` (held-out Tang openings, the corpus validation split) are the
defaults for the bundled character model only and explicit choices for every other model.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ._common import (
    add_json_flag,
    add_max_new_tokens,
    add_model_aliases,
    add_prompt_arguments,
    emit_json,
    info,
    model_path,
    read_prompts,
)
from ._sampler_args import add_sampler_arguments, sampler_flags_given, sampler_from_args
from ._vllm_args import add_engine_arguments, engine_options, vllm_missing

DEFAULT_MODEL = Path("out/case/model")  # what `bash scripts/case.sh` trains


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``loops`` and its sub-commands."""
    p = sub.add_parser(
        "loops",
        help="measure greedy loops over prompt sets and repair them with a small directional weight edit",
        description="Loop observatory and directional repair. Default decoding is the 'chanting' setting: greedy "
        "with <unk> banned; a model with an end-of-text token generates a fixed number of tokens with it banned.",
    )
    lsub = p.add_subparsers(dest="loops_command", metavar="ACTION")
    _register_scan(lsub)
    _register_locate(lsub)
    _register_repair(lsub)
    _register_patch_action(lsub, "apply", "apply a patch to a model directory (refused if its weights hash differs)")
    _register_patch_action(lsub, "revert", "restore the exact original weights of a patched model directory")
    _register_compare(lsub)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


# ---- shared flags ---------------------------------------------------------------------------
def _model_args(q: argparse.ArgumentParser) -> None:
    from ..loops.repair import RepairConfig

    d = RepairConfig()
    q.add_argument(
        "model",
        metavar="MODEL",
        nargs="?",
        default=None,
        help=f"a genprobe checkpoint or a transformers model directory (default {DEFAULT_MODEL})",
    )
    add_model_aliases(q, "--ckpt")
    add_max_new_tokens(q, d.max_new_tokens, "--new-tokens")
    q.add_argument(
        "--batch-size", type=int, default=d.batch_size, help=f"prompts per generation batch (default {d.batch_size})"
    )
    q.add_argument("--seed", type=int, default=d.seed, help="sampling seed (default 0)")
    q.add_argument(
        "--min-tail",
        type=int,
        default=d.loop.min_tail,
        help=f"exact loop: minimal periodic tail in tokens (default {d.loop.min_tail})",
    )
    q.add_argument(
        "--near-window",
        type=int,
        default=d.loop.window,
        help=f"near loop and compression: tail length in tokens (default {d.loop.window})",
    )
    q.add_argument(
        "--near-max-period",
        type=int,
        default=d.loop.max_period,
        help=f"near loop: longest period tried (default {d.loop.max_period})",
    )
    q.add_argument(
        "--near-min-match",
        type=float,
        default=d.loop.min_match,
        help=f"near loop: share of tail tokens that must repeat (default {d.loop.min_match})",
    )
    q.add_argument(
        "--min-compression",
        type=float,
        default=d.loop.min_compression,
        help=f"repetitive tail: tail tokens per LZ piece (default {d.loop.min_compression})",
    )
    q.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: a small model's decode steps are dominated by thread "
        "synchronisation, and one thread is many times faster on a shared machine)",
    )
    q.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_json_flag(q)


def _data_args(q: argparse.ArgumentParser, with_val: bool) -> None:
    add_prompt_arguments(q, help_default=" (default for the bundled char model: held-out Tang openings)")
    q.add_argument(
        "--tang-prompts",
        action="store_true",
        help="openings of Tang poems outside the default corpus (the default for the bundled char model)",
    )
    q.add_argument("--prefix", type=int, default=5, help="characters per Tang opening (default 5)")
    if with_val:
        g = q.add_mutually_exclusive_group()
        g.add_argument(
            "--val-text",
            type=Path,
            default=None,
            metavar="FILE",
            help="UTF-8 text for the regression check (KL, Δloss); at least one window of tokens",
        )
        g.add_argument(
            "--tang-val",
            action="store_true",
            help="the bundled corpus's validation split (the default for the bundled char model)",
        )
        q.add_argument(
            "--val-window",
            type=int,
            default=None,
            metavar="N",
            help="tokens per regression window (default: the model's context, at most 64)",
        )


def _register_scan(lsub: Any) -> None:
    s = lsub.add_parser("scan", help="loop rates over a prompt set (chanting and plain greedy by default)")
    _model_args(s)
    _data_args(s, with_val=False)
    s.add_argument("--n", type=int, default=256, help="number of Tang openings with --tang-prompts (default 256)")
    s.add_argument(
        "--setting",
        choices=("both", "chanting", "greedy", "sample"),
        default=None,
        help="both = chanting (greedy, <unk> banned) and plain greedy (the default); sample = the sampler "
        "flags below (the default when any is given); the end-of-text token is banned in every setting",
    )
    add_sampler_arguments(s)
    s.add_argument("--out", type=Path, default=None, help="write the full scan (with per-generation records) as JSON")
    s.add_argument(
        "--backend",
        choices=("genprobe", "vllm"),
        default="genprobe",
        help="who generates: genprobe's engine (default) or vLLM (continuous batching, tensor/pipeline "
        "parallel, Ray; same JSON; a sampler vLLM cannot express exactly is refused)",
    )
    _calibration_args(s)
    add_engine_arguments(s, title="vLLM engine (with --backend vllm; passed to vllm.LLM)")
    s.set_defaults(func=run_scan)


def _calibration_args(p: Any) -> None:
    """--human-text / --no-calibrate / --human-fpr: the detectors' thresholds, calibrated on human text by default
    (scan, locate and repair judge "degenerate" the same way)."""
    c = p.add_mutually_exclusive_group()
    c.add_argument(
        "--human-text",
        type=Path,
        default=None,
        metavar="FILE",
        help="calibrate the detectors on this human text (UTF-8, one document per line) instead of the corpus "
        "chosen by the prompts' script (Chinese: held-out Tang poems; otherwise the English corpus, fetched "
        "once with `genprobe fetch english`)",
    )
    c.add_argument(
        "--no-calibrate",
        action="store_true",
        help="use the detector flags as given (the raw defaults) instead of thresholds calibrated on human text",
    )
    p.add_argument(
        "--human-fpr",
        type=float,
        default=0.01,
        metavar="RATE",
        help="calibration target: largest share of human text flagged degenerate (default 0.01)",
    )


def _register_locate(lsub: Any) -> None:
    from ..loops.repair import RepairConfig

    d = RepairConfig()
    lo = lsub.add_parser(
        "locate", help="loop direction per layer and the loop rate with each layer's direction ablated"
    )
    _model_args(lo)
    _data_args(lo, with_val=True)
    lo.add_argument("--n", type=int, default=d.n_direction, help=f"direction-set prompts (default {d.n_direction})")
    lo.add_argument("--method", choices=("mean_diff", "pca"), default=d.method)
    lo.add_argument("--search-prone", type=int, default=d.search_prone, help="loop-prone prompts per ablation scan")
    lo.add_argument(
        "--search-control", type=int, default=d.search_control, help="non-looping control prompts per ablation scan"
    )
    _calibration_args(lo)
    lo.add_argument("--out", type=Path, default=None, help="write the locate report as JSON")
    lo.set_defaults(func=run_locate)


def _register_repair(lsub: Any) -> None:
    from ..loops.repair import RepairConfig

    d = RepairConfig()
    r = lsub.add_parser("repair", help="full pipeline: scan, direction, locate, α/layer/k/form search, validate, patch")
    _model_args(r)
    _data_args(r, with_val=True)
    r.add_argument(
        "--out", type=Path, required=True, help="directory for repair.json, patch.*, repair.html, repair.png"
    )
    r.add_argument("--n-direction", type=int, default=d.n_direction)
    r.add_argument("--n-search", type=int, default=d.n_search)
    r.add_argument("--n-validate", type=int, default=d.n_validate)
    r.add_argument(
        "--search-prone", type=int, default=d.search_prone, help="loop-prone prompts per candidate evaluation"
    )
    r.add_argument(
        "--search-control", type=int, default=d.search_control, help="non-looping control prompts per candidate"
    )
    r.add_argument(
        "--ks", type=int, nargs="+", default=list(d.ks), help=f"columns per layer to try (default {list(d.ks)})"
    )
    r.add_argument(
        "--subtract-alphas",
        type=float,
        nargs="+",
        default=list(d.subtract_alphas),
        help="relative strengths for W[:,c] -= α·d (1 = remove the mean loop gap)",
    )
    r.add_argument(
        "--project-alphas",
        type=float,
        nargs="+",
        default=list(d.project_alphas),
        help="fractions for W[:,c] -= α·d(dᵀW[:,c])",
    )
    r.add_argument("--forms", nargs="+", choices=("subtract", "project"), default=list(d.forms))
    r.add_argument("--method", choices=("mean_diff", "pca"), default=d.method)
    r.add_argument("--max-kl", type=float, default=d.max_kl, help="KL(base‖edited) limit, nats (default 0.1)")
    r.add_argument(
        "--max-dloss", type=float, default=d.max_dloss, help="validation-loss increase limit, nats (default 0.02)"
    )
    _calibration_args(r)
    r.set_defaults(func=run_repair)


def _register_patch_action(lsub: Any, name: str, help: str) -> None:
    a = lsub.add_parser(name, help=help)
    a.add_argument("model", metavar="MODEL", help="a genprobe checkpoint or a transformers model directory")
    a.add_argument("patch", type=Path, help="patch file (.json or .safetensors, the other is found beside it)")
    g = a.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", type=Path, help="directory for the written model (new or empty)")
    g.add_argument("--in-place", action="store_true", help="overwrite MODEL's weight files")
    add_json_flag(a)
    a.set_defaults(func=run_apply if name == "apply" else run_revert)


# ---- common checks and loading --------------------------------------------------------------
def _progress(args: argparse.Namespace) -> bool:
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def _check_common(args: argparse.Namespace) -> None:
    import torch

    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    if args.max_new_tokens < 16:
        raise ValueError(f"--max-new-tokens must be >= 16 to see loops, got {args.max_new_tokens}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")


def _load(args: argparse.Namespace) -> Any:
    from ..model.load import load_model

    path = model_path(args, required=False) or str(DEFAULT_MODEL)
    return load_model(path)


def _is_bundled_char_model(model: Any) -> bool:
    return model.tokenizer is not None and model.tokenizer.kind == "char"


def _prompts(args: argparse.Namespace, model: Any) -> tuple[list[str] | None, str]:
    """The user's prompts (None = Tang openings) and a description of where they came from."""
    given = read_prompts(args)
    if given is not None and args.tang_prompts:
        raise ValueError("choose one prompt source: --prompt/--prompts or --tang-prompts")
    if given is not None:
        return given, f"file:{args.prompts}" if getattr(args, "prompts", None) else "command line"
    if not args.tang_prompts and not _is_bundled_char_model(model):
        raise ValueError(
            "this model is not the bundled character model, so there is no default prompt set: give --prompts FILE "
            "(one per line, or JSONL with a 'prompt'/'text' field) or --prompt TEXT ..., or choose --tang-prompts "
            "(openings of Tang poems outside the default corpus) explicitly"
        )
    return None, "tang-heldout-openings"


def _val_text(args: argparse.Namespace, model: Any) -> tuple[str, str]:
    if args.val_text is not None:
        p = Path(args.val_text)
        if not p.is_file():
            raise FileNotFoundError(f"--val-text file not found: {p}")
        try:
            return p.read_text(encoding="utf-8"), f"file:{p}"
        except UnicodeDecodeError as exc:
            raise ValueError(f"--val-text {p} is not UTF-8 text ({exc.reason})") from None
    if not args.tang_val and not _is_bundled_char_model(model):
        raise ValueError(
            "this model is not the bundled character model, so there is no default validation text: give "
            "--val-text FILE (held-out text in the model's domain) or choose --tang-val explicitly"
        )
    from ..corpus import load_corpus

    return load_corpus().val, "tang-validation-split"


def _loop_settings(args: argparse.Namespace) -> Any:
    from ..metrics import LoopSettings

    return LoopSettings(
        args.min_tail, args.near_window, args.near_max_period, args.near_min_match, args.min_compression
    )


def _repair_cfg(args: argparse.Namespace, **over: Any) -> Any:
    from ..loops.repair import RepairConfig

    return RepairConfig(
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        seed=args.seed,
        prefix_chars=args.prefix,
        loop=_loop_settings(args),
        val_window=getattr(args, "val_window", None),
        **over,
    )


def _inputs(args: argparse.Namespace, model: Any, cfg: Any, sets: tuple[str, ...]) -> Any:
    from ..loops.repair import RepairInputs

    prompts, source = _prompts(args, model)
    val, val_source = _val_text(args, model)
    if prompts is None:
        inputs = RepairInputs.tang(model.tokenizer, cfg, sets)
        inputs.val_text, inputs.val_source = val, val_source
        return inputs
    if len(sets) == 1:  # locate: every prompt goes to the direction set
        return RepairInputs(list(dict.fromkeys(prompts)), [], [], val, source, val_source)
    return RepairInputs.from_prompts(prompts, val, cfg, source, val_source)


# ---- scan -----------------------------------------------------------------------------------
def _scan_settings(args: argparse.Namespace, model: Any) -> dict:
    from ..loops.scan import chanting_sampler, greedy_sampler

    unk = model.unk_id
    given = sampler_flags_given(args)
    setting = args.setting or ("sample" if given else "both")
    if given and setting != "sample":  # never ignore a sampler flag silently
        raise ValueError(f"{' '.join(given)} set the sampler of --setting sample, not of --setting {setting}")
    if setting == "sample":
        return {"sample": sampler_from_args(args, model.tokenizer)}
    return {
        "both": {"chanting": chanting_sampler(unk), "greedy": greedy_sampler()},
        "chanting": {"chanting": chanting_sampler(unk)},
        "greedy": {"greedy": greedy_sampler()},
    }[setting]


def _calibration(args: argparse.Namespace, model: Any, texts: list[str]) -> Any:
    """The detector calibration of this scan (None with --no-calibrate); says which human text it used."""
    from ..loops.scan import calibrate_for_scan

    if args.no_calibrate:
        info("detectors: raw settings (--no-calibrate): no human false-positive rate is measured")
        return None
    if not 0.0 <= args.human_fpr < 1.0:
        raise ValueError(f"--human-fpr must be in [0, 1), got {args.human_fpr}")
    cal = calibrate_for_scan(
        model.tokenizer,
        args.max_new_tokens,
        texts,
        human_text=args.human_text,
        base=_loop_settings(args),
        target=args.human_fpr,
        unk_id=model.unk_id,
    )
    info(f"detectors: {cal.describe()}")
    return cal


def run_scan(args: argparse.Namespace) -> int:
    """Scan one or two decoding settings and print the tables (tokens, characters where they are the unit, and
    the human false-positive rate of the calibrated detectors)."""
    from .._io import atomic_write_json
    from ..loops.prompts import heldout_openings
    from ..loops.repair import LoopStudy
    from ..loops.scan import annotate_scan, scan_table

    _check_common(args)
    if args.backend == "vllm" and vllm_missing("loops scan"):
        return 2
    model = _load(args)
    texts, source = _prompts(args, model)
    if texts is None:
        texts = heldout_openings(model.tokenizer, args.n, args.prefix)
    calibration = _calibration(args, model, texts)
    cfg = _repair_cfg(args)
    if calibration is not None:
        cfg.loop = calibration.settings
    chars_unit = _is_bundled_char_model(model)
    study = LoopStudy(model, cfg, progress=_progress(args))
    ids = study.encode(texts)
    end = study.end_token
    if end.banned:
        info(f"note: {end.note}")
    settings = _scan_settings(args, model)
    scan, backend = _scan_backend(args, model, study, settings, ids)
    out = {
        "model": str(model.source),
        "prompts": len(texts),
        "prompt_source": source,
        "max_new_tokens": args.max_new_tokens,
        "end_token": end.to_dict(),
        **backend,
        "calibration": calibration.to_dict() if calibration is not None else None,
        "scans": {},
    }
    full = {**out, "scans": {}}
    for name, sampler in settings.items():
        t0 = time.perf_counter()
        res = annotate_scan(scan(ids, texts, sampler=sampler, desc=name), calibration, chars_unit)
        info(scan_table(res.summary, f"{name} ({time.perf_counter() - t0:.1f} s)"))
        examples = [
            {
                "prompt": r.prompt,
                "text": r.text,
                "period": r.measures.period,
                "near_period": r.measures.near_period,
                "near_match": r.measures.near_match,
                "degenerate": r.degenerate,
                "unit_text": r.unit_text,
            }
            for r in res.records[:5]
        ]
        out["scans"][name] = {
            "settings": res.settings.to_dict(),
            "summary": res.summary.to_dict(),
            "examples": examples,
        }
        full["scans"][name] = res.to_dict()
    if args.out:
        atomic_write_json(args.out, full)
        info(f"wrote {args.out}")
    if args.json:
        emit_json(out)
    return 0


def _scan_backend(args: argparse.Namespace, model: Any, study: Any, settings: dict, ids: Any) -> tuple[Any, dict]:
    """The scan function of ``--backend`` and what the JSON says about it (every sampler is checked before vLLM
    starts: a setting it cannot express exactly is refused, never approximated). vLLM is sized to the scan as
    verify-serving sizes it to its checks: the context fits the longest prompt plus the new tokens, and the
    KV budget what the scan's sequences need (a CPU machine's default memory fraction often leaves none)."""
    if args.backend == "genprobe":
        return study.scan, {"backend": "genprobe"}
    from ..serving.engine import shared_engine, size_for_workload
    from ..serving.sampling import UnsupportedSamplerError
    from ..serving.scan import check_sampler_vllm, scan_study_vllm

    for name, sampler in settings.items():
        try:
            check_sampler_vllm(sampler, model.vocab_size, model.eos_id)
        except UnsupportedSamplerError as exc:
            hint = " (on the command line: --preset vllm or --order vllm)" if "engine=" in str(exc) else ""
            raise ValueError(f"--backend vllm cannot run the {name!r} setting exactly: {exc}{hint}") from None
    longest = max(len(p) for p in ids)
    options = size_for_workload(
        model.source,
        engine_options(args, seed=args.seed),
        longest_prompt=longest,
        new_tokens=args.max_new_tokens,
        sequences=max(1, min(len(ids), args.batch_size)),
    )
    engine = shared_engine(model.source, options)
    info(f"vLLM engine ready ({engine.startup_seconds:.1f} s)")

    def scan(ids: Any, texts: Any, *, sampler: Any, desc: str) -> Any:
        return scan_study_vllm(engine, study, ids, texts, sampler=sampler, desc=desc)

    return scan, {"backend": "vllm", "vllm": engine.describe()}


# ---- locate and repair ----------------------------------------------------------------------
def run_locate(args: argparse.Namespace) -> int:
    """Directions and per-layer ablation on the direction set only."""
    from .._io import atomic_write_json
    from ..loops.repair import locate_only

    _check_common(args)
    model = _load(args)
    cfg = _repair_cfg(
        args, n_direction=args.n, method=args.method, search_prone=args.search_prone, search_control=args.search_control
    )
    inputs = _inputs(args, model, cfg, ("direction",))
    calibration = _calibrate_cfg(args, model, cfg, inputs)
    rep = locate_only(model, inputs, cfg, progress=_progress(args), log=info)
    for a in rep.locate.per_layer:
        info(
            f"  layer {a.layers[0]}: degenerate rate {a.degenerate_rate:.3f} (exact loops {a.loop_rate:.3f}; "
            f"reduction {a.reduction:+.3f})"
        )
    info(f"  ranking: {rep.locate.ranking}")
    data = rep.to_dict() | {"calibration": calibration.to_dict() if calibration is not None else None}
    if args.out:
        atomic_write_json(args.out, data)
    if args.json:
        emit_json(data)
    return 0


def _calibrate_cfg(args: argparse.Namespace, model: Any, cfg: Any, inputs: Any) -> Any:
    """Calibrate the detectors on human text of the direction prompts' language and put them in ``cfg`` (what
    counts as degenerate decides which prompts are loop-prone); None with --no-calibrate."""
    calibration = _calibration(args, model, inputs.direction)
    if calibration is not None:
        cfg.loop = calibration.settings
    return calibration


def _check_repair_args(args: argparse.Namespace) -> None:
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} exists and is not a directory")
    grids = (("--ks", args.ks), ("--subtract-alphas", args.subtract_alphas), ("--project-alphas", args.project_alphas))
    for name, vals in grids:
        if any(x <= 0 for x in vals):
            raise ValueError(f"{name} values must be > 0, got {vals}")


def run_repair(args: argparse.Namespace) -> int:
    """The whole pipeline; writes report, patch, HTML and PNG into --out."""
    from .._io import atomic_write_json
    from ..loops.patch import save_patch
    from ..loops.repair import repair
    from ..loops.report import write_summary

    _check_common(args)
    _check_repair_args(args)
    t0 = time.perf_counter()
    model = _load(args)
    cfg = _repair_cfg(
        args,
        n_direction=args.n_direction,
        n_search=args.n_search,
        n_validate=args.n_validate,
        search_prone=args.search_prone,
        search_control=args.search_control,
        ks=tuple(args.ks),
        subtract_alphas=tuple(args.subtract_alphas),
        project_alphas=tuple(args.project_alphas),
        forms=tuple(args.forms),
        method=args.method,
        max_kl=args.max_kl,
        max_dloss=args.max_dloss,
    )
    inputs = _inputs(args, model, cfg, ("direction", "search", "validate"))
    calibration = _calibrate_cfg(args, model, cfg, inputs)
    report, patch = repair(model, inputs, cfg, progress=_progress(args), log=info)
    data = report.to_dict() | {"calibration": calibration.to_dict() if calibration is not None else None}
    args.out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    if patch is not None:
        st, js = save_patch(patch, args.out / "patch")
        files.update(patch_tensors=str(st), patch=str(js))
    files.update({k: str(v) for k, v in write_summary(data, args.out).items()})
    data.update(model_path=str(model.source), wall_seconds=round(time.perf_counter() - t0, 1), files=files)
    atomic_write_json(args.out / "repair.json", data)
    info(f"verdict: {report.verdict} ({data['wall_seconds']} s); wrote {args.out}")
    _print_validation(report)
    if args.json:
        keys = (
            "verdict",
            "end_token",
            "inputs",
            "baseline",
            "locate",
            "validation",
            "patch",
            "timings_s",
            "wall_seconds",
            "files",
        )
        emit_json({k: data[k] for k in keys} | {"chosen": data["search"]["chosen"]})
    return 0


def _print_validation(report: Any) -> None:
    v = report.validation
    if v is None:
        return
    b, a = v.before, v.after
    info(
        f"  held-out exact loop rate {b.loop_rate:.3f} → {a.loop_rate:.3f}; near {b.near_loop_rate:.3f} → "
        f"{a.near_loop_rate:.3f}; repetitive {b.repetitive_rate:.3f} → {a.repetitive_rate:.3f}; degenerate "
        f"{b.degenerate_rate:.3f} → {a.degenerate_rate:.3f}"
    )
    info(
        f"  tail compression {b.mean_tail_compression:.2f} → {a.mean_tail_compression:.2f}; seq-rep-4 "
        f"{b.mean_seq_rep_4:.3f} → {a.mean_seq_rep_4:.3f}; KL {v.regression.kl:.4f}, Δloss {v.regression.dloss:+.4f}; "
        f"{100 * report.patch.fraction_changed:.3f}% of weights"
    )


# ---- compare --------------------------------------------------------------------------------
COMPARE_SKIP = 2816  # direction + search + validation sets of a default `loops repair` (768 + 1024 + 1024)


def _register_compare(lsub: Any) -> None:
    from ..loops.compare_human import GENRES
    from ..loops.compare_methods import METHODS

    c = lsub.add_parser(
        "compare",
        help="which fix for loops: decode-time samplers beside the weight edit (one table, one figure, one HTML page)",
    )
    _model_args(c)
    _data_args(c, with_val=False)
    c.add_argument(
        "--n", type=int, default=None, help="at most N prompts (default: 512 Tang openings; every prompt of a file)"
    )
    c.add_argument(
        "--skip",
        type=int,
        default=COMPARE_SKIP,
        help=f"Tang openings skipped first (default {COMPARE_SKIP}: the sets a default `loops repair` "
        "uses, so no opening the edit was chosen on is compared)",
    )
    c.add_argument(
        "--methods",
        nargs="+",
        default=None,
        metavar="METHOD",
        help=f"methods to compare (default: all; greedy is always the baseline): {' '.join(METHODS)}",
    )
    c.add_argument(
        "--patch",
        type=Path,
        default=None,
        help="loop patch from `loops repair` for the edit rows (applied in memory, reverted, sha256-checked)",
    )
    c.add_argument(
        "--judge",
        default=None,
        metavar="MODEL",
        help="a second model that scores every method's text (NLL per character)",
    )
    c.add_argument(
        "--genre",
        choices=GENRES,
        default="auto",
        help="tang: reduplication and couplet parallels; text: repeated n-grams (default: auto)",
    )
    c.add_argument(
        "--timing-rounds",
        type=int,
        default=3,
        help="interleaved rounds of one batch per method for tokens/s (default 3)",
    )
    c.add_argument(
        "--out",
        type=Path,
        required=True,
        help="directory for compare.json, compare-texts.json, compare.md, compare.png, compare.html",
    )
    _calibration_args(c)
    c.set_defaults(func=run_compare)


def _compare_prompts(args: argparse.Namespace, model: Any) -> tuple[list[str], list | None, str]:
    """Prompts, human continuations from a JSONL file (or None) and the prompt source."""
    from ..loops.compare_human import read_continuations
    from ..loops.prompts import heldout_openings

    if args.n is not None and args.n < 1:
        raise ValueError(f"--n must be >= 1, got {args.n}")
    if args.skip < 0:
        raise ValueError(f"--skip must be >= 0, got {args.skip}")
    texts, source = _prompts(args, model)
    conts = read_continuations(args.prompts) if texts is not None and getattr(args, "prompts", None) else None
    if texts is None:
        n = args.n or 512
        texts = heldout_openings(model.tokenizer, args.skip + n, args.prefix)[args.skip :]
        source = f"tang-heldout-openings (after the first {args.skip})"
    n = args.n or len(texts)
    return texts[:n], (conts[:n] if conts is not None else None), source


def run_compare(args: argparse.Namespace) -> int:
    """Compare the fixes on one prompt set; write JSON, table, figure and page into --out."""
    from ..loops.compare import CompareConfig, compare_fixes
    from ..loops.compare_report import breaker_table, markdown_table, write_outputs
    from ..loops.patch import load_patch
    from ..model.load import load_model

    _check_common(args)
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} exists and is not a directory")
    model = _load(args)
    texts, conts, source = _compare_prompts(args, model)
    calibration = _calibration(args, model, texts)
    cfg = CompareConfig(
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
        seed=args.seed,
        loop=calibration.settings if calibration is not None else _loop_settings(args),
        methods=tuple(args.methods) if args.methods else None,
        genre=args.genre,
        timing_rounds=args.timing_rounds,
    )
    patch = load_patch(args.patch) if args.patch else None
    judge = load_model(args.judge) if args.judge else None
    res = compare_fixes(
        model,
        texts,
        cfg,
        patch=patch,
        patch_path=str(args.patch) if args.patch else None,
        judge=judge,
        continuations=conts,
        prompt_source=source,
        progress=_progress(args),
        log=info,
    )
    if calibration is not None:
        res.calibration = calibration.to_dict()
        res.notes.append(f"detectors: {calibration.describe()}")
    files = write_outputs(res, args.out)
    info(markdown_table(res))
    info(breaker_table(res))
    if res.best is not None:
        info(f"best decode-time method: {res.best.name} (acceptable: {res.best.acceptable})")
    info(f"wrote {args.out} ({res.timings_s['total']} s)")
    if args.json:
        d = res.to_dict()
        emit_json(
            {
                k: d[k]
                for k in ("model", "judge", "n_prompts", "config", "best", "patch", "timings_s", "notes", "calibration")
            }
            | {
                "methods": {
                    m["name"]: {
                        "sampler": m["sampler"],
                        "rates": m["rates"],
                        "legit": m["legit"],
                        "nll_own": m["nll_own"],
                        "nll_judge": m["nll_judge"],
                        "cost": m["cost"],
                    }
                    for m in d["methods"]
                },
                "human": d["human"],
                "files": {k: str(v) for k, v in files.items()},
            }
        )
    return 0


# ---- apply / revert -------------------------------------------------------------------------
def _write_ckpt(args: argparse.Namespace, model: Any, note: dict) -> Path:
    from ..model.checkpoint import META, save_checkpoint

    out = Path(args.model) if args.in_place else args.out
    if not args.in_place:
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} exists and is not a directory")
        if out.is_dir() and any(out.iterdir()) and not (out / META).exists():
            raise ValueError(
                f"--out {out} is a non-empty directory that is not a genprobe checkpoint; refusing to write into it"
            )
    summary = dict(model.meta.get("summary", {}))
    summary.pop("loop_patch", None)
    if note:
        summary["loop_patch"] = note
    save_checkpoint(out, model.module, model.tokenizer, summary)
    return out


def _apply_or_revert(args: argparse.Namespace, revert: bool) -> int:
    from ..loops.hf_patch import apply_to_dir, revert_dir
    from ..loops.patch import apply_patch, load_patch, revert_patch
    from ..model.checkpoint import is_checkpoint
    from ..model.load import load_model

    patch = load_patch(args.patch)
    src = Path(args.model)
    action = "revert" if revert else "apply"
    res: dict[str, Any] = {
        "action": action,
        "model": str(src),
        "weights_changed": patch.meta.get("weights_changed"),
        "fraction_changed": patch.meta.get("fraction_changed"),
    }
    if is_checkpoint(src):
        model = load_model(src)
        sha = (revert_patch if revert else apply_patch)(model.module, patch)
        note = (
            {}
            if revert
            else {
                "patch": str(args.patch),
                "sha256_before": patch.meta["sha256_before"],
                "sha256_after": patch.meta["sha256_after"],
                "edit": patch.meta.get("edit"),
            }
        )
        res.update(out=str(_write_ckpt(args, model, note)), state_sha256=sha)
    else:
        out = src if args.in_place else args.out
        r = (revert_dir if revert else apply_to_dir)(src, patch, out)
        res.update(
            out=r.out,
            state_sha256=r.state_sha256,
            weight_files=r.rewritten,
            matches_original=r.matches_original,
            notes=r.notes,
        )
        for n in r.notes:
            info(f"note: {n}")
    info(f"{action}: wrote {res['out']} (state sha256 {res['state_sha256'][:16]}…)")
    if args.json:
        emit_json(res)
    return 0


def run_apply(args: argparse.Namespace) -> int:
    """Apply a patch (hash-checked) and write the patched model."""
    return _apply_or_revert(args, revert=False)


def run_revert(args: argparse.Namespace) -> int:
    """Revert a patch (hash-checked both ways) and write the original model."""
    return _apply_or_revert(args, revert=True)
