"""The whole case study: every experiment of the chapter on one checkpoint → ``ch3_case.json`` data.

The chapter is 《训练与推理的两副面孔》 ("The two faces of training and inference"). Keys follow its
own ``ch3_case.json``: model, decoding, sampling, exposure, cache_exact, cache_bugs, mask_noop,
cache_timing, cache_scaling — plus ``meta`` (versions, settings, seconds per experiment). ``quick``
shrinks only what costs time (timing reps, the scaling model's lengths, confidence sample counts);
the correctness numbers are the same.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import torch
from tqdm import tqdm

from .._io import json_safe
from .._version import __version__
from ..corpus import CharTokenizer, Corpus
from ..model.gpt import GPT
from ._common import CASE_PROMPT, encode_prompt, r
from .decoding import DecodingResult, run_decoding
from .exposure import run_exposure
from .sampling import run_sampling
from .timing import run_cache_scaling, run_cache_timing

CASE_KEYS = (
    "model",
    "decoding",
    "sampling",
    "exposure",
    "cache_exact",
    "cache_bugs",
    "mask_noop",
    "cache_timing",
    "cache_scaling",
)
#: Tokens generated after the case prompt (the chapter's 50).
DECODE_STEPS = 50


@dataclass(frozen=True)
class ModelSummary:
    """The ``model`` key: parameters and config, then what the checkpoint's training summary recorded."""

    params: int
    config: dict
    train_loss: float | None = None
    val_loss: float | None = None
    unigram_ce: float | None = None
    coverage_1200: float | None = None
    unk_share: float | None = None
    corpus_poems: int | None = None
    corpus_chars: int | None = None
    train_steps: int | None = None
    train_seconds: float | None = None
    teacher_forcing_loss_on_real_poems: float | None = None  # from the decoding experiment, when it ran

    def to_dict(self) -> dict:
        """JSON form (the teacher-forcing loss only when measured)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if self.teacher_forcing_loss_on_real_poems is None:
            del d["teacher_forcing_loss_on_real_poems"]
        return d


def model_summary(model: GPT, meta: dict | None, decoding: DecodingResult | None = None) -> ModelSummary:
    """Parameters, losses, unigram baseline, coverage (from checkpoint meta)."""
    s = (meta or {}).get("summary", {})
    corpus = s.get("corpus", {})
    tf = decoding.teacher_forcing if decoding is not None else None
    return ModelSummary(
        params=model.num_parameters(),
        config=json_safe(model.cfg),
        train_loss=s.get("train_loss"),
        val_loss=s.get("val_loss"),
        unigram_ce=s.get("unigram_ce"),
        coverage_1200=s.get("coverage"),
        unk_share=s.get("unk_share"),
        corpus_poems=corpus.get("documents"),
        corpus_chars=corpus.get("chars"),
        train_steps=s.get("train_config", {}).get("steps"),
        train_seconds=s.get("seconds"),
        teacher_forcing_loss_on_real_poems=None if tf is None else r(tf.val_loss),
    )


@dataclass
class CaseMeta:
    """The ``meta`` key: versions and machine, settings, seconds per experiment (the CLI adds its totals)."""

    quick: bool
    steps: dict[str, int]
    seconds: dict[str, float]
    load_average: list[float] | None
    created_utc: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    checkpoint: str | None = None
    model_seconds: float | None = None
    total_seconds: float | None = None

    def to_dict(self) -> dict:
        """JSON form: environment first, then settings and timings; CLI totals only once set."""
        d = {
            "genprobe": __version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "load_average": self.load_average,
            "device": "cpu",
            "quick": self.quick,
            "created_utc": self.created_utc,
            "prompt": CASE_PROMPT,
            "steps": self.steps,
            "seconds": self.seconds,
        }
        extra = {
            "checkpoint": self.checkpoint,
            "model_seconds": self.model_seconds,
            "total_seconds": self.total_seconds,
        }
        return d | {k: v for k, v in extra.items() if v is not None}


def as_json(x: Any) -> Any:
    """A result's JSON form: ``to_dict()`` when it has one (also inside lists), else the value itself."""
    if hasattr(x, "to_dict"):
        return json_safe(x)
    if isinstance(x, list):
        return [as_json(v) for v in x]
    return x


