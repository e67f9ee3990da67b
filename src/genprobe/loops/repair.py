"""The whole repair pipeline (seed 001): scan → contrast → direction → locate → search → validate → patch.

Prompt sets are disjoint openings of held-out poems (see :mod:`.prompts`):

* ``direction`` set: scanned; its loops vs its non-loop positions give the direction per layer;
  its loop-prone prompts (+ as many non-looping controls) are the locate set;
* ``search`` set: scanned; up to ``search_prone`` loop-prone + ``search_control`` non-looping
  prompts form the set on which every candidate edit is evaluated (controls catch edits that
  create new loops);
* ``validate`` set: never seen by the search — loop rate before/after on all of it and on its
  loop-prone subset, short/long periods, distinct-2, longest repeat, sample texts.

Regression (KL and Δloss) is measured on windows of the corpus validation text.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from ..engine.sampling import SamplerConfig
from ..metrics import wilson_interval
from .arch import count_parameters, mlp_sites
from .contrast import collect_contrast
from .direction import loop_direction, separation
from .edit import FORMS, EditSpec, make_patch
from .locate import locate_layers
from .patch import Patch, apply_patch, finalise, revert_patch
from .prompts import prompt_sets
from .regress import RegressionProbe, text_windows
from .scan import chanting_sampler, greedy_sampler, scan_loops
from .search import Limits, choose, grid, run_search

UNK_SHOW = "▯"


@dataclass
class RepairConfig:
    """Sizes, grids and limits of a repair run (defaults = the CLI's, budgeted for ≤ 10 CPU minutes)."""

    n_direction: int = 768
    n_search: int = 1024
    n_validate: int = 1024
    prefix_chars: int = 5
    max_new_tokens: int = 57
    search_prone: int = 48
    search_control: int = 96
    scan_inadmissible: bool = False  # also generate for candidates already over the regression limits
    ks: tuple[int, ...] = (8, 32)
    subtract_alphas: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)  # relative to the loop gap (see make_patch)
    project_alphas: tuple[float, ...] = (0.25, 0.5, 1.0, 1.5, 2.0)  # fraction of the projection removed
    forms: tuple[str, ...] = FORMS
    layer_sets: tuple[tuple[int, ...], ...] | None = None  # None: each layer alone and all together
    method: str = "mean_diff"
    max_kl: float = 0.1
    max_dloss: float = 0.02
    regression_windows: int = 96
    batch_size: int = 128
    seed: int = 0
    samples: int = 6
    min_tail: int = 8  # loop detector: minimal periodic tail in tokens (see genprobe.metrics.detect_loop)
    plain_greedy_check: int = 256  # validate prompts also scanned under plain greedy before/after (0 = skip)

    def to_dict(self) -> dict:
        """Plain dict."""
        return asdict(self)


def _decode(tokenizer):
    def dec(ids):
        try:
            return tokenizer.decode(ids, show_unk=True, unk_text=UNK_SHOW)
        except TypeError:  # tokenizers without the show_unk/unk_text options
            return tokenizer.decode(ids)

    return dec


def _unk_id(tokenizer) -> int:
    u = getattr(tokenizer, "unk_id", None)
    return int(u) if u is not None else 1  # genprobe.corpus.UNK_ID


def _rate_block(summary: dict) -> dict:
    keys = ("n", "loops", "loop_rate", "loop_rate_ci95", "short_loop_rate", "long_loop_rate", "length_capped_rate",
            "mean_distinct_2", "mean_seq_rep_4", "mean_longest_repeat", "period_hist", "onset_hist")
    return {k: summary[k] for k in keys}


def _subset_summary(records: list[dict]) -> dict:
    n = len(records)
    k = sum(1 for r in records if r["looping"])
    return {"n": n, "loops": k, "loop_rate": k / n if n else 0.0, "loop_rate_ci95": list(wilson_interval(k, n)),
            "mean_distinct_2": sum(r["distinct_2"] for r in records) / n if n else 0.0,
            "mean_longest_repeat": sum(r["longest_repeat"] for r in records) / n if n else 0.0}


