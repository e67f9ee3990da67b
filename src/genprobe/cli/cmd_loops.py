"""``genprobe loops scan|locate|repair|apply|revert``: loop observatory and directional weight repair."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ._common import add_json_flag, emit_json, info

DEFAULT_CKPT = Path("out/case/model")  # what `bash scripts/case.sh` trains


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``loops`` and its sub-commands."""
    from ..loops.repair import RepairConfig

    d = RepairConfig()
    p = sub.add_parser(
        "loops",
        help="measure greedy loops over prompt sets and repair them with a small directional weight edit",
        description="Loop observatory and directional repair (seed 001). Default decoding is the seed's "
        "'chanting' setting: greedy with <unk> banned.",
    )
    lsub = p.add_subparsers(dest="loops_command", metavar="ACTION")

    def model_args(q: argparse.ArgumentParser) -> None:
        q.add_argument("--ckpt", type=Path, default=DEFAULT_CKPT,
                       help=f"genprobe checkpoint or transformers model directory (default {DEFAULT_CKPT})")
        q.add_argument("--new-tokens", type=int, default=d.max_new_tokens, help=f"new tokens per prompt (default {d.max_new_tokens})")
        q.add_argument("--batch-size", type=int, default=d.batch_size, help=f"prompts per generation batch (default {d.batch_size})")
        q.add_argument("--seed", type=int, default=d.seed, help="sampling seed (default 0)")
        q.add_argument("--min-tail", type=int, default=8, help="minimal periodic tail (tokens) to call a loop (default 8)")
        q.add_argument("--threads", type=int, default=1,
                       help="torch CPU threads (default 1: a small model's decode steps are dominated by thread "
                       "synchronisation, and one thread is many times faster on a shared machine)")
        q.add_argument("--no-progress", action="store_true", help="no progress bars")
        add_json_flag(q)

    s = lsub.add_parser("scan", help="loop rate over a prompt set (chanting and plain greedy by default)")
    model_args(s)
    s.add_argument("--prompts", type=Path, default=None, help="file with one prompt per line (default: held-out poem openings)")
    s.add_argument("--n", type=int, default=256, help="number of held-out openings when --prompts is not given (default 256)")
    s.add_argument("--prefix", type=int, default=d.prefix_chars, help="characters per held-out opening (default 5)")
    s.add_argument("--setting", choices=("both", "chanting", "greedy", "sample"), default="both",
                   help="both = chanting (greedy, <unk> banned) and plain greedy; sample = --temperature/--top-k/--top-p")
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=None)
    s.add_argument("--top-p", type=float, default=None)
    s.add_argument("--ban-unk", action="store_true", help="with --setting sample: ban <unk>")
    s.add_argument("--out", type=Path, default=None, help="write the full scan (with per-generation records) as JSON")
    s.set_defaults(func=run_scan)

    lo = lsub.add_parser("locate", help="loop direction per layer and the loop rate with each layer's direction ablated")
    model_args(lo)
    lo.add_argument("--n", type=int, default=d.n_direction, help=f"held-out openings to scan (default {d.n_direction})")
    lo.add_argument("--method", choices=("mean_diff", "pca"), default=d.method)
    lo.add_argument("--out", type=Path, default=None, help="write the locate report as JSON")
    lo.set_defaults(func=run_locate)

    r = lsub.add_parser("repair", help="full pipeline: scan, direction, locate, α/layer/k/form search, validate, patch")
    model_args(r)
    r.add_argument("--out", type=Path, required=True, help="directory for repair.json, patch.*, repair.html, repair.png")
    r.add_argument("--n-direction", type=int, default=d.n_direction)
    r.add_argument("--n-search", type=int, default=d.n_search)
    r.add_argument("--n-validate", type=int, default=d.n_validate)
    r.add_argument("--search-prone", type=int, default=d.search_prone, help="loop-prone prompts per candidate evaluation")
    r.add_argument("--search-control", type=int, default=d.search_control, help="non-looping control prompts per candidate")
    r.add_argument("--ks", type=int, nargs="+", default=list(d.ks), help=f"columns per layer to try (default {list(d.ks)})")
    r.add_argument("--subtract-alphas", type=float, nargs="+", default=list(d.subtract_alphas),
                   help="relative strengths for W[:,c] -= α·d (1 = remove the mean loop gap)")
    r.add_argument("--project-alphas", type=float, nargs="+", default=list(d.project_alphas),
                   help="fractions for W[:,c] -= α·d(dᵀW[:,c])")
    r.add_argument("--forms", nargs="+", choices=("subtract", "project"), default=list(d.forms))
    r.add_argument("--method", choices=("mean_diff", "pca"), default=d.method)
    r.add_argument("--max-kl", type=float, default=d.max_kl, help="KL(base‖edited) limit, nats (default 0.1)")
    r.add_argument("--max-dloss", type=float, default=d.max_dloss, help="validation-loss increase limit, nats (default 0.02)")
    r.set_defaults(func=run_repair)

    a = lsub.add_parser("apply", help="apply a patch to a checkpoint (refused if its weights hash differs)")
    a.add_argument("ckpt", type=Path)
    a.add_argument("patch", type=Path, help="patch file (.json or .safetensors, the other is found beside it)")
    g = a.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", type=Path, help="new checkpoint directory")
    g.add_argument("--in-place", action="store_true", help="overwrite CKPT")
    add_json_flag(a)
    a.set_defaults(func=run_apply)

    v = lsub.add_parser("revert", help="restore the exact original weights of a patched checkpoint")
    v.add_argument("ckpt", type=Path)
    v.add_argument("patch", type=Path)
    g = v.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", type=Path, help="checkpoint directory to write the restored model to")
    g.add_argument("--in-place", action="store_true", help="overwrite CKPT")
    add_json_flag(v)
    v.set_defaults(func=run_revert)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _progress(args) -> bool:
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def _load(path: Path):
    from ..engine.hf_adapter import load_causal_lm

    return load_causal_lm(path)


