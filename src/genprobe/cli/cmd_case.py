"""``genprobe case``: the chapter's case study as one command → ch3_case.json, figures, report.html.

    genprobe case [MODEL] --out DIR [--quick] [--only EXP ...] [--skip EXP ...] [--json]

The chapter is 《训练与推理的两副面孔》 ("The two faces of training and inference"). MODEL is a genprobe
checkpoint; without it the default model is trained into OUT/model (reused when already there).
``--ckpt DIR`` is the deprecated spelling of MODEL (it warns).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from ._common import add_json_flag, add_model_aliases, add_model_argument, emit_json, info, model_path


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``case`` sub-command."""
    p = sub.add_parser(
        "case",
        help="run the case study: train/reuse the default model, every experiment, JSON + figures + HTML report",
        description="Reproduce the chapter's measurements on the bundled Tang-poem GPT. Writes "
        "OUT/ch3_case.json, OUT/fig_*.png and one offline OUT/report.html. Without MODEL the default "
        "model is trained into OUT/model (reused when already there).",
    )
    add_model_argument(p, required=False, help="a genprobe checkpoint directory to study (default: train one into OUT/model)")
    add_model_aliases(p, "--ckpt")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--quick", action="store_true",
                   help="reduced run for CI / first contact (quick training recipe, fewer timing reps, a shrunk scaling model)")
    p.add_argument("--only", nargs="+", metavar="EXP", default=None,
                   help="run only these experiments (decoding sampling exposure cache_exact cache_bugs mask_noop cache_timing cache_scaling)")
    p.add_argument("--skip", nargs="+", metavar="EXP", default=(), help="skip these experiments")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_json_flag(p)
    p.set_defaults(func=run)


def _load(path: str):
    """(GPT, tokenizer, checkpoint meta, path) of a genprobe checkpoint, through the one loader."""
    from ..model.load import load_model

    m = load_model(path)
    if m.kind != "genprobe":
        raise ValueError(f"{path} is a {m.arch} transformers model; the case study needs a genprobe checkpoint "
                         "(the character-level Tang GPT the chapter studies)")
    return m.module, m.tokenizer, m.meta, str(path)


def _model(args, corpus, progress: bool):
    """The model to study: MODEL, else the default one trained (or reused) in OUT/model."""
    from dataclasses import asdict

    from ..corpus import CharTokenizer
    from ..model.checkpoint import is_checkpoint, read_meta, save_checkpoint
    from ..model.train import TrainConfig, quick_train_config, train

    path = model_path(args, required=False)
    if path is not None:
        info(f"case: using checkpoint {path}")
        return _load(path)
    d = args.out / "model"
    tc = quick_train_config() if args.quick else TrainConfig()
    wanted = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(tc).items()}
    if is_checkpoint(d) and read_meta(d).get("summary", {}).get("train_config") == wanted:
        info(f"case: reusing the model already trained in {d}")
        return _load(str(d))
    info(f"case: training the default model ({tc.steps} steps) into {d}")
    tok = CharTokenizer.from_text(corpus.text, 1200)
    res = train(corpus, tok, tc=tc, progress=progress)
    save_checkpoint(d, res.model, tok, res.summary)
    return _load(str(d))


def _experiments(args) -> tuple[str, ...]:
    """The experiments ``--only`` / ``--skip`` leave, in the case study's order."""
    from ..experiments.case import CASE_KEYS

    names = [k for k in CASE_KEYS if k != "model"]
    bad = [x for x in list(args.only or []) + list(args.skip) if x not in names]
    if bad:
        raise ValueError(f"unknown experiment(s) {bad}; choose from {names}")
    return tuple(x for x in (args.only or names) if x not in set(args.skip))


def run(args: argparse.Namespace) -> int:
    """Handler: train or load, run the experiments, write JSON, figures and the report."""
    import sys

    from .._io import atomic_write_json
    from ..corpus import load_corpus
    from ..experiments.case import run_case
    from ..experiments.seed import seed_tables
    from ..report import write_figures, write_report
    from ..report.html import headline_rows

    t0 = time.perf_counter()
    progress = not args.no_progress and sys.stderr.isatty()
    only = _experiments(args)
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} exists and is not a directory")
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus()
    model, tok, meta, ckpt = _model(args, corpus, progress)
    t_model = time.perf_counter() - t0
    info("case: running experiments " + ", ".join(only))
    result = run_case(model, tok, corpus, meta, quick=args.quick, progress=progress, only=only, log=info)
    result.meta.checkpoint = ckpt
    result.meta.model_seconds = round(t_model, 1)
    case = result.to_dict()
    seed = seed_tables()
    json_path = args.out / "ch3_case.json"
    atomic_write_json(json_path, case)
    figs = write_figures(case, args.out, seed)
    report = write_report(case, args.out, seed, figs)
    total = time.perf_counter() - t0
    result.meta.total_seconds = round(total, 1)
    atomic_write_json(json_path, result.to_dict())  # again, now with the total
    rows = headline_rows(case, seed)
    if args.json:
        emit_json({"out": str(args.out), "json": str(json_path), "report": str(report),
                   "figures": sorted(str(args.out / n) for n in figs), "seconds": round(total, 1),
                   "headline": [{"metric": a, "ours": b, "seed": c} for a, b, c, _ in rows]})
    else:
        w = max(len(a) for a, *_ in rows)
        print(f"{'':{w}}  {'ours':>14}  {'seed':>14}")
        for a, b, c, _ in rows:
            print(f"{a:{w}}  {_short(b):>14}  {_short(c):>14}")
        print(f"\nwrote {json_path}, {len(figs)} figures and {report} in {total:.0f} s")
    return 0


def _short(x) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1e-3 and x != 0 else f"{x:.4g}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)
