"""Greedy generation speed of our engine against transformers, CTranslate2 (and vLLM when installed).

Same float32 weights everywhere: ``--model default`` is the checkpoint (``--ckpt``, default
``out/case/model`` if present, else a random default-config GPT, 427k parameters); ``--model 58m`` is
a random GPT-2-layout model of 57.8M parameters (8 layers, d_model 768, 12 heads, vocabulary 1,202,
context 160: the case study's ``cache_scaling`` model). Engines (see ``bench_engines.py``): ``cached``
(our eager KV-cache engine), ``compiled`` (the same with ``compile=True``), ``naive`` (no cache),
``hf`` (``transformers`` ``generate``), ``ct2`` (CTranslate2, converted automatically into a temp
dir) and ``vllm`` (skipped unless ``import vllm`` works). For each batch size: ``--new-tokens`` greedy
tokens after a 7-token prompt, repetitions interleaved with the order rotated (see ``bench_stats.py``),
median and min reported, rows flagged when the spread shows the machine was busy. Also per engine: the
time to first token (a one-token generation: prefill + first step), memory (peak RSS above the
starting RSS during one generation; RSS added by building and warming the engine), and whether its
greedy tokens equal our eager engine's. One-off compilation/conversion is excluded from timings and
printed separately. ``--scaling`` adds tokens/s vs batch size and decode tokens/s vs context length
for every engine, as a table, JSON and a PNG plot in ``--out``.

    python benchmarks/generate_speed.py --model default --batch 1 16 64 --reps 5 --threads 2
    python benchmarks/generate_speed.py --model 58m --batch 1 16 64 --reps 5 --threads 2
    python benchmarks/generate_speed.py --model default --scaling --out out/bench

Run it on a quiet machine: every row prints the 1-minute load average it was measured under.

CTranslate2 and torch each bring their own OpenMP runtime. In one process, the threads one runtime
leaves spinning after its parallel regions take cores from the other's (measured on a quiet 2-core
machine: our compiled path 2–4x slower at batch 16/64 with CTranslate2 loaded beside it). For figures
to quote, time the two families in separate processes: ``--engines cached compiled hf`` and
``--engines ct2 ct2-1t`` (token agreement is then checked within each run only).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench_* modules beside this script

from bench_engines import Bundle, EngineUnavailable, make_engine  # noqa: E402
from bench_stats import Series, interleaved, load_average, peak_rss_during, rss_bytes  # noqa: E402

from genprobe._io import json_safe

REPO = Path(__file__).resolve().parents[1]
PROMPT = "白日依山盡，黃"  # 7 characters, all in the default vocabulary
ENGINES = (
    "cached",
    "compiled",
    "naive",
    "hf",
    "ct2",
    "ct2-1t",
    "vllm",
    "cached-bf16",
    "compiled-bf16",
    "cached-int8",
    "compiled-int8",
)
# Opt-in engines (an approximation of the float32 model): run only when named in --engines. Each one's tokens
# must equal its own model's eager engine (the value here), not the float32 model's.
OPT_IN = {
    "cached-bf16": "cached-bf16",
    "compiled-bf16": "cached-bf16",
    "cached-int8": "cached-int8",
    "compiled-int8": "cached-int8",
}
OPT_IN_FAST = ("compiled-bf16", "compiled-int8")  # rated against the peers like OURS
OURS = "compiled"  # our fast path: the engine the ratios are about


def load_bundle(which: str, ckpt: str | None) -> tuple[Bundle, list[int]]:
    """(model bundle, prompt ids) for ``--model default`` (checkpoint or random) or ``--model 58m``."""
    from genprobe.corpus.tokenizer import CharTokenizer
    from genprobe.model.checkpoint import is_checkpoint, load_checkpoint
    from genprobe.model.config import GPTConfig
    from genprobe.model.gpt import GPT

    if which == "default":
        path = Path(ckpt) if ckpt else REPO / "out" / "case" / "model"
        if is_checkpoint(path):
            model, tok, _ = load_checkpoint(path)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ids = tok.encode(PROMPT)
            return Bundle(model.eval(), tok, str(path)), ids
        if ckpt:
            raise SystemExit(f"not a genprobe checkpoint: {ckpt}")
        cfg, source = GPTConfig(), "random default-config GPT"
    elif which == "58m":
        from genprobe.experiments.timing import scaling_config

        cfg, source = scaling_config(), "random 8x768 GPT-2-layout model (case study cache_scaling)"
    else:
        raise SystemExit(f"--model must be default or 58m, got {which!r}")
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    tok = CharTokenizer([chr(0x4E00 + i) for i in range(cfg.vocab_size - 2)])  # ids only: any 1-char tokens
    return Bundle(model, tok, source), [(7 * i + 3) % cfg.vocab_size for i in range(len(PROMPT))]


def load_model(ckpt: str | None):
    """(GPT, prompt ids, description) of ``--model default``: what ``sampler_overhead.py`` benchmarks too."""
    bundle, ids = load_bundle("default", ckpt)
    return bundle.model, ids, bundle.source


@dataclass
class Row:
    """One batch size: per-engine timings, time to first token, memory and token agreement."""

    batch: int
    load_before: float | None
    load_after: float | None
    series: dict[str, Series]
    ttft: dict[str, Series]
    setup_seconds: dict[str, float]
    memory_mb: dict[str, dict[str, float]]
    agree_with_cached: dict[str, bool]
    skipped: dict[str, str] = field(default_factory=dict)
    # Weight-only (opt-in) engines: the fraction of their tokens equal to the float32 model's (eager engine).
    match_float32: dict[str, float] = field(default_factory=dict)

    def tokens_per_s(self, n: int, stat: str = "median") -> dict[str, float]:
        """Tokens/s per engine from the median (or ``"min"``) wall time."""
        return {k: self.batch * n / (s.median if stat == "median" else s.best) for k, s in self.series.items()}

    def ratios(self, n: int) -> dict[str, float]:
        """Our fast path over each other engine (>1: ours faster), from median and from min times."""
        out = {}
        if OURS not in self.series:
            return out
        for ours in (OURS, *OPT_IN_FAST):
            for other in ("ct2", "ct2-1t", "hf", "cached", "vllm", "naive"):
                if ours in self.series and other in self.series:
                    out[f"{ours}/{other}"] = self.series[other].median / self.series[ours].median
                    out[f"{ours}/{other}_min"] = self.series[other].best / self.series[ours].best
        return out

    def to_dict(self, n: int) -> dict:
        """Plain-JSON form."""
        return {
            "batch": self.batch,
            "load_average": [self.load_before, self.load_after],
            "tokens_per_s": self.tokens_per_s(n),
            "tokens_per_s_min_time": self.tokens_per_s(n, "min"),
            "ratios": self.ratios(n),
            "ttft_ms": {k: 1e3 * s.median for k, s in self.ttft.items()},
            "setup_seconds": self.setup_seconds,
            "memory_mb": self.memory_mb,
            "greedy_tokens_agree": self.agree_with_cached,
            "opt_in_tokens_matching_float32": self.match_float32,
            "all_agree": all(self.agree_with_cached.values()),
            "busy": sorted(k for k, s in self.series.items() if s.busy),
            "series": {k: json_safe(s) for k, s in self.series.items()},
            "skipped": self.skipped,
        }


def build_engines(bundle: Bundle, names: list[str], prompts: list[list[int]], n: int, skipped: dict[str, str]):
    """Engines that can run here (warmed up once), with setup seconds and RSS added by building them."""
    engines, setup, mem = {}, {}, {}
    for name in names:
        before = rss_bytes()
        try:
            t0 = time.perf_counter()
            e = make_engine(name, bundle, prompts, n)
            e.run()  # warm-up: allocator, first-call setup, compilation, conversion
            e.first_token()
        except EngineUnavailable as exc:
            skipped[name] = str(exc)
            continue
        setup[name] = time.perf_counter() - t0
        mem[name] = {"setup_rss_mb": (rss_bytes() - before) / 2**20}
        engines[name] = e
    return engines, setup, mem


def measure_row(
    bundle: Bundle, names: list[str], prompt: list[int], batch: int, n: int, reps: int, memory: bool
) -> Row:
    """Time every engine on ``batch`` copies of ``prompt``: interleaved repetitions, TTFT, memory, agreement."""
    prompts = [list(prompt)] * batch
    skipped: dict[str, str] = {}
    engines, setup, mem = build_engines(bundle, names, prompts, n, skipped)
    load_before = load_average()
    series, outputs = interleaved({k: e.run for k, e in engines.items()}, reps)
    ttft, _ = interleaved({k: e.first_token for k, e in engines.items()}, reps)
    load_after = load_average()
    if memory:
        for k, e in engines.items():
            peak, _ = peak_rss_during(e.run)
            mem[k]["run_peak_rss_mb"] = peak / 2**20
    refs = reference_tokens(bundle, prompts, n, outputs)
    agree = {k: same_tokens(v, refs[OPT_IN.get(k, "cached")], batch, n) for k, v in outputs.items()}
    match = {k: token_match(v, refs["cached"]) for k, v in outputs.items() if k in OPT_IN}
    return Row(batch, load_before, load_after, series, ttft, setup, mem, agree, skipped, match)


def reference_tokens(
    bundle: Bundle, prompts: list[list[int]], n: int, outputs: dict[str, list[list[int]]]
) -> dict[str, list[list[int]]]:
    """What each engine's tokens must equal: its own model's eager engine (float32, or weight-only bfloat16/int8),
    timed above when it ran, else generated here untimed, so that a process holding one engine still checks it."""
    from genprobe.engine.generate import generate

    refs = {k: outputs[k] for k in ("cached", *OPT_IN.values()) if k in outputs}
    if "cached" not in refs:
        refs["cached"] = generate(bundle.model, prompts, n).tokens
    for ref in {OPT_IN[k] for k in outputs if k in OPT_IN} - set(refs):
        dtype = {"cached-bf16": "bfloat16", "cached-int8": "int8"}[ref]
        refs[ref] = generate(bundle.narrow(dtype), prompts, n).tokens
    return refs


def same_tokens(tokens: list[list[int]], ref: list[list[int]] | None, batch: int, n: int) -> bool:
    """``batch`` rows of ``n`` tokens, equal to ``ref`` when there is one."""
    return (ref is None or tokens == ref) and len(tokens) == batch and all(len(r) == n for r in tokens)


def token_match(tokens: list[list[int]], ref: list[list[int]]) -> float:
    """Fraction of positions where ``tokens`` equals ``ref`` (rows of equal length)."""
    pairs = [(a, b) for row, ref_row in zip(tokens, ref, strict=True) for a, b in zip(row, ref_row, strict=True)]
    return sum(a == b for a, b in pairs) / max(1, len(pairs))


def format_row(row: Row, n: int) -> str:
    """One printed line per engine plus the ratios, for a terminal."""
    tps, tmin = row.tokens_per_s(n), row.tokens_per_s(n, "min")
    load = f" (load {row.load_before:.1f} -> {row.load_after:.1f})" if row.load_before is not None else ""
    lines = [f"batch {row.batch}{load}"]
    for k in row.series:
        s = row.series[k]
        mem = row.memory_mb.get(k, {})
        lines.append(
            f"  {k:9s} {tps[k]:10,.0f} tok/s (best {tmin[k]:10,.0f}) spread {100 * s.spread:5.1f}%"
            f"{' BUSY' if s.busy else '     '} | TTFT {1e3 * row.ttft[k].median:8.2f} ms"
            f" | run peak +{mem.get('run_peak_rss_mb', float('nan')):7.1f} MB"
            f", setup +{mem.get('setup_rss_mb', 0):7.1f} MB"
            f" ({row.setup_seconds[k]:.1f} s) | tokens agree: {row.agree_with_cached[k]}"
            + (f" (float32 model's tokens: {100 * row.match_float32[k]:.0f}%)" if k in row.match_float32 else "")
        )
    for k, why in row.skipped.items():
        lines.append(f"  {k:9s} skipped: {why}")
    r = row.ratios(n)
    if r:
        lines.append(
            "  ratios (median; min-time in brackets): "
            + ", ".join(f"{k} {v:.2f}x [{r[k + '_min']:.2f}x]" for k, v in r.items() if not k.endswith("_min"))
        )
    return "\n".join(lines)


def markdown_table(rows: list[Row], n: int) -> str:
    """The speed table: tokens/s (median) per engine and batch, ratios of our fast path."""
    names = [k for k in ENGINES if any(k in r.series for r in rows)]
    pairs = [f"{OURS}/{o}" for o in ("ct2", "ct2-1t", "hf")]
    for fast in OPT_IN_FAST:
        if fast in names:
            pairs += [f"{fast}/ct2", f"{fast}/hf"]
    tail = f" | {' | '.join(pairs)} | TTFT {OURS} / ct2 / hf (ms) | agree | busy |"
    head = "| batch | " + " | ".join(names) + tail
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        tps, rat = r.tokens_per_s(n), r.ratios(n)
        cells = [f"{tps[k]:,.0f}" if k in tps else "–" for k in names]
        ttft = " / ".join(f"{1e3 * r.ttft[k].median:.2f}" if k in r.ttft else "–" for k in (OURS, "ct2", "hf"))
        ratio = [f"{rat[p]:.2f}x" if p in rat else "–" for p in pairs]
        busy = ",".join(k for k, s in r.series.items() if s.busy) or "no"
        agree = all(r.agree_with_cached.values())
        out.append(f"| {r.batch} | " + " | ".join(cells) + f" | {' | '.join(ratio)} | {ttft} | {agree} | {busy} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; with ``--json`` stdout holds the JSON alone: what vLLM or a native library prints goes to
    stderr (``genprobe._io.json_stdout``)."""
    from genprobe._io import json_stdout

    with json_stdout("--json" in (sys.argv[1:] if argv is None else argv)) as out:
        return _main(argv, out)