def repair(
    model: Any,
    tokenizer,
    val_text: str,
    cfg: RepairConfig | None = None,
    *,
    sampler: SamplerConfig | None = None,
    progress: bool = False,
    log=lambda msg: None,
) -> tuple[dict, Patch | None]:
    """Run the pipeline; returns (report dict, finalised patch or None when no edit passed the limits)."""
    cfg = cfg or RepairConfig()
    t_start = time.perf_counter()
    unk = _unk_id(tokenizer)
    sampler = sampler or chanting_sampler(unk)
    decode = _decode(tokenizer)
    n_layers = len(mlp_sites(model))
    if cfg.max_new_tokens < 16:
        raise ValueError(f"max_new_tokens must be >= 16 to see loops, got {cfg.max_new_tokens}")
    timings: dict[str, float] = {}

    def tick(name: str, t0: float) -> None:
        timings[name] = round(time.perf_counter() - t0, 2)

    def scan(prompts_ids, texts=None, desc="scan"):
        return scan_loops(model, prompts_ids, cfg.max_new_tokens, sampler, batch_size=cfg.batch_size, seed=cfg.seed,
                          unk_id=unk, min_tail=cfg.min_tail, decode=decode, prompt_texts=texts, progress=progress, desc=desc)

    # 1. prompt sets and baseline scans --------------------------------------------------------
    t0 = time.perf_counter()
    sets = prompt_sets(tokenizer, {"direction": cfg.n_direction, "search": cfg.n_search, "validate": cfg.n_validate},
                       cfg.prefix_chars)
    enc = {k: [tokenizer.encode(p) for p in v] for k, v in sets.items()}
    base = {k: scan(enc[k], sets[k], desc=f"scan {k}") for k in sets}
    tick("baseline_scans", t0)
    log(f"baseline loop rates: " + ", ".join(f"{k} {base[k].summary['loop_rate']:.3f}" for k in base))

    # 2–3. contrast, directions, locate --------------------------------------------------------
    stage = _direction_stage(model, tokenizer, val_text, cfg, sampler, base["direction"].records, unk, progress, log, tick)
    directions, gaps, con, windows = stage["directions"], stage["gaps"], stage["contrast"], stage["windows"]
    sep, located = stage["separation"], stage["locate"]

    # 4. search ----------------------------------------------------------------------------------
    t0 = time.perf_counter()
    s_recs = base["search"].records
    prone = [r for r in s_recs if r["looping"]][: cfg.search_prone]
    control = [r for r in s_recs if not r["looping"]][: cfg.search_control]
    search_prompts = [r["prompt_ids"] for r in prone + control]
    # Stratified estimate of the loop rate on the whole search set: loop-prone and control prompts
    # are weighted by how many of each the full set holds, so a new loop among the controls counts
    # as much as it would in the natural mix.
    n_prone_all = sum(1 for r in s_recs if r["looping"])
    w_prone = n_prone_all / len(prone) if prone else 0.0
    w_control = (len(s_recs) - n_prone_all) / len(control) if control else 0.0
    base_search_rate = n_prone_all / len(s_recs)
    probe = RegressionProbe(model, windows, batch_size=cfg.batch_size)
    limits = Limits(cfg.max_kl, cfg.max_dloss)

    def evaluate(m):
        r = probe.measure(m)
        if not cfg.scan_inadmissible and not limits.admits(r):
            r.update(loop_rate=None, prone_loops=None, control_loops=None)
            return r
        recs = scan_loops(m, search_prompts, cfg.max_new_tokens, sampler, batch_size=cfg.batch_size,
                          seed=cfg.seed, unk_id=unk, min_tail=cfg.min_tail).records
        lp = sum(1 for x in recs[: len(prone)] if x["looping"])
        lc = sum(1 for x in recs[len(prone) :] if x["looping"])
        r.update(loop_rate=(lp * w_prone + lc * w_control) / len(s_recs), prone_loops=lp, control_loops=lc)
        return r

    layer_sets = cfg.layer_sets or tuple((l,) for l in range(n_layers)) + ((tuple(range(n_layers)),) if n_layers > 1 else ())
    alphas = {"subtract": cfg.subtract_alphas, "project": cfg.project_alphas}
    specs = grid(layer_sets, cfg.ks, cfg.forms, alphas)
    unit_means = {l: con.unit_mean_loop[l] for l in range(n_layers)}
    results = run_search(model, specs, directions, unit_means, evaluate, gaps=gaps, progress=progress) if prone else []
    best = choose(results, base_search_rate, limits)
    tick("search", t0)

    report: dict = {
        "config": cfg.to_dict(),
        "sampler": sampler.to_dict(),
        "model": {"parameters": count_parameters(model), "layers": n_layers},
        "prompt_sets": {k: {"n": len(v), "first": v[:3]} for k, v in sets.items()},
        "baseline": {k: _rate_block(v.summary) for k, v in base.items()},
        "contrast": con.summary(),
        "directions": {str(l): {"gap": gaps[l], **sep[l]} for l in range(n_layers)},
        "locate": located,
        "search": {"n_prompts": len(search_prompts), "prone": len(prone), "control": len(control),
                   "prone_in_full_set": n_prone_all, "full_set": len(s_recs), "weights": [w_prone, w_control],
                   "base_loop_rate": base_search_rate, "limits": asdict(limits), "candidates": results,
                   "admissible": sum(1 for r in results if limits.admits(r)),
                   "chosen": best},
    }
    if not prone:
        report["verdict"] = "no loop-prone prompt in the search set: nothing to repair"
    elif best is None:
        report["verdict"] = "no edit passed the limits (or none reduced the loop rate within them)"
    patch = None
    if best is not None:
        # 5. validate on the held-out set --------------------------------------------------------
        t0 = time.perf_counter()
        spec = EditSpec(tuple(best["layers"]), best["k"], best["form"], best["alpha"])
        patch = finalise(model, make_patch(model, spec, directions, unit_means, gaps))
        patch.meta.update(edit=spec.to_dict(), sampler=sampler.to_dict(), search_loop_rate=best["loop_rate"],
                          kl=best["kl"], dloss=best["dloss"])
        before = base["validate"]
        greedy_ids = enc["validate"][: cfg.plain_greedy_check]
        plain = {}
        if greedy_ids:
            plain["before"] = scan_loops(model, greedy_ids, cfg.max_new_tokens, greedy_sampler(), batch_size=cfg.batch_size,
                                         unk_id=unk, min_tail=cfg.min_tail).summary
        apply_patch(model, patch)
        try:
            after = scan(enc["validate"], sets["validate"], desc="validate")
            regression = probe.measure(model)
            if greedy_ids:
                plain["after"] = scan_loops(model, greedy_ids, cfg.max_new_tokens, greedy_sampler(),
                                            batch_size=cfg.batch_size, unk_id=unk, min_tail=cfg.min_tail).summary
        finally:
            revert_patch(model, patch)
        prone_idx = [i for i, r in enumerate(before.records) if r["looping"]]
        samples = [
            {"prompt": before.records[i]["prompt"], "before": before.records[i]["text"], "after": after.records[i]["text"],
             "before_period": before.records[i]["period"], "after_period": after.records[i]["period"]}
            for i in prone_idx[: cfg.samples]
        ]
        report["validation"] = {
            "before": _rate_block(before.summary),
            "after": _rate_block(after.summary),
            "loop_prone_before": _subset_summary([before.records[i] for i in prone_idx]),
            "loop_prone_after": _subset_summary([after.records[i] for i in prone_idx]),
            "new_loops": sum(1 for b, a in zip(before.records, after.records) if a["looping"] and not b["looping"]),
            "regression": regression,
            "samples": samples,
        }
        if plain:
            report["validation"]["plain_greedy"] = {k: _rate_block(v) for k, v in plain.items()}
        report["patch"] = {k: patch.meta[k] for k in ("edit", "weights_changed", "total_parameters", "fraction_changed",
                                                     "sha256_before", "sha256_after")}
        report["verdict"] = "edit passed the limits"
        tick("validate", t0)
    timings["total"] = round(time.perf_counter() - t_start, 2)
    report["timings_s"] = timings
    return report, patch


