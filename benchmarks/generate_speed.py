"""Greedy generation speed: our cached engine (eager and compiled) vs our naive loop vs HF ``generate``.

Same weights everywhere: the checkpoint (``--ckpt``, default ``out/case/model`` if present, else a
random default-config GPT) is exported with ``to_hf_gpt2`` to a ``GPT2LMHeadModel``. For each batch
size, 50 new tokens after a 7-token prompt, repetitions interleaved (cached, compiled, naive, hf,
cached, ...) so machine noise hits all four alike; "compiled" is the same cached engine with its decode
step through ``torch.compile`` (``generate(..., compile=True)``), its one-off compilation excluded from
the timings and printed separately; the median is reported, by wall time and by this process's CPU
time (on a shared, oversubscribed machine the CPU-time ratio is the steadier one). Also checks that the
four produce the same greedy tokens. Trains nothing.

    python benchmarks/generate_speed.py [--ckpt DIR] [--batch 1 16 64] [--reps 3] [--threads N] [--json]

On a busy machine pass ``--threads 1``: with more OpenMP threads than free cores every tiny op can wait a
whole scheduler slice, which swamps what is being measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
PROMPT = "白日依山盡，黃"  # 7 characters, all in the default vocabulary


def load_model(ckpt: str | None):
    """(GPT, prompt ids, description) from a checkpoint dir, or a random default-config GPT."""
    from genprobe.model import GPT, GPTConfig
    from genprobe.model.checkpoint import is_checkpoint, load_checkpoint

    path = Path(ckpt) if ckpt else REPO / "out" / "case" / "model"
    if is_checkpoint(path):
        model, tok, _ = load_checkpoint(path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ids = tok.encode(PROMPT)
        return model.eval(), ids, str(path)
    if ckpt:
        raise SystemExit(f"not a genprobe checkpoint: {ckpt}")
    torch.manual_seed(0)
    model = GPT(GPTConfig()).eval()
    return model, [(7 * i + 3) % model.cfg.vocab_size for i in range(len(PROMPT))], "random default-config GPT"


def hf_generate_fn(hf, ids: torch.Tensor, new_tokens: int):
    """A closure running HF ``generate`` greedily for exactly ``new_tokens`` tokens."""
    mask = torch.ones_like(ids)

    def run() -> list[list[int]]:
        with torch.inference_mode():
            out = hf.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
                eos_token_id=None,
                num_beams=1,
            )
        return out[:, ids.shape[1] :].tolist()

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=None, help="genprobe checkpoint dir (default out/case/model if present)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--new-tokens", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions per engine (median reported)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave as is)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.reps < 1:
        raise SystemExit("--reps must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformers

    from genprobe.engine.generate import generate
    from genprobe.model.hf import to_hf_gpt2

    transformers.logging.set_verbosity_error()
    model, prompt, source = load_model(args.ckpt)
    hf = to_hf_gpt2(model, attn_implementation="sdpa")
    hf.generation_config.pad_token_id = 0
    hf.generation_config.eos_token_id = None
    N = args.new_tokens
    rows = []
    for B in args.batch:
        prompts = [list(prompt)] * B
        ids = torch.tensor(prompts, dtype=torch.long)
        engines = {
            "cached": lambda: generate(model, prompts, N, mode="cached").tokens,
            "compiled": lambda: generate(model, prompts, N, mode="cached", compile=True).tokens,
            "naive": lambda: generate(model, prompts, N, mode="naive").tokens,
            "hf": hf_generate_fn(hf, ids, N),
        }
        warmup = {}
        for name, fn in engines.items():  # warm-up (allocator, kernels, HF first-call setup, compilation)
            t0 = time.perf_counter()
            fn()
            warmup[name] = time.perf_counter() - t0
        times: dict[str, list[float]] = {k: [] for k in engines}
        cpu: dict[str, list[float]] = {k: [] for k in engines}
        outputs: dict[str, list[list[int]]] = {}
        for _ in range(args.reps):
            for name, fn in engines.items():
                c0, t0 = time.process_time(), time.perf_counter()
                outputs[name] = fn()
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
        med = {k: statistics.median(v) for k, v in times.items()}
        # CPU seconds of this process: on a shared, oversubscribed machine they track quiet-machine wall time
        # far better than wall time does (which includes waiting for a core).
        cmed = {k: statistics.median(v) for k, v in cpu.items()}
        tps = {k: B * N / v for k, v in med.items()}
        row = {
            "batch": B,
            "seconds": med,
            "tokens_per_s": tps,
            "cached_over_hf": med["hf"] / med["cached"],
            "compiled_over_hf": med["hf"] / med["compiled"],
            "compiled_over_cached": med["cached"] / med["compiled"],
            "compiled_over_naive": med["naive"] / med["compiled"],
            "compile_seconds": warmup["compiled"],
            "cached_over_naive": med["naive"] / med["cached"],
            "cpu_seconds": cmed,
            "cpu_cached_over_hf": cmed["hf"] / cmed["cached"],
            "cpu_compiled_over_hf": cmed["hf"] / cmed["compiled"],
            "cpu_cached_over_naive": cmed["naive"] / cmed["cached"],
            "greedy_tokens_agree": outputs["cached"] == outputs["compiled"] == outputs["naive"] == outputs["hf"],
            "all_times": times,
        }
        rows.append(row)
        if not args.json:
            print(
                f"batch {B:3d}: tok/s cached {tps['cached']:8.0f} | compiled {tps['compiled']:8.0f} | "
                f"naive {tps['naive']:8.0f} | hf {tps['hf']:8.0f} || cached/hf {row['cached_over_hf']:5.2f}x | "
                f"compiled/hf {row['compiled_over_hf']:5.2f}x | cached/naive {row['cached_over_naive']:5.2f}x | "
                f"compiled/naive {row['compiled_over_naive']:5.2f}x || "
                f"by CPU time: cached/hf {row['cpu_cached_over_hf']:5.2f}x compiled/hf {row['cpu_compiled_over_hf']:5.2f}x "
                f"cached/naive {row['cpu_cached_over_naive']:5.2f}x || first compiled call {warmup['compiled']:.1f} s | "
                f"greedy tokens agree: {row['greedy_tokens_agree']}",
                flush=True,
            )
    result = {
        "model": source,
        "parameters": model.num_parameters(),
        "prompt_tokens": len(prompt),
        "new_tokens": N,
        "reps": args.reps,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "rows": rows,
    }
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
