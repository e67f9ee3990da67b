"""The whole case study: every experiment of the chapter on one checkpoint → ``ch3_case.json`` (its keys follow the
chapter's own file, :data:`CASE_KEYS`, plus ``meta``). ``quick`` shrinks only what costs time (timing reps, the
scaling model's lengths, confidence sample counts): the correctness numbers are the same. :func:`run_case`
(``genprobe.run_case``, ``genprobe case``) is the whole study as one call.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm import tqdm

from .._io import json_safe
from .._version import __version__
from ..corpus.tang import Corpus
from ..corpus.tokenizer import CharTokenizer
from ..model.gpt import GPT
from ._common import CASE_PROMPT, r
from .decoding import NEW_TOKENS, DecodingResult, run_decoding
from .exposure import run_exposure
from .sampling import run_sampling
from .timing import run_cache_scaling, run_cache_timing

CASE_KEYS = tuple(
    "model decoding sampling exposure cache_exact cache_bugs mask_noop cache_timing cache_scaling".split()
)
EXPERIMENTS = CASE_KEYS[1:]  # every key but the model summary


def model_summary(model: GPT, meta: dict | None, decoding: DecodingResult | None = None) -> dict:
    """The ``model`` key: parameters and config, what the checkpoint's training summary recorded, and the decoding
    experiment's teacher-forcing loss when it ran."""
    s = (meta or {}).get("summary", {})
    corpus = s.get("corpus", {})
    out = {
        "params": model.num_parameters(),
        "config": json_safe(model.cfg),
        "train_loss": s.get("train_loss"),
        "val_loss": s.get("val_loss"),
        "unigram_ce": s.get("unigram_ce"),
        "coverage_1200": s.get("coverage"),
        "unk_share": s.get("unk_share"),
        "corpus_poems": corpus.get("documents"),
        "corpus_chars": corpus.get("chars"),
        "train_steps": s.get("train_config", {}).get("steps"),
        "train_seconds": s.get("seconds"),
    }
    tf = None if decoding is None else r(decoding.teacher_forcing.val_loss)
    return out if tf is None else out | {"teacher_forcing_loss_on_real_poems": tf}


@dataclass(kw_only=True)
class CaseMeta:
    """The ``meta`` key: versions and machine, settings, seconds per experiment (the CLI adds its totals)."""

    genprobe: str = __version__
    torch: str = torch.__version__
    python: str = field(default_factory=platform.python_version)
    machine: str = field(default_factory=platform.machine)
    threads: int = field(default_factory=lambda: torch.get_num_threads())  # the lambda reads the module, not the field
    cpu_count: int | None = field(default_factory=os.cpu_count)
    load_average: list[float] | None
    device: str = "cpu"
    quick: bool
    created_utc: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    prompt: str = CASE_PROMPT
    steps: dict[str, int]
    seconds: dict[str, float]
    checkpoint: str | None = None
    model_seconds: float | None = None
    total_seconds: float | None = None

    def to_dict(self) -> dict:
        """JSON form: environment first, then settings and timings; CLI totals only once set."""
        later = ("checkpoint", "model_seconds", "total_seconds")
        return {k: v for k, v in vars(self).items() if v is not None or k not in later}


@dataclass
class CaseResult:
    """Every experiment's typed result (verify's still plain data) with the model summary and run metadata."""

    meta: CaseMeta
    model: dict
    experiments: dict[str, Any]

    def to_dict(self) -> dict:
        """The ``ch3_case.json`` dict: meta, model, then the experiments in :data:`CASE_KEYS` order."""
        return {"meta": self.meta, "model": self.model} | {
            k: self.experiments[k] for k in CASE_KEYS if k in self.experiments
        }


def run_experiments(
    model: GPT,
    tok: CharTokenizer,
    corpus: Corpus,
    meta: dict | None = None,
    quick: bool = False,
    progress: bool = True,
    only: Sequence[str] = EXPERIMENTS,
    log: Callable[[str], None] = lambda msg: None,
) -> CaseResult:
    """Run every experiment (or those named in ``only``) on ``model``."""
    from ..verify.mutants import cache_exact, mask_noop, run_mutants

    model = model.eval()
    # timing context: a busy machine skews wall clock
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    prompt_ids = tok.encode(CASE_PROMPT, warn=False)
    short = min(NEW_TOKENS, model.cfg.block_size - len(prompt_ids))
    # the mutant table recomputes every step: cheaper when quick
    steps = {"decode": NEW_TOKENS, "cache_exact": short, "mutants": min(short, 24) if quick else short}
    # quick shrinks only what costs time
    tf_tokens, spread, reps = (4096, (0, 1, 2), 1) if quick else (None, (0, 1, 2, 3, 4), 3)
    batches, lengths = ((1, 8), (16, 32)) if quick else ((1, 16, 64), (32, 64, 128))
    stages: list[tuple[str, Callable[[], object]]] = [
        ("decoding", lambda: run_decoding(model, tok, corpus, tf_tokens=tf_tokens, spread_seeds=spread)),
        ("sampling", lambda: run_sampling(model, tok)),
        ("exposure", lambda: run_exposure(model, tok, corpus, quick=quick)),
        ("cache_exact", lambda: cache_exact(model, prompt_ids, steps=steps["cache_exact"])),
        ("cache_bugs", lambda: run_mutants(model, prompt_ids, steps=steps["mutants"])),
        ("mask_noop", lambda: mask_noop(model, prompt_ids, steps=steps["mutants"])),
        ("cache_timing", lambda: run_cache_timing(model, prompt_ids, steps["decode"], batches, reps)),
        ("cache_scaling", lambda: run_cache_scaling(prompt_ids, tok.vocab_size, lengths, reps=1, small=quick)),
    ]
    results: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    bar = tqdm([s for s in stages if s[0] in only], desc="case", unit="exp", disable=not progress, dynamic_ncols=True)
    for name, run in bar:
        bar.set_postfix_str(name)
        t0 = time.perf_counter()
        with torch.inference_mode(False), torch.no_grad():
            results[name] = run()
        seconds[name] = round(time.perf_counter() - t0, 2)  # finite: r() would only round it
        log(f"  {name}: {seconds[name]:.1f}s")
    summary = model_summary(model, meta, results.get("decoding"))
    return CaseResult(CaseMeta(quick=quick, steps=steps, seconds=seconds, load_average=load), summary, results)


