"""Speculative vs plain greedy decoding at batch 1 (genprobe's engine), and transformers' assisted generation checked
for token identity with its plain greedy.

    PYTHONPATH=src python benchmarks/speculative_speed.py MODEL [--drafts lookup layers:8] [--k 4] [--tokens 48]
        [--rounds 3] [--hf]

Each prompt (a loop-prone one: a sentence said three times; ordinary text; a passage to repeat, prompt lookup's own
use case) runs plain greedy and each draft alternated over ``--rounds`` rounds (the order reversed every other
round, so a drift in the machine's load favours neither); reported: median wall time, the median of the per-round
speed-ups (plain / speculative, each round's pair measured back to back) with their min and max, acceptance rate,
tokens per target forward, whether the tokens are plain greedy's, and the load average (a shared machine).
``--hf`` adds transformers' own ``prompt_lookup_num_tokens=`` and ``assistant_model=`` (the model's first half of
its layers) greedy runs, compared with ``generate(do_sample=False)``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from genprobe.engine.generate import generate
from genprobe.engine.runner import runner_for
from genprobe.engine.speculative import make_draft, speculative_generate
from genprobe.model.load import load_model

PROMPTS = {
    "loop-prone": "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The cat",
    "ordinary": "In the early morning the fishermen of the village walk down to the harbour and",
    "passage": "Repeat the text exactly.\nText: The old lighthouse keeper climbed the stairs each evening, lit the "
    "lamp, and watched the ships pass through the narrow channel until dawn.\nRepeated text: The old lighthouse",
}
TANG = {"loop-prone": "春眠不覺曉，處處聞啼鳥。春眠不覺曉，處處聞啼鳥。春眠", "ordinary": "白日依山盡"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--drafts", nargs="+", default=["lookup"])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hf", action="store_true")
    args = ap.parse_args()
    m = load_model(args.model)
    target = runner_for(m)
    prompts = TANG if m.kind == "genprobe" else PROMPTS
    drafts = {d: make_draft(target, d) for d in args.drafts}
    rows = []
    with torch.inference_mode():
        for label, text in prompts.items():
            ids = m.encode(text)
            plain_tokens = generate(target, [ids], args.tokens).tokens[0]  # warm-up, and the reference
            times, last = timed_rounds(target, ids, drafts, args.tokens, args.k, args.rounds)
            for name, r in last.items():
                ratios = [a / b for a, b in zip(times["plain"], times[name], strict=True)]
                rows.append(
                    {
                        "prompt": label,
                        "draft": name,
                        "k": args.k,
                        "rounds": args.rounds,
                        "plain_s": round(statistics.median(times["plain"]), 3),
                        "speculative_s": round(statistics.median(times[name]), 3),
                        "speedup": round(statistics.median(ratios), 2),
                        "speedup_min": round(min(ratios), 2),
                        "speedup_max": round(max(ratios), 2),
                        "acceptance": round(r.stats.acceptance_rate or 0.0, 3),
                        "tokens_per_forward": round(r.stats.tokens_per_forward or 0.0, 2),
                        "identical": r.tokens == plain_tokens,
                        "load_avg_1min": round(os.getloadavg()[0], 1),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
            if args.hf and m.kind != "genprobe":
                print(json.dumps({"prompt": label, **hf_assisted(m, ids, args.tokens, args.k)}), flush=True)


def timed_rounds(target, ids: list[int], drafts: dict, n: int, k: int, rounds: int):
    """Wall seconds per round of plain greedy and of each draft, back to back, the order reversed every other round
    (the ratio of one round's pair is what drift in a shared machine's load disturbs least)."""
    times: dict[str, list[float]] = {"plain": [], **{d: [] for d in drafts}}
    last = {}
    for i in range(rounds):
        order = ["plain", *drafts]
        for name in order if i % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            if name == "plain":
                generate(target, [ids], n)
            else:
                last[name] = speculative_generate(target, ids, n, draft=drafts[name], k=k)
            times[name].append(time.perf_counter() - t0)
    return times, last


def hf_assisted(m, ids: list[int], n: int, k: int) -> dict:
    """transformers' prompt lookup and assisted generation (greedy) against its plain greedy."""
    from genprobe.engine.hf_adapter import HFCausalLM
    from genprobe.engine.speculative import first_layers

    hf = m.module
    x = torch.tensor([ids])
    kw = {"do_sample": False, "max_new_tokens": n, "min_new_tokens": n, "pad_token_id": m.pad_id}
    out = {}
    t0 = time.perf_counter()
    plain = hf.generate(x, **kw)[0, len(ids) :].tolist()
    out["hf_plain_s"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    lookup = hf.generate(x, prompt_lookup_num_tokens=k, **kw)[0, len(ids) :].tolist()
    out["hf_lookup_s"] = round(time.perf_counter() - t0, 3)
    out["hf_lookup_identical"] = lookup == plain
    n_layer = hf.config.num_hidden_layers // 2
    assistant = first_layers(HFCausalLM(hf), n_layer).model
    t0 = time.perf_counter()
    assisted = hf.generate(x, assistant_model=assistant, **kw)[0, len(ids) :].tolist()
    out["hf_assisted_s"] = round(time.perf_counter() - t0, 3)
    out["hf_assisted_identical"] = assisted == plain
    out["hf_plain_is_genprobe_greedy"] = plain == generate(HFCausalLM(hf), [ids], n).tokens[0]
    return out


if __name__ == "__main__":
    main()
