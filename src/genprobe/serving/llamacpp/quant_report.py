"""The quantization study's (:mod:`.quant_study`) report and files: its findings, its markdown, both written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ..._io import json_safe
from ..._templates import pct
from .quant_study import Divergence, Log, QuantStudy, QuantStudyConfig, TypeRow, intervals_overlap, run_quant_study


# ---- what the numbers show -------------------------------------------------------------------------------------
def _rate_ci(rate: float, ci: Sequence[float]) -> str:
    return f"{pct(rate)} [{100 * ci[0]:.1f}–{100 * ci[1]:.1f}]"


def _median(div: Divergence, budget: int) -> str:
    return f"> {budget}" if div.median_step is None else f"{div.median_step:g}"


SIGNIFICANCE = 0.05  # two-sided, on the paired sign test


def loop_change(row: TypeRow, ref: TypeRow) -> int:
    """+1 / -1 when the type degenerates more / less often than F32 — the paired sign test on the same prompts
    below :data:`SIGNIFICANCE`, or the unpaired 95% intervals apart — else 0 (the data does not show a change)."""
    a, b = row.loops, ref.loops
    apart = not intervals_overlap(a.degenerate_rate_ci95, b.degenerate_rate_ci95)
    if row.sign_test_p >= SIGNIFICANCE and not apart:
        return 0
    return 1 if a.degenerate_rate > b.degenerate_rate else -1


def study_findings(study: QuantStudy) -> list[str]:
    """Sentences that say what the table shows: the engine, each type, and whether low bits loop more."""
    ec, ref = study.engine_check, study.rows[0]
    budget = study.config.max_new_tokens
    out = [
        f"Engine: the F32 GGUF in llama.cpp against transformers float32 on the same weights: KL mean "
        f"{ec.kl_mean:.2g} nats (max {ec.kl_max:.2g}), top-1 agreement {pct(ec.top1_agreement)}, perplexity "
        f"{ec.perplexity:.3f} vs {ec.reference_perplexity:.3f} — "
        + (
            "float noise: the engine computes the model."
            if ec.kl_max < 1e-3 and ec.top1_agreement > 0.99
            else "more than float noise: look at the engine before reading the types."
        )
    ]
    for row in study.rows[1:]:
        lg, div, a, b = row.logits, row.divergence, row.loops, ref.loops
        kind = "keeps every greedy text" if div.diverged == 0 else "changes greedy text"
        paired = (
            f"paired on the same prompts: {row.became_degenerate} became degenerate, {row.stopped_degenerate} "
            f"stopped, sign test p = {row.sign_test_p:.2g}"
        )
        apart = not intervals_overlap(a.degenerate_rate_ci95, b.degenerate_rate_ci95)
        intervals = f"the unpaired 95% intervals {'are apart' if apart else 'overlap'}"
        verdict = (
            f"{intervals} and the paired test is not significant: the data does not show a change in looping ({paired})"
            if (change := loop_change(row, ref)) == 0
            else f"this type degenerates {'more' if change > 0 else 'less'} often than F32 "
            f"({100 * (a.degenerate_rate - b.degenerate_rate):+.1f} points; {intervals}; {paired})"
        )
        out.append(
            f"{row.type} ({row.file.bits_per_weight:.2f} bits/weight, {row.file.size_bytes / 2**20:.1f} MiB) {kind}: "
            f"KL mean {lg.kl_mean:.3g} nats (p99 {lg.kl_p99:.3g}), top-1 {pct(lg.top1_agreement)}, perplexity "
            f"{lg.perplexity:.3f} vs F32 {lg.reference_perplexity:.3f}; {div.diverged}/{div.prompts} greedy "
            f"continuations leave F32's (median step {_median(div, budget)}); degenerate "
            f"{_rate_ci(row.loops.degenerate_rate, row.loops.degenerate_rate_ci95)} vs F32 "
            f"{_rate_ci(ref.loops.degenerate_rate, ref.loops.degenerate_rate_ci95)}: {verdict}."
        )
    for f in [row.file for row in study.rows[1:] if row.file.shape_fallbacks]:
        # what a K-quant recipe became where the rows are not a multiple of 256 (llama.cpp's shape fallback)
        quantized = {k: v for k, v in f.type_counts.items() if k not in ("F32", "F16", "BF16")}
        out.append(
            f"{f.type} is mostly {max(quantized, key=quantized.__getitem__) if quantized else f.main_type}, not "
            f"{f.main_type}: {len(f.shape_fallbacks)} 2-D tensors have rows that are not a multiple of {f.main_type}'s"
            f" 256-value block, and llama.cpp's tensor_type_fallback (src/llama-quant.cpp) wrote them in another "
            f"type ({', '.join(f'{k} ×{v}' for k, v in quantized.items())})."
        )
    if len(study.rows) > 1:
        low = min(study.rows[1:], key=lambda r: r.file.bits_per_weight)
        change = loop_change(low, ref)
        delta = 100 * (low.loops.degenerate_rate - ref.loops.degenerate_rate)
        answer = {
            1: f"yes at {low.type}, the lowest-bit type here: {delta:+.1f} points of degenerate generations",
            0: f"not shown at {low.type}, the lowest-bit type here ({delta:+.1f} points, not significant)",
            -1: f"no: at {low.type}, the lowest-bit type here, it degenerates less ({delta:+.1f} points)",
        }[change]
        n = ref.loops.n
        out.append(f"Does low-bit quantization make the model loop more? {answer} ({n} prompts).")
    return out


def study_markdown(study: QuantStudy) -> str:
    """The results table, the file recipes, sample texts and findings as markdown."""
    budget = study.config.max_new_tokens
    ec = study.engine_check
    lines = [
        f"### {study.model}",
        "",
        study.model_note + ".",
        f"Text: {study.text_source}, {ec.positions} positions. Prompts: {study.prompt_source}, "
        f"{study.config.prompts} × {budget} greedy tokens (end token banned). Threads: {study.config.threads}.",
        "",
        "| type | MiB | bits/weight | KL mean | KL p99 | top-1 | perplexity | greedy diverged | median step | "
        "exact loop [95% CI] | degenerate [95% CI] | +/− vs F32 (p) | tok/s (per CPU-s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| transformers fp32 → llama.cpp F32 | | | {ec.kl_mean:.2g} | {ec.kl_p99:.2g} | "
        f"{pct(ec.top1_agreement)} | {ec.perplexity:.3f} (tf {ec.reference_perplexity:.3f}) | | | | | | |",
    ]
    for row in study.rows:
        lg, lo, div = row.logits, row.loops, row.divergence
        paired = f"+{row.became_degenerate}/−{row.stopped_degenerate} ({row.sign_test_p:.2g})"
        paired = "—" if row.type == "F32" else paired
        lines.append(
            f"| {row.type} | {row.file.size_bytes / 2**20:.1f} | {row.file.bits_per_weight:.2f} | {lg.kl_mean:.3g} | "
            f"{lg.kl_p99:.3g} | {pct(lg.top1_agreement)} | {lg.perplexity:.3f} | {div.diverged}/{div.prompts} | "
            f"{_median(div, budget)} | {_rate_ci(lo.loop_rate, lo.loop_rate_ci95)} | "
            f"{_rate_ci(lo.degenerate_rate, lo.degenerate_rate_ci95)} | {paired} | "
            f"{row.decode_tokens_per_s:.1f} ({row.decode_tokens_per_cpu_s:.1f}) |"
        )
    fpr = study.rows[0].loops.human_fpr or {}
    fprs = ", ".join(f"{k} {_rate_ci(v['rate'], v['ci95'])}" for k, v in fpr.items() if k in ("exact", "degenerate"))
    src = study.calibration.get("source", "human text")
    human = f"Detectors calibrated on {src}; held-out human false-positive rate: {fprs or 'n/a'}."
    lines += ["", human, "", "What llama.cpp wrote (2-D tensors not at the recipe's main type):", ""]
    for row in study.rows:
        lines.append(f"- {row.file.describe()}")
    lines += ["", "Findings:", ""] + [f"- {f}" for f in study.findings]
    if study.samples:
        lines += ["", "Sample texts (greedy; the type's continuation leaves F32's at the step shown):", ""]
        for s in study.samples:
            lines += [
                f"- **{s.type}**, prompt `{s.prompt}`, diverges at step {s.step} "
                f"(degenerate: F32 {s.f32_degenerate}, {s.type} {s.degenerate})",
                f"  - F32: `{_one_line(s.f32_text)}`",
                f"  - {s.type}: `{_one_line(s.text)}`",
            ]
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    return text.replace("\n", "⏎").replace("`", "'")


def quant_compare(
    model_ref: str, out_dir: str | os.PathLike[str], cfg: QuantStudyConfig, *, log: Log | None = None
) -> tuple[QuantStudy, Path, Path]:
    """``genprobe quant-compare`` as a library call: run the study, state its findings, write ``quant-<model>.json``
    (everything) and ``quant-<model>.md`` (the table) into ``out_dir``, atomically; returns the study and the paths."""
    from ..._io import atomic_write_json, atomic_write_text

    study, stem = run_quant_study(model_ref, out_dir, cfg, log=log)
    study.findings = study_findings(study)
    js, md = Path(out_dir) / f"quant-{stem}.json", Path(out_dir) / f"quant-{stem}.md"
    atomic_write_json(js, json_safe(study))
    atomic_write_text(md, study_markdown(study))
    return study, js, md