def _direction_stage(model, tokenizer, val_text, cfg, sampler, d_recs, unk, progress, log, tick) -> dict:
    """Contrast the direction-set records, estimate a direction per layer, ablate each to locate."""
    n_layers = len(mlp_sites(model))
    t0 = time.perf_counter()
    val_ids = tokenizer.encode(val_text, warn=False)
    block = getattr(getattr(model, "cfg", None), "block_size", None) or getattr(model, "max_positions", None) or 64
    windows = text_windows(val_ids, block, cfg.regression_windows)
    con = collect_contrast(model, d_recs, batch_size=cfg.batch_size, reference_text_windows=windows[:32])
    directions, gaps, sep = {}, {}, {}
    for l in range(n_layers):
        d = loop_direction(con.loop[l], con.reference[l], cfg.method, cfg.seed)
        directions[l] = d
        gaps[l] = float((con.loop[l].mean(0) - con.reference[l].mean(0)) @ d)
        sep[l] = separation(con.loop[l], con.reference[l], d)
        # how the residual stream after the block separates (reported only)
        rd = con.resid_mean_loop[l] - con.resid_mean_reference[l]
        sep[l]["resid_mean_gap_norm"] = float(rd.norm())
        sep[l]["cos_resid_vs_mlp_direction"] = float(rd @ d / rd.norm()) if float(rd.norm()) > 0 else 0.0
    tick("contrast_direction", t0)
    t0 = time.perf_counter()
    loc_prompts = [r["prompt_ids"] for r in d_recs if r["looping"]][: cfg.search_prone] + \
                  [r["prompt_ids"] for r in d_recs if not r["looping"]][: cfg.search_control]

    def rate(m):
        return scan_loops(m, loc_prompts, cfg.max_new_tokens, sampler, batch_size=cfg.batch_size, seed=cfg.seed,
                          unk_id=unk, min_tail=cfg.min_tail).summary["loop_rate"]

    located = locate_layers(model, directions, rate)
    located["n_prompts"] = len(loc_prompts)
    tick("locate", t0)
    log("locate (loop rate on loop-prone + control prompts): base "
        f"{located['base_loop_rate']:.3f}, " + ", ".join(f"L{r['layer']} ablated {r['loop_rate']:.3f}" for r in located["per_layer"]))
    return {"directions": directions, "gaps": gaps, "contrast": con, "windows": windows, "separation": sep, "locate": located}


