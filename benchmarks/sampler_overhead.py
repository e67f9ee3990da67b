"""Per-token overhead of DRY and contrastive search: our engine vs transformers on the same weights.

Same weights everywhere: the checkpoint (``--ckpt``, default ``out/case/model`` if present, else a
random default-config GPT) exported with ``to_hf_gpt2``. Two measurements, repetitions interleaved
(every method once per round, so machine noise hits all alike), medians reported:

1. Whole generations, batch 1, ``--new-tokens`` after a 7-token prompt: greedy, greedy + DRY,
   greedy + repetition penalty, contrastive search — ours and HF's ``generate``. The overhead per
   token of a method is (its time − the same engine's greedy time) / new tokens.
   transformers has no DRY: its nearest peer is the repetition penalty (RepetitionPenaltyLogitsProcessor),
   so DRY's overhead is compared with HF's repetition-penalty overhead. Contrastive search left
   transformers' core in version 5 (a Hub repository now, unreachable offline); the HF contrastive
   column is measured only where the installed transformers still has ``_contrastive_search`` (4.x),
   e.g. ``PYTHONPATH=src /path/to/venv-with-transformers-4.52/bin/python benchmarks/sampler_overhead.py``.
2. The processors alone, one call on a (1, V) row with a history of ``--history`` tokens (a looping
   sequence: DRY's worst case): our DRY (llama.cpp arithmetic, pure Python Z-algorithm) vs HF's
   RepetitionPenaltyLogitsProcessor and our repetition penalty. llama.cpp's own DRY (C++) is not timed here.

    python benchmarks/sampler_overhead.py [--ckpt DIR] [--new-tokens 50] [--reps 5] [--history 64 512 2048] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import IO

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from generate_speed import PROMPT, load_model  # noqa: E402  (same model and prompt as the speed benchmark)

DRY = dict(dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2)
REP = 1.3
ALPHA, K = 0.6, 4


def _hf_fn(hf, ids: torch.Tensor, N: int, **kw):
    mask = torch.ones_like(ids)

    def run() -> list[int]:
        with torch.inference_mode():
            out = hf.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=N,
                min_new_tokens=N,
                pad_token_id=0,
                eos_token_id=None,
                **kw,
            )
        return out[0, ids.shape[1] :].tolist()

    return run


def _interleaved(fns: dict, reps: int) -> tuple[dict, dict, dict]:
    """Median wall and CPU seconds per function over ``reps`` interleaved rounds (after one warm-up each)."""
    outs = {k: fn() for k, fn in fns.items()}
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return ({k: statistics.median(v) for k, v in wall.items()}, {k: statistics.median(v) for k, v in cpu.items()}, outs)


def generation_rows(model, hf, prompt: list[int], N: int, reps: int) -> dict:
    """Whole-generation timings and per-token overheads (ours vs HF)."""
    from transformers.generation.utils import GenerationMixin

    from genprobe.engine.generate import generate
    from genprobe.engine.samplers.stages import SamplerConfig

    ids = torch.tensor([prompt])

    def ours(cfg: SamplerConfig | None):
        return lambda: generate(model, [prompt], N, sampler=cfg).tokens[0]

    fns = {
        "ours_greedy": ours(None),
        "ours_dry": ours(SamplerConfig(greedy=True, **DRY)),
        "ours_rep": ours(SamplerConfig(greedy=True, repetition_penalty=REP)),
        "ours_contrastive": ours(SamplerConfig(penalty_alpha=ALPHA, top_k=K)),
        "hf_greedy": _hf_fn(hf, ids, N),
        "hf_rep": _hf_fn(hf, ids, N, repetition_penalty=REP),
    }
    hf_contrastive = hasattr(GenerationMixin, "_contrastive_search")
    if hf_contrastive:
        fns["hf_contrastive"] = _hf_fn(hf, ids, N, penalty_alpha=ALPHA, top_k=K)
    wall, cpu, outs = _interleaved(fns, reps)
    per_tok = {k: v / N for k, v in wall.items()}
    over = lambda a, b: (wall[a] - wall[b]) / N  # noqa: E731
    row = {
        "seconds": wall,
        "cpu_seconds": cpu,
        "ms_per_token": {k: 1e3 * v for k, v in per_tok.items()},
        "overhead_ms_per_token": {
            "ours_dry": 1e3 * over("ours_dry", "ours_greedy"),
            "ours_rep": 1e3 * over("ours_rep", "ours_greedy"),
            "hf_rep": 1e3 * over("hf_rep", "hf_greedy"),
            "ours_contrastive": 1e3 * over("ours_contrastive", "ours_greedy"),
            "hf_contrastive": 1e3 * over("hf_contrastive", "hf_greedy") if hf_contrastive else None,
        },
        "ratios": {
            "ours_dry_over_ours_greedy": wall["ours_dry"] / wall["ours_greedy"],
            "hf_rep_over_hf_greedy": wall["hf_rep"] / wall["hf_greedy"],
            "ours_dry_time_over_hf_rep_time": wall["ours_dry"] / wall["hf_rep"],
            "ours_contrastive_over_ours_greedy": wall["ours_contrastive"] / wall["ours_greedy"],
            "ours_contrastive_time_over_hf_contrastive_time": wall["ours_contrastive"] / wall["hf_contrastive"]
            if hf_contrastive
            else None,
        },
        "hf_contrastive_available": hf_contrastive,
        "tokens_agree": {
            "greedy": outs["ours_greedy"] == outs["hf_greedy"],
            "rep": outs["ours_rep"] == outs["hf_rep"],
            "contrastive": outs["ours_contrastive"] == outs["hf_contrastive"] if hf_contrastive else None,
        },
    }
    return row


def processor_rows(V: int, histories: list[int], reps: int) -> list[dict]:
    """One processor call on a (1, V) row: our DRY and repetition penalty vs HF's repetition penalty."""
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    from genprobe.engine.samplers.chain import process_logits
    from genprobe.engine.samplers.stages import SamplerConfig

    rows = []
    g = torch.Generator().manual_seed(0)
    z = torch.randn(1, V, generator=g)
    dry, rep = SamplerConfig(greedy=True, **DRY), SamplerConfig(greedy=True, repetition_penalty=REP)
    hf_rep = RepetitionPenaltyLogitsProcessor(REP)
    for L in histories:
        cycle = torch.randint(0, V, (7,), generator=g)
        hist = cycle.repeat(L // 7 + 1)[:L][None, :]  # a 7-token loop: every position repeats
        calls = max(5, 2000 // max(L // 64, 1))

        def timed(fn, h=hist, n=calls):
            return lambda: [fn(h) for _ in range(n)]

        wall, cpu, _ = _interleaved(
            {
                "ours_dry": timed(lambda h: process_logits(z, h, dry)),
                "ours_rep": timed(lambda h: process_logits(z, h, rep)),
                "hf_rep": timed(lambda h: hf_rep(h, z.clone())),
            },
            reps,
        )
        us = {k: 1e6 * v / calls for k, v in wall.items()}
        rows.append(
            {
                "history": L,
                "us_per_call": us,
                "cpu_us_per_call": {k: 1e6 * v / calls for k, v in cpu.items()},
                "ours_dry_over_hf_rep": us["ours_dry"] / us["hf_rep"],
                "ours_rep_over_hf_rep": us["ours_rep"] / us["hf_rep"],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; with ``--json`` stdout holds the JSON alone: what vLLM or a native library prints goes to
    stderr (``genprobe._io.json_stdout``)."""
    from genprobe._io import json_stdout

    with json_stdout("--json" in (sys.argv[1:] if argv is None else argv)) as out:
        return _main(argv, out)


def _main(argv: list[str] | None, out: IO[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=None, help="genprobe checkpoint dir (default out/case/model if present)")
    ap.add_argument("--new-tokens", type=int, default=50)
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions (median reported)")
    ap.add_argument("--history", type=int, nargs="+", default=[64, 512, 2048], help="processor micro-benchmark lengths")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave as is)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.new_tokens < 1:
        raise SystemExit("--reps and --new-tokens must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    from genprobe.model.hf import to_hf_gpt2

    transformers.logging.set_verbosity_error()
    model, prompt, source = load_model(args.ckpt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = to_hf_gpt2(model, attn_implementation="eager")
    gen = generation_rows(model, hf, list(prompt), args.new_tokens, args.reps)
    proc = processor_rows(model.cfg.vocab_size, args.history, args.reps)
    result = {
        "model": source,
        "prompt": PROMPT,
        "new_tokens": args.new_tokens,
        "reps": args.reps,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "generation": gen,
        "processors": proc,
    }
    if args.json:
        json.dump(result, out, indent=2)
        out.write("\n")
        return 0
    ms, ov, r = gen["ms_per_token"], gen["overhead_ms_per_token"], gen["ratios"]
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    print(
        f"{source}, {args.new_tokens} new tokens, batch 1, transformers {transformers.__version__}, "
        f"median of {args.reps} interleaved reps"
    )
    print("ms/token: " + "  ".join(f"{k} {v:.3f}" for k, v in ms.items()))
    print("overhead ms/token over the engine's greedy: " + "  ".join(f"{k} {fmt(v)}" for k, v in ov.items()))
    print(
        f"ratios: DRY/greedy (ours) {r['ours_dry_over_ours_greedy']:.2f}x | rep/greedy (HF) "
        f"{r['hf_rep_over_hf_greedy']:.2f}x | ours DRY vs HF rep-penalty generation "
        f"{r['ours_dry_time_over_hf_rep_time']:.2f}x | contrastive/greedy (ours) "
        f"{r['ours_contrastive_over_ours_greedy']:.2f}x | ours/HF contrastive "
        f"{fmt(r['ours_contrastive_time_over_hf_contrastive_time'])}x"
    )
    print(f"tokens agree with HF: {gen['tokens_agree']}")
    for p in proc:
        u = p["us_per_call"]
        print(
            f"processor call, history {p['history']:5d}: ours DRY {u['ours_dry']:8.1f} us | "
            f"ours rep {u['ours_rep']:6.1f} us | HF rep {u['hf_rep']:6.1f} us | "
            f"DRY/HF-rep {p['ours_dry_over_hf_rep']:6.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
