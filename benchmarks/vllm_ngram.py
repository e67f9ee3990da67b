"""vLLM's n-gram speculative decoding (``speculative_config={"method": "ngram"}``, its prompt-lookup proposer)
against its plain greedy decoding of the same model in the same build: token identity, the first divergence,
the draft acceptance vLLM counts, and wall time — the check ``benchmarks/llamacpp_lookup.py`` makes of llama.cpp.

    PYTHONPATH=src VLLM_CPU_KVCACHE_SPACE=1 python benchmarks/vllm_ngram.py MODEL_DIR [--tokens 32] [--k 4]

One engine at a time in this process (plain, then speculative), float32, greedy (temperature 0); the prompts are
``llamacpp_lookup.py``'s, tokenized by the model's own tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from llamacpp_lookup import PROMPTS


def _engine(model_dir: str, speculative: dict | None):
    from vllm import LLM

    kw = {"dtype": "float32", "max_model_len": 512, "seed": 0, "skip_tokenizer_init": True, "trust_remote_code": False}
    kw["disable_log_stats"] = False  # the speculative counters (drafted, accepted) live in its stats
    if speculative is not None:
        kw["speculative_config"] = speculative
    return LLM(model=model_dir, **kw)


def _greedy(llm, prompts: list[list[int]], tokens: int) -> tuple[list[list[int]], float]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, detokenize=False)
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], time.perf_counter() - t0


def _acceptance(llm) -> dict:
    """vLLM's own speculative counters (drafted and accepted tokens), where its metrics API has them."""
    try:
        metrics = llm.get_metrics()
    except Exception as exc:  # an older vLLM, or metrics off
        return {"not_available": f"{type(exc).__name__}: {exc}"}
    wanted = (
        "vllm:spec_decode_num_drafts",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens",
    )
    return {m.name: getattr(m, "value", None) for m in metrics if m.name in wanted}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: its metrics readable
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model_dir)
    labels = list(PROMPTS)
    prompts = [tok(PROMPTS[label])["input_ids"] for label in labels]
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    runs = {}
    for name, config in (("plain", None), ("ngram", spec)):
        t0 = time.perf_counter()
        llm = _engine(args.model_dir, config)
        start = time.perf_counter() - t0
        tokens, wall = _greedy(llm, prompts, args.tokens)
        runs[name] = {
            "tokens": tokens,
            "wall_s": round(wall, 3),
            "start_s": round(start, 1),
            "counters": _acceptance(llm),
        }
        llm.llm_engine.engine_core.shutdown()
        del llm
    for i, label in enumerate(labels):
        a, b = runs["plain"]["tokens"][i], runs["ngram"]["tokens"][i]
        d = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        row = {"prompt": label, "identical": a == b, "first_divergence": d}
        if d is not None:
            row["tokens"] = [tok.decode([a[d]]), tok.decode([b[d]])]
        print(json.dumps(row, ensure_ascii=False), flush=True)
    summary = {name: {k: v for k, v in run.items() if k != "tokens"} for name, run in runs.items()}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