def _unk(tok) -> int:
    return int(getattr(tok, "unk_id", None) or getattr(tok, "stoi", {}).get("<unk>", 1))


def _check_common(args) -> None:
    import torch

    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    if args.new_tokens < 16:
        raise ValueError(f"--new-tokens must be >= 16 to see loops, got {args.new_tokens}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")


def run_scan(args: argparse.Namespace) -> int:
    """Scan one or two decoding settings and print the tables."""
    from ..engine.sampling import SamplerConfig
    from ..loops.prompts import heldout_openings, read_prompt_file
    from ..loops.repair import _decode
    from ..loops.scan import chanting_sampler, greedy_sampler, scan_loops, scan_table
    from .._io import atomic_write_json

    _check_common(args)
    model, tok = _load(args.ckpt)
    texts = read_prompt_file(args.prompts) if args.prompts else heldout_openings(tok, args.n, args.prefix)
    ids = [tok.encode(t) for t in texts]
    unk = _unk(tok)
    settings = {
        "both": {"chanting": chanting_sampler(unk), "greedy": greedy_sampler()},
        "chanting": {"chanting": chanting_sampler(unk)},
        "greedy": {"greedy": greedy_sampler()},
        "sample": {"sample": SamplerConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                           ban_ids=(unk,) if args.ban_unk else ())},
    }[args.setting]
    out = {"ckpt": str(args.ckpt), "prompts": len(texts), "new_tokens": args.new_tokens, "scans": {}}
    full = dict(out)
    full["scans"] = {}
    for name, sampler in settings.items():
        t0 = time.perf_counter()
        res = scan_loops(model, ids, args.new_tokens, sampler, batch_size=args.batch_size, seed=args.seed, unk_id=unk,
                         min_tail=args.min_tail, decode=_decode(tok), prompt_texts=texts, progress=_progress(args), desc=name)
        info(scan_table(res.summary, f"{name} ({time.perf_counter() - t0:.1f} s)"))
        out["scans"][name] = {"settings": res.settings, "summary": res.summary,
                              "examples": [{k: r[k] for k in ("prompt", "text", "period", "onset", "unit_text")}
                                           for r in res.records[:5]]}
        full["scans"][name] = res.to_dict()
    if args.out:
        atomic_write_json(args.out, full)
        info(f"wrote {args.out}")
    if args.json:
        emit_json(out)
    return 0


def _repair_cfg(args, **over):
    from ..loops.repair import RepairConfig

    return RepairConfig(max_new_tokens=args.new_tokens, batch_size=args.batch_size, seed=args.seed,
                        min_tail=args.min_tail, **over)


def run_locate(args: argparse.Namespace) -> int:
    """Directions and per-layer ablation on the direction set only."""
    from ..corpus import load_corpus
    from ..loops.repair import locate_only
    from .._io import atomic_write_json

    _check_common(args)
    model, tok = _load(args.ckpt)
    cfg = _repair_cfg(args, n_direction=args.n, method=args.method)
    rep = locate_only(model, tok, load_corpus().val, cfg, progress=_progress(args), log=info)
    for r in rep["locate"]["per_layer"]:
        info(f"  layer {r['layer']}: loop rate {r['loop_rate']:.3f} (reduction {r['reduction']:+.3f})")
    info(f"  ranking: {rep['locate']['ranking']}")
    if args.out:
        atomic_write_json(args.out, rep)
    if args.json:
        emit_json(rep)
    return 0


