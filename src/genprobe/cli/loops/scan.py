"""``genprobe loops scan MODEL``: loop rates over a prompt set, through our engine or vLLM."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from .._common import emit_json, info, out_dir
from .._sampler_args import add_sampler_arguments, sampler_flags_given, sampler_from_args
from .._vllm_args import add_engine_arguments, engine_options, vllm_missing
from ._shared import (
    _calibration,
    _calibration_args,
    _check_common,
    _data_args,
    _is_bundled_char_model,
    _load,
    _model_args,
    _progress,
    _prompts,
    _repair_cfg,
)

SCAN_FILE = "scan.json"  # what --out DIR holds


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
    s.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"directory for {SCAN_FILE}: the full scan, with per-generation records (created if missing)",
    )
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


def _scan_settings(args: argparse.Namespace, model: Any) -> dict:
    from ...loops.scan import chanting_sampler, greedy_sampler

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


def run_scan(args: argparse.Namespace) -> int:
    """Scan one or two decoding settings and print the tables (tokens, characters where they are the unit, and
    the human false-positive rate of the calibrated detectors)."""
    from ..._io import atomic_write_json
    from ...loops.prompts import heldout_openings
    from ...loops.repair import LoopStudy
    from ...loops.scan import annotate_scan, scan_table

    _check_common(args)
    if args.out:
        out_dir(args.out, SCAN_FILE)
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
        atomic_write_json(args.out / SCAN_FILE, full)
        info(f"wrote {args.out / SCAN_FILE}")
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
    from ...serving.engine import shared_engine, size_for_workload
    from ...serving.sampling import UnsupportedSamplerError
    from ...serving.scan import check_sampler_vllm, scan_study_vllm

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
