"""Loop scan: generate after every prompt (batched), detect loops, aggregate rates and histograms."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from tqdm import tqdm

from ..engine.generate import generate
from ..engine.sampling import SamplerConfig
from ..metrics import DEFAULT_MIN_TAIL, degeneracy_metrics, wilson_interval

SHORT_PERIOD_MAX = 4  # "chanting": units of 1–4 tokens; longer periods are couplet-like cycles
ONSET_BIN = 8


def chanting_sampler(unk_id: int = 1) -> SamplerConfig:
    """The seed's "chanting" setting: greedy with ``<unk>`` banned."""
    return SamplerConfig(greedy=True, ban_ids=(unk_id,))


def greedy_sampler() -> SamplerConfig:
    """Plain greedy (argmax)."""
    return SamplerConfig(greedy=True)


@dataclass
class ScanResult:
    """Per-generation records and the aggregate summary of one scan."""

    records: list[dict]
    summary: dict
    settings: dict = field(default_factory=dict)

    def to_dict(self, with_records: bool = True) -> dict:
        """Plain JSON."""
        d = {"settings": self.settings, "summary": self.summary}
        if with_records:
            d["records"] = self.records
        return d


def summarise(records: Sequence[dict], short_period_max: int = SHORT_PERIOD_MAX) -> dict:
    """Loop rate (+ Wilson 95% CI), length-capped rate, short/long-period rates, histograms, mean metrics."""
    n = len(records)
    loops = [r for r in records if r["looping"]]
    short = sum(1 for r in loops if r["period"] <= short_period_max)
    capped = sum(1 for r in records if r["hit_limit"])
    onset_hist: Counter = Counter()
    for r in loops:
        lo = (r["onset"] // ONSET_BIN) * ONSET_BIN
        onset_hist[f"{lo}-{lo + ONSET_BIN - 1}"] += 1

    def mean(key: str) -> float:
        return sum(r[key] for r in records) / n if n else 0.0

    return {
        "n": n,
        "loops": len(loops),
        "loop_rate": len(loops) / n if n else 0.0,
        "loop_rate_ci95": list(wilson_interval(len(loops), n)),
        "short_period_max": short_period_max,
        "short_loops": short,
        "short_loop_rate": short / n if n else 0.0,
        "long_loops": len(loops) - short,
        "long_loop_rate": (len(loops) - short) / n if n else 0.0,
        "length_capped": capped,
        "length_capped_rate": capped / n if n else 0.0,
        "period_hist": {str(p): c for p, c in sorted(Counter(r["period"] for r in loops).items())},
        "onset_hist": dict(sorted(onset_hist.items(), key=lambda kv: int(kv[0].split("-")[0]))),
        "mean_distinct_2": mean("distinct_2"),
        "mean_seq_rep_4": mean("seq_rep_4"),
        "mean_longest_repeat": mean("longest_repeat"),
    }


def scan_loops(
    model: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampler: SamplerConfig | None = None,
    *,
    batch_size: int = 64,
    seed: int = 0,
    eos_id: int | None = None,
    unk_id: int = 1,
    min_tail: int = DEFAULT_MIN_TAIL,
    decode=None,
    prompt_texts: Sequence[str] | None = None,
    short_period_max: int = SHORT_PERIOD_MAX,
    progress: bool = False,
    desc: str = "scan",
) -> ScanResult:
    """Generate ``max_new_tokens`` after each prompt in batches and measure loops on the generated tokens.

    ``decode(ids) -> str`` (e.g. ``tokenizer.decode``) adds texts to the records. Batch ``i`` uses
    seed ``seed + i`` so sampled scans are reproducible.
    """
    if not prompts:
        raise ValueError("no prompts to scan")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    sampler = sampler or chanting_sampler(unk_id)
    records: list[dict] = []
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt", file=sys.stderr, disable=not progress or not sys.stderr.isatty(), leave=False)
    try:
        for bi, start in enumerate(range(0, len(prompts), batch_size)):
            chunk = [list(p) for p in prompts[start : start + batch_size]]
            res = generate(model, chunk, max_new_tokens, sampler, seed=seed + bi, eos_id=eos_id)
            for j, toks in enumerate(res.tokens):
                m = degeneracy_metrics(toks, unk_id=unk_id, min_tail=min_tail)
                rec = {
                    "prompt_ids": chunk[j],
                    "tokens": toks,
                    "looping": m["looping"],
                    "period": m["loop_period"],
                    "onset": m["loop_onset"],
                    "unit": m["loop_unit"],
                    "repeats": m["loop_repeats"],
                    "hit_limit": res.finished[j] == "length",
                    "distinct_2": m["distinct_2"],
                    "seq_rep_4": m["seq_rep_4"],
                    "longest_repeat": m["longest_repeat"],
                    "unk_share": m["unk_share"],
                }
                if decode is not None:
                    rec["prompt"] = prompt_texts[start + j] if prompt_texts is not None else decode(chunk[j])
                    rec["text"] = decode(toks)
                    rec["unit_text"] = decode(m["loop_unit"]) if m["looping"] else ""
                records.append(rec)
            bar.update(len(chunk))
    finally:
        bar.close()
    settings = {"sampler": sampler.to_dict(), "max_new_tokens": max_new_tokens, "seed": seed, "min_tail": min_tail}
    return ScanResult(records, summarise(records, short_period_max), settings)


def scan_table(summary: dict, title: str = "") -> str:
    """A short human-readable table of a scan summary."""
    lo, hi = summary["loop_rate_ci95"]
    lines = [title] if title else []
    lines += [
        f"  generations        {summary['n']}",
        f"  loop rate          {summary['loop_rate']:.3f}  (95% CI {lo:.3f}–{hi:.3f})",
        f"    short (≤{summary['short_period_max']})        {summary['short_loop_rate']:.3f}",
        f"    long              {summary['long_loop_rate']:.3f}",
        f"  hit length limit   {summary['length_capped_rate']:.3f}",
        f"  mean distinct-2    {summary['mean_distinct_2']:.3f}",
        f"  mean seq-rep-4     {summary['mean_seq_rep_4']:.3f}",
        f"  mean longest rep.  {summary['mean_longest_repeat']:.1f}",
        f"  periods            {summary['period_hist']}",
        f"  onsets             {summary['onset_hist']}",
    ]
    return "\n".join(lines)