def run_repair(args: argparse.Namespace) -> int:
    """The whole pipeline; writes report, patch, HTML and PNG into --out."""
    from ..corpus import load_corpus
    from ..loops.patch import save_patch
    from ..loops.repair import repair
    from ..loops.report import write_summary
    from .._io import atomic_write_json

    _check_common(args)
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} exists and is not a directory")
    for name, vals in (("--ks", args.ks), ("--subtract-alphas", args.subtract_alphas), ("--project-alphas", args.project_alphas)):
        if any(x <= 0 for x in vals):
            raise ValueError(f"{name} values must be > 0, got {vals}")
    t0 = time.perf_counter()
    model, tok = _load(args.ckpt)
    cfg = _repair_cfg(
        args, n_direction=args.n_direction, n_search=args.n_search, n_validate=args.n_validate,
        search_prone=args.search_prone, search_control=args.search_control, ks=tuple(args.ks),
        subtract_alphas=tuple(args.subtract_alphas), project_alphas=tuple(args.project_alphas), forms=tuple(args.forms),
        method=args.method, max_kl=args.max_kl, max_dloss=args.max_dloss,
    )
    report, patch = repair(model, tok, load_corpus().val, cfg, progress=_progress(args), log=info)
    report["ckpt"] = str(args.ckpt)
    args.out.mkdir(parents=True, exist_ok=True)
    files = {}
    if patch is not None:
        st, js = save_patch(patch, args.out / "patch")
        files.update(patch_tensors=str(st), patch=str(js))
    files.update({k: str(v) for k, v in write_summary(report, args.out).items()})
    report["wall_seconds"] = round(time.perf_counter() - t0, 1)
    report["files"] = files
    atomic_write_json(args.out / "repair.json", report)
    info(f"verdict: {report['verdict']} ({report['wall_seconds']} s); wrote {args.out}")
    v = report.get("validation")
    if v:
        b, a = v["before"], v["after"]
        info(f"  held-out loop rate {b['loop_rate']:.3f} → {a['loop_rate']:.3f}; loop-prone "
             f"{v['loop_prone_before']['loop_rate']:.3f} → {v['loop_prone_after']['loop_rate']:.3f}; "
             f"KL {v['regression']['kl']:.4f}, Δloss {v['regression']['dloss']:+.4f}; "
             f"{100 * report['patch']['fraction_changed']:.3f}% of weights")
    if args.json:
        emit_json({k: report[k] for k in ("verdict", "baseline", "locate", "validation", "patch", "timings_s", "wall_seconds",
                                          "files") if k in report} | {"chosen": report["search"]["chosen"]})
    return 0


def _write_ckpt(args, model, tok, meta, note: dict) -> Path:
    from ..model.checkpoint import META, save_checkpoint

    out = args.ckpt if args.in_place else args.out
    if not args.in_place:
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} exists and is not a directory")
        if out.is_dir() and any(out.iterdir()) and not (out / META).exists():
            raise ValueError(f"--out {out} is a non-empty directory that is not a genprobe checkpoint; refusing to write into it")
    summary = dict(meta.get("summary", {}))
    summary.pop("loop_patch", None)
    if note:
        summary["loop_patch"] = note
    save_checkpoint(out, model, tok, summary)
    return out


def _apply_or_revert(args, revert: bool) -> int:
    from ..loops.patch import apply_patch, load_patch, revert_patch
    from ..model.checkpoint import load_checkpoint

    patch = load_patch(args.patch)
    model, tok, meta = load_checkpoint(args.ckpt)
    sha = (revert_patch if revert else apply_patch)(model, patch)
    note = {} if revert else {"patch": str(args.patch), "sha256_before": patch.meta["sha256_before"],
                              "sha256_after": patch.meta["sha256_after"], "edit": patch.meta.get("edit")}
    out = _write_ckpt(args, model, tok, meta, note)
    res = {"action": "revert" if revert else "apply", "ckpt": str(args.ckpt), "out": str(out), "state_sha256": sha,
           "weights_changed": patch.meta.get("weights_changed"), "fraction_changed": patch.meta.get("fraction_changed")}
    info(f"{res['action']}: wrote {out} (state sha256 {sha[:16]}…)")
    if args.json:
        emit_json(res)
    return 0


def run_apply(args: argparse.Namespace) -> int:
    """Apply a patch (hash-checked) and save the patched checkpoint."""
    return _apply_or_revert(args, revert=False)


def run_revert(args: argparse.Namespace) -> int:
    """Revert a patch (hash-checked both ways) and save the original checkpoint."""
    return _apply_or_revert(args, revert=True)
