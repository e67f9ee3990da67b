"""Our engine driving a transformers model vs ``transformers.generate``: greedy tok/s on the same module.

Any transformers causal-LM directory (``MODEL``, default: the second reference model ``out/refmodel-llama`` if
present) is loaded once with ``genprobe.load``; both engines then run the very same ``nn.Module``, greedy, the
end token never stopping a row (every row generates exactly ``--max-new-tokens``). Prompts are the first
``batch`` lines of ``--prompts`` (default: openings of held-out Tang poems), left-padded. Repetitions are interleaved
(each engine once per round, after one warm-up each) so that a busy moment of this shared machine hits both;
the table gives the median and the best round, and flags a row whose spread (max/min) exceeds 1.5×.

    python benchmarks/hf_path_speed.py [MODEL] [--batch 1 16 64] [--max-new-tokens 50] [--reps 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import IO

import torch

REPO = Path(__file__).resolve().parents[1]


def _prompts(model, path: Path | None, n: int) -> list[list[int]]:
    if path is not None:
        texts = [t for t in path.read_text(encoding="utf-8").splitlines() if t.strip()]
    else:
        from genprobe.corpus.inputs import heldout_openings
        from genprobe.corpus.tang import reference_split

        # openings of poems neither reference model trained on (the held-out part of the corpus split)
        texts = heldout_openings(model.tokenizer, n, skip_poems=reference_split().heldout_start)
    if len(texts) < n:
        raise SystemExit(f"need {n} prompts, the file has {len(texts)}")
    return [model.encode(t) for t in texts[:n]]


def _ours(model, prompts: list[list[int]], new: int):
    from genprobe.engine.generate import generate

    def run() -> list[list[int]]:
        return generate(model.runner, prompts, new).tokens

    return run


def _hf(model, prompts: list[list[int]], new: int):
    P = max(map(len, prompts))
    pad = model.pad_id if model.pad_id is not None else 0
    ids = torch.full((len(prompts), P), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :] = torch.tensor(p)
        mask[i, P - len(p) :] = 1

    def run() -> list[list[int]]:
        with torch.inference_mode():
            out = model.module.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=new,
                min_new_tokens=new,
                eos_token_id=None,
                pad_token_id=pad,
            )
        return out[:, P:].tolist()

    return run


def measure(model, prompts: list[list[int]], new: int, reps: int) -> dict:
    """Interleaved rounds of both engines: seconds per round, tokens equal or not."""
    fns = {"ours": _ours(model, prompts, new), "hf": _hf(model, prompts, new)}
    tokens = {k: fn() for k, fn in fns.items()}  # warm-up, and the tokens compared
    seconds: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            seconds[k].append(time.perf_counter() - t0)
    n_tokens = len(prompts) * new
    row = {"batch": len(prompts), "tokens_equal": tokens["ours"] == tokens["hf"]}
    for k, s in seconds.items():
        row[k] = {
            "median_tok_s": n_tokens / statistics.median(s),
            "best_tok_s": n_tokens / min(s),
            "busy": max(s) / min(s) > 1.5,
        }
    row["ratio_median"] = row["ours"]["median_tok_s"] / row["hf"]["median_tok_s"]
    row["ratio_best"] = row["ours"]["best_tok_s"] / row["hf"]["best_tok_s"]
    return row


def main() -> int:
    """Run the benchmark; with ``--json`` stdout holds the JSON alone (``genprobe._io.json_stdout``)."""
    from genprobe._io import json_stdout

    with json_stdout("--json" in sys.argv[1:]) as out:
        return _main(out)


def _main(out: IO[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=str(REPO / "out" / "refmodel-llama"))
    ap.add_argument("--prompts", type=Path, default=None)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--max-new-tokens", type=int, default=50)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import genprobe

    torch.set_num_threads(args.threads)
    model = genprobe.load(args.model)
    rows = [measure(model, _prompts(model, args.prompts, b), args.max_new_tokens, args.reps) for b in args.batch]
    print(
        f"{model.describe()}; greedy, {args.max_new_tokens} new tokens, {args.threads} thread(s), "
        f"{args.reps} interleaved rounds",
        file=sys.stderr,
    )
    print("| batch | ours tok/s (median / best) | transformers.generate | ours / HF (median / best) | same tokens |")
    print("|---|---|---|---|---|")
    for r in rows:
        busy = " (busy)" if r["ours"]["busy"] or r["hf"]["busy"] else ""
        print(
            f"| {r['batch']} | {r['ours']['median_tok_s']:,.0f} / {r['ours']['best_tok_s']:,.0f} | "
            f"{r['hf']['median_tok_s']:,.0f} / {r['hf']['best_tok_s']:,.0f} | "
            f"{r['ratio_median']:.2f}× / {r['ratio_best']:.2f}×{busy} | {'yes' if r['tokens_equal'] else 'NO'} |"
        )
    if args.json:
        print(json.dumps(rows, indent=2), file=out)
    return 0 if all(r["tokens_equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