@dataclass
class CaseStudy:
    """What :func:`run_case` wrote, the typed result, and the headline rows (ours beside the chapter's)."""

    result: CaseResult
    out: Path
    json_path: Path
    report: Path
    figures: list[Path]
    seconds: float
    headline: list[tuple[str, object, object]]

    def to_dict(self) -> dict:
        """The ``genprobe case --json`` summary."""
        return {
            "out": str(self.out),
            "json": str(self.json_path),
            "report": str(self.report),
            "figures": sorted(str(p) for p in self.figures),
            "seconds": round(self.seconds, 1),
            "headline": [{"metric": a, "ours": b, "seed": c} for a, b, c in self.headline],
        }


def study_model(model_path: str | Path | None, out: Path, quick: bool, progress: bool, log: Callable[[str], None]):
    """The model to study (a loaded Model): ``model_path``, else the default model trained (or reused) in OUT/model."""
    from ..corpus.tang import load_corpus
    from ..model.checkpoint import is_checkpoint, read_meta, save_checkpoint
    from ..model.load import load_model
    from ..model.train import TrainConfig, quick_train_config, train

    if model_path is None:
        d = out / "model"
        tc = quick_train_config() if quick else TrainConfig()
        if is_checkpoint(d) and read_meta(d).get("summary", {}).get("train_config") == json_safe(tc):  # as train wrote
            log(f"case: reusing the model already trained in {d}")
        else:
            log(f"case: training the default model ({tc.steps} steps) into {d}")
            corpus = load_corpus()
            tok = CharTokenizer.from_text(corpus.text, 1200)
            res = train(corpus, tok, tc=tc, progress=progress)
            save_checkpoint(d, res.model, tok, res.summary)
        model_path = d
    else:
        log(f"case: using checkpoint {model_path}")
    m = load_model(model_path)
    if m.kind != "genprobe":
        raise ValueError(
            f"{model_path} is a {m.arch} transformers model; the case study needs a genprobe checkpoint "
            "(the character-level Tang GPT the chapter studies)"
        )
    return m


def run_case(
    out: str | Path,
    model: str | Path | None = None,
    *,
    quick: bool = False,
    only: Sequence[str] | None = None,
    skip: Sequence[str] = (),
    progress: bool = False,
    log: Callable[[str], None] = lambda msg: None,
) -> CaseStudy:
    """The chapter's case study into ``out``: train (or reuse) the default model unless ``model`` (a genprobe
    checkpoint) is given, run every experiment (``only`` / ``skip``: unknown names are an error), write ch3_case.json,
    figures and report.html."""
    from .._io import atomic_write_bytes, atomic_write_json
    from ..corpus.tang import load_corpus
    from ..report.figures import render_figures
    from ..report.headline import headline_rows, seed_tables
    from ..report.html import write_report

    if bad := [x for x in [*(only or []), *skip] if x not in EXPERIMENTS]:
        raise ValueError(f"unknown experiment(s) {bad}; choose from {list(EXPERIMENTS)}")
    names = tuple(x for x in (only or EXPERIMENTS) if x not in set(skip))
    t0 = time.perf_counter()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"output path {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    m = study_model(model, out, quick, progress, log)
    t_model = time.perf_counter() - t0
    log("case: running experiments " + ", ".join(names))
    result = run_experiments(m.module, m.tokenizer, load_corpus(), m.meta, quick, progress, names, log)
    result.meta.checkpoint = str(m.source)
    result.meta.model_seconds = round(t_model, 1)
    case, seed = json_safe(result), seed_tables()
    json_path, figs = out / "ch3_case.json", render_figures(case, seed)
    for name, png in figs.items():
        atomic_write_bytes(out / name, png)
    report = write_report(case, out, seed, figs)  # the figures inlined
    result.meta.total_seconds = round(time.perf_counter() - t0, 1)
    atomic_write_json(json_path, json_safe(result))
    rows = [(a, b, c) for a, b, c, _ in headline_rows(case, seed)]
    return CaseStudy(result, out, json_path, report, [out / n for n in figs], time.perf_counter() - t0, rows)
