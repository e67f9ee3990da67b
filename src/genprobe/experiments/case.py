"""The whole case study: every experiment of the seed chapter on one checkpoint → ``ch3_case.json`` data.

Keys follow the seed's ``ch3_case.json`` (§3.1.8): model, decoding, sampling, exposure,
cache_exact, cache_bugs, mask_noop, cache_timing, cache_scaling — plus ``meta`` (versions,
settings, seconds per experiment). ``quick`` shrinks only what costs time (timing reps, the
scaling model's lengths, confidence sample counts); the correctness numbers are the same.
"""

from __future__ import annotations

import os
import platform
import time
from datetime import datetime, timezone
from typing import Callable

import torch
from tqdm import tqdm

from .. import __version__
from ..corpus import CharTokenizer, Corpus
from ..model.gpt import GPT
from ._common import CASE_PROMPT, encode_prompt, r
from .decoding import run_decoding
from .exposure import run_exposure
from .sampling import run_sampling
from .timing import run_cache_scaling, run_cache_timing

CASE_KEYS = ("model", "decoding", "sampling", "exposure", "cache_exact", "cache_bugs", "mask_noop",
             "cache_timing", "cache_scaling")


def model_summary(model: GPT, meta: dict | None, decoding: dict | None = None) -> dict:
    """The ``model`` key: parameters, losses, unigram baseline, coverage (from checkpoint meta)."""
    s = (meta or {}).get("summary", {})
    corpus = s.get("corpus", {})
    out = {
        "params": model.num_parameters(),
        "config": model.cfg.to_dict(),
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
    if decoding and "teacher_forcing" in decoding:
        out["teacher_forcing_loss_on_real_poems"] = decoding["teacher_forcing"]["val_loss"]
    return out


def run_case(model: GPT, tok: CharTokenizer, corpus: Corpus, meta: dict | None = None, quick: bool = False,
             progress: bool = True, only: tuple[str, ...] | None = None,
             log: Callable[[str], None] | None = None) -> dict:
    """Run every experiment (or those named in ``only``) and return the ``ch3_case.json`` dict."""
    from ..verify import cache_exact, mask_noop, run_mutants

    model = model.eval()
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None  # timing context: a busy machine skews wall clock
    prompt_ids, _ = encode_prompt(tok, CASE_PROMPT)
    steps = 50
    short = min(steps, model.cfg.block_size - len(prompt_ids))
    mut_steps = min(short, 24) if quick else short  # the mutant table recomputes every step: cheaper when quick
    stages: list[tuple[str, Callable[[], object]]] = [
        ("decoding", lambda: run_decoding(model, tok, corpus, seed=0, tf_tokens=4096 if quick else None,
                                                spread_seeds=(0, 1, 2) if quick else (0, 1, 2, 3, 4))),
        ("sampling", lambda: run_sampling(model, tok)),
        ("exposure", lambda: run_exposure(model, tok, corpus, quick=quick)),
        ("cache_exact", lambda: cache_exact(model, prompt_ids, steps=short)),
        ("cache_bugs", lambda: run_mutants(model, prompt_ids, steps=mut_steps)),
        ("mask_noop", lambda: mask_noop(model, prompt_ids, steps=mut_steps)),
        ("cache_timing", lambda: run_cache_timing(model, prompt_ids, new_tokens=steps, reps=1 if quick else 3,
                                                        batches=(1, 8) if quick else (1, 16, 64))),
        ("cache_scaling", lambda: run_cache_scaling(prompt_ids, tok.vocab_size,
                                                    new_tokens=(16, 32) if quick else (32, 64, 128), reps=1,
                                                    small=quick)),
    ]
    if only is not None:
        unknown = set(only) - {n for n, _ in stages}
        if unknown:
            raise ValueError(f"unknown experiment(s) {sorted(unknown)}; choose from {[n for n, _ in stages]}")
        stages = [s for s in stages if s[0] in only]
    out: dict = {}
    seconds: dict[str, float] = {}
    bar = tqdm(stages, desc="case", unit="exp", disable=not progress, dynamic_ncols=True)
    for name, fn in bar:
        bar.set_postfix_str(name)
        t0 = time.perf_counter()
        with torch.inference_mode(False), torch.no_grad():
            out[name] = fn()
        seconds[name] = r(time.perf_counter() - t0, 2)
        if log:
            log(f"  {name}: {seconds[name]:.1f}s")
    out["model"] = model_summary(model, meta, out.get("decoding"))
    out["meta"] = {
        "genprobe": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in load] if load else None,
        "device": "cpu",
        "quick": quick,
        "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "prompt": CASE_PROMPT,
        "steps": {"decode": steps, "cache_exact": short, "mutants": mut_steps},
        "seconds": seconds,
    }
    order = ["meta", *CASE_KEYS]
    return {k: out[k] for k in order if k in out}
