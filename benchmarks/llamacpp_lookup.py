"""llama.cpp's prompt lookup decoding (llama-cpp-python's ``LlamaPromptLookupDecoding`` draft) against its plain
greedy decoding of the same GGUF: token identity and wall time at batch 1.

    PYTHONPATH=src python benchmarks/llamacpp_lookup.py GGUF [--tokens 64] [--prompts loop-prone ordinary]
"""

from __future__ import annotations

import argparse
import json
import time

PROMPTS = {
    "loop-prone": "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The cat",
    "ordinary": "In the early morning the fishermen of the village walk down to the harbour and",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompts", nargs="+", choices=list(PROMPTS), default=list(PROMPTS))
    args = ap.parse_args()
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    kw = {"n_ctx": 512, "n_threads": 1, "verbose": False, "seed": 0}
    plain = Llama(args.gguf, **kw)
    lookup = Llama(args.gguf, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4), **kw)
    for label in args.prompts:
        text = PROMPTS[label]
        row = {"prompt": label}
        for name, llm in (("plain", plain), ("lookup", lookup)):
            t0 = time.perf_counter()
            out = llm.create_completion(text, max_tokens=args.tokens, temperature=0.0, top_k=1, logprobs=None)
            row[f"{name}_s"] = round(time.perf_counter() - t0, 3)
            row[name] = out["choices"][0]["text"]
        row["identical"] = row["plain"] == row["lookup"]
        print(json.dumps(row, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