def locate_only(model: Any, tokenizer, val_text: str, cfg: RepairConfig | None = None, *, sampler: SamplerConfig | None = None,
                progress: bool = False, log=lambda msg: None) -> dict:
    """Scan the direction set, estimate directions and rank layers by ablation (no edit)."""
    cfg = cfg or RepairConfig()
    unk = _unk_id(tokenizer)
    sampler = sampler or chanting_sampler(unk)
    timings: dict[str, float] = {}

    def tick(name: str, t0: float) -> None:
        timings[name] = round(time.perf_counter() - t0, 2)

    t0 = time.perf_counter()
    texts = prompt_sets(tokenizer, {"direction": cfg.n_direction}, cfg.prefix_chars)["direction"]
    base = scan_loops(model, [tokenizer.encode(p) for p in texts], cfg.max_new_tokens, sampler, batch_size=cfg.batch_size,
                      seed=cfg.seed, unk_id=unk, min_tail=cfg.min_tail, progress=progress, desc="scan")
    tick("scan", t0)
    log(f"direction set: loop rate {base.summary['loop_rate']:.3f} over {len(texts)} prompts")
    st = _direction_stage(model, tokenizer, val_text, cfg, sampler, base.records, unk, progress, log, tick)
    return {
        "sampler": sampler.to_dict(),
        "scan": _rate_block(base.summary),
        "contrast": st["contrast"].summary(),
        "directions": {str(l): {"gap": st["gaps"][l], **st["separation"][l], "vector": st["directions"][l].tolist()}
                       for l in st["directions"]},
        "locate": st["locate"],
        "timings_s": timings,
    }