def _main(argv: list[str] | None, out: IO[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", default="default", choices=["default", "58m"], help="which model (default: the checkpoint)"
    )
    ap.add_argument(
        "--ckpt", default=None, help="genprobe checkpoint dir for --model default (default out/case/model if present)"
    )
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--new-tokens", type=int, default=50)
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions per engine (median and min reported)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads and CTranslate2 intra_threads")
    ap.add_argument(
        "--engines",
        nargs="+",
        default=None,
        choices=ENGINES,
        help="engines to run (default: all but the weight-only bfloat16 ones; naive only for --model default)",
    )
    ap.add_argument("--no-memory", action="store_true", help="skip the memory pass")
    ap.add_argument("--scaling", action="store_true", help="also tokens/s vs batch size and vs context length")
    ap.add_argument("--scaling-batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument(
        "--contexts", type=int, nargs="+", default=None, help="context lengths (default: up to the model's)"
    )
    ap.add_argument("--out", type=Path, default=None, help="directory for speed.json / scaling.json / scaling.png")
    ap.add_argument("--json", action="store_true", help="JSON on stdout (tables go to stderr)")
    args = ap.parse_args(argv)
    if args.reps < 1:
        raise SystemExit("--reps must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    bundle, prompt = load_bundle(args.model, args.ckpt)
    names = args.engines or [k for k in ENGINES if k not in OPT_IN and (k != "naive" or args.model == "default")]
    show = sys.stderr if args.json else sys.stdout
    if args.reps < 3:
        print(f"note: {args.reps} repetition(s): a single busy repetition can decide a row; use --reps >= 3", file=show)
    N = args.new_tokens
    try:
        rows = []
        for B in args.batch:
            row = measure_row(bundle, names, prompt, B, N, args.reps, not args.no_memory)
            rows.append(row)
            print(format_row(row, N), file=show, flush=True)
            if any(s.busy for s in row.series.values()):
                print(
                    f"  warning: the machine was busy during batch {B} (spread > 25%): compare the best-time ratios, "
                    "or re-run when `uptime` shows a load below the core count",
                    file=show,
                )
        table = markdown_table(rows, N)
        print("\n" + table, file=show)
        result = {
            "model": bundle.source,
            "parameters": bundle.model.num_parameters(),
            "prompt_tokens": len(prompt),
            "new_tokens": N,
            "reps": args.reps,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "rows": [r.to_dict(N) for r in rows],
        }
        if args.scaling:
            from bench_scaling import run_scaling

            result["scaling"] = run_scaling(bundle, names, prompt, args, show)
    finally:
        bundle.close()
    if args.out:
        from genprobe._io import atomic_write_json, atomic_write_text

        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out / f"speed-{args.model}.json", result)
        atomic_write_text(args.out / f"speed-{args.model}.md", table + "\n")
    if args.json:
        json.dump(result, out, indent=2)
        out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
