"""The whole case study as one library call: train (or reuse) the model, run every experiment, write the files.

``genprobe case`` and ``genprobe.run_case`` both call :func:`case_study`; the CLI only prints its result.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from .._io import json_safe
from .case import CaseResult, run_case, select_experiments


@dataclass
class CaseStudy:
    """What :func:`case_study` wrote, the typed result, and the headline rows (ours beside the chapter's)."""

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
    """The model to study (the one loader's Model): ``model_path``, else the default trained (or reused) in
    OUT/model."""
    from ..corpus import CharTokenizer, load_corpus
    from ..model.checkpoint import is_checkpoint, read_meta, save_checkpoint
    from ..model.load import load_model
    from ..model.train import TrainConfig, quick_train_config, train

    if model_path is None:
        d = out / "model"
        tc = quick_train_config() if quick else TrainConfig()
        wanted = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(tc).items()}
        if is_checkpoint(d) and read_meta(d).get("summary", {}).get("train_config") == wanted:
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


def case_study(
    out: str | Path,
    model: str | Path | None = None,
    quick: bool = False,
    only: tuple[str, ...] | None = None,
    progress: bool = False,
    log: Callable[[str], None] = lambda msg: None,
) -> CaseStudy:
    """Run the chapter's case study into ``out``: ch3_case.json, figures and one offline report.html."""
    from .._io import atomic_write_json
    from ..corpus import load_corpus
    from ..report import write_figures, write_report
    from ..report.html import headline_rows
    from ..report.seed import seed_tables

    t0 = time.perf_counter()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"output path {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    m = study_model(model, out, quick, progress, log)
    t_model = time.perf_counter() - t0
    names = select_experiments(only)
    log("case: running experiments " + ", ".join(names))
    result = run_case(m.module, m.tokenizer, load_corpus(), m.meta, quick=quick, progress=progress, only=names, log=log)
    result.meta.checkpoint = str(m.source)
    result.meta.model_seconds = round(t_model, 1)
    case, seed = json_safe(result), seed_tables()
    json_path = out / "ch3_case.json"
    figs = write_figures(case, out, seed)
    report = write_report(case, out, seed, figs)
    result.meta.total_seconds = round(time.perf_counter() - t0, 1)
    atomic_write_json(json_path, json_safe(result))
    rows = [(a, b, c) for a, b, c, _ in headline_rows(case, seed)]
    return CaseStudy(result, out, json_path, Path(report), [out / n for n in figs], time.perf_counter() - t0, rows)