@dataclass
class CaseResult:
    """Every experiment's typed result (verify's still plain data) with the model summary and run metadata."""

    meta: CaseMeta
    model: ModelSummary
    experiments: dict[str, Any]

    def to_dict(self) -> dict:
        """The ``ch3_case.json`` dict: meta, model, then the experiments in :data:`CASE_KEYS` order."""
        out = {"meta": json_safe(self.meta), "model": json_safe(self.model)}
        return out | {k: as_json(self.experiments[k]) for k in CASE_KEYS if k in self.experiments}


def case_stages(
    model: GPT, tok: CharTokenizer, corpus: Corpus, prompt_ids: list[int], quick: bool, steps: dict[str, int]
) -> list[tuple[str, Callable[[], object]]]:
    """(name, run) of every experiment, in order; ``quick`` shrinks only what costs time."""
    from ..verify.mutants import cache_exact, mask_noop, run_mutants

    return [
        (
            "decoding",
            lambda: run_decoding(
                model,
                tok,
                corpus,
                seed=0,
                tf_tokens=4096 if quick else None,
                spread_seeds=(0, 1, 2) if quick else (0, 1, 2, 3, 4),
            ),
        ),
        ("sampling", lambda: run_sampling(model, tok)),
        ("exposure", lambda: run_exposure(model, tok, corpus, quick=quick)),
        ("cache_exact", lambda: cache_exact(model, prompt_ids, steps=steps["cache_exact"])),
        ("cache_bugs", lambda: run_mutants(model, prompt_ids, steps=steps["mutants"])),
        ("mask_noop", lambda: mask_noop(model, prompt_ids, steps=steps["mutants"])),
        (
            "cache_timing",
            lambda: run_cache_timing(
                model,
                prompt_ids,
                new_tokens=steps["decode"],
                reps=1 if quick else 3,
                batches=(1, 8) if quick else (1, 16, 64),
            ),
        ),
        (
            "cache_scaling",
            lambda: run_cache_scaling(
                prompt_ids, tok.vocab_size, new_tokens=(16, 32) if quick else (32, 64, 128), reps=1, small=quick
            ),
        ),
    ]


def _select(stages: list, only: tuple[str, ...] | None) -> list:
    if only is None:
        return stages
    unknown = set(only) - {n for n, _ in stages}
    if unknown:
        raise ValueError(f"unknown experiment(s) {sorted(unknown)}; choose from {[n for n, _ in stages]}")
    return [s for s in stages if s[0] in only]


def run_case(
    model: GPT,
    tok: CharTokenizer,
    corpus: Corpus,
    meta: dict | None = None,
    quick: bool = False,
    progress: bool = True,
    only: tuple[str, ...] | None = None,
    log: Callable[[str], None] | None = None,
) -> CaseResult:
    """Run every experiment (or those named in ``only``) on ``model``."""
    model = model.eval()
    # timing context: a busy machine skews wall clock
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    prompt_ids, _ = encode_prompt(tok, CASE_PROMPT)
    short = min(DECODE_STEPS, model.cfg.block_size - len(prompt_ids))
    # the mutant table recomputes every step: cheaper when quick
    steps = {"decode": DECODE_STEPS, "cache_exact": short, "mutants": min(short, 24) if quick else short}
    stages = _select(case_stages(model, tok, corpus, prompt_ids, quick, steps), only)
    results: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    bar = tqdm(stages, desc="case", unit="exp", disable=not progress, dynamic_ncols=True)
    for name, run in bar:
        bar.set_postfix_str(name)
        t0 = time.perf_counter()
        with torch.inference_mode(False), torch.no_grad():
            results[name] = run()
        seconds[name] = round(time.perf_counter() - t0, 2)  # finite: r() would only round it
        if log:
            log(f"  {name}: {seconds[name]:.1f}s")
    summary = model_summary(model, meta, results.get("decoding"))
    case_meta = CaseMeta(
        quick=quick, steps=steps, seconds=seconds, load_average=[round(x, 2) for x in load] if load else None
    )
    return CaseResult(case_meta, summary, results)
