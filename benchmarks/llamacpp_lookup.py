"""llama.cpp's prompt lookup decoding (llama-cpp-python's ``LlamaPromptLookupDecoding`` draft) against its plain
greedy decoding of the same GGUF: token identity and wall time at batch 1.

    PYTHONPATH=src python benchmarks/llamacpp_lookup.py GGUF [--tokens 64] [--prompts loop-prone ordinary]
    PYTHONPATH=src python benchmarks/llamacpp_lookup.py GGUF --probe [--tokens 32] [--prompts ordinary]

``--probe``: where the lookup run's tokens first differ from plain greedy's, the next-token logits of that position
computed three ways on the same context — one token per forward (plain greedy's path), the whole context in one
forward, and the last token with four drafted tokens in one forward (the lookup run's verification forward, its first
row read) — so a divergence is told apart: the model's own argmax moving with the forward's batch (llama.cpp's
kernels) or the lookup loop taking another token than its verification forward's argmax (llama-cpp-python's loop).
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
    ap.add_argument("--probe", action="store_true", help="at the first divergence, the logits three ways (see above)")
    args = ap.parse_args()
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    kw = {"n_ctx": 512, "n_threads": 1, "verbose": False, "seed": 0}
    if args.probe:
        probe(args.gguf, kw, args.tokens, args.prompts)
        return
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


def _greedy_tokens(llm, prompt: list[int], n: int) -> list[int]:
    out = []
    for tok in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
        out.append(int(tok))
        if len(out) == n or tok == llm.token_eos():
            break
    return out


def _row(llm, context: list[int], batches: list[list[int]], read: int) -> dict:
    """Evaluate ``context`` in the given ``batches`` (their concatenation is the context, maybe plus drafted tokens)
    and return the argmax and top-2 logits of absolute position ``read``."""
    import numpy as np

    llm.reset()
    for batch in batches:
        llm.eval(batch)
    logits = np.asarray(llm.scores[read], dtype=np.float64)
    top = np.argsort(-logits)[:2]
    return {"argmax": int(top[0]), "top2": [[int(t), round(float(logits[t]), 4)] for t in top]}


def _recording_evals(llm) -> list[dict]:
    """Wrap ``llm.eval`` to record every forward the lookup loop makes: its first position, its tokens and, per row,
    the argmax and top-2 logits it computed (the draft model makes llama-cpp-python keep every row's logits)."""
    import numpy as np

    records: list[dict] = []
    real = llm.eval

    def eval_and_record(batch):
        start = llm.n_tokens
        real(batch)
        rows = []
        for pos in range(start, start + len(batch)):
            logits = np.asarray(llm.scores[pos], dtype=np.float64)
            top = np.argsort(-logits)[:2]
            rows.append(
                {"pos": pos, "argmax": int(top[0]), "top2": [[int(t), round(float(logits[t]), 4)] for t in top]}
            )
        records.append({"start": start, "tokens": [int(t) for t in batch], "rows": rows})

    llm.eval = eval_and_record
    return records


def _replay(llm, records: list[dict], read: int) -> dict | None:
    """Evaluate the recorded forwards in order, each from its recorded first position (what the lookup loop's
    rollbacks did), up to the first that computes position ``read``; that row's argmax and top-2."""
    import numpy as np

    llm.reset()
    for r in records:
        llm.n_tokens = r["start"]  # eval drops the cache from here, as after a rejected draft
        llm.eval(r["tokens"])
        if r["start"] <= read < r["start"] + len(r["tokens"]):
            logits = np.asarray(llm.scores[read], dtype=np.float64)
            top = np.argsort(-logits)[:2]
            return {"argmax": int(top[0]), "top2": [[int(t), round(float(logits[t]), 4)] for t in top]}
    return None


def probe(gguf: str, kw: dict, tokens: int, prompts: list[str]) -> None:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    plain = Llama(gguf, logits_all=True, **kw)
    lookup = Llama(gguf, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4), **kw)
    records = _recording_evals(lookup)
    for label in prompts:
        prompt = plain.tokenize(PROMPTS[label].encode())
        a = _greedy_tokens(plain, prompt, tokens)
        records.clear()
        b = _greedy_tokens(lookup, prompt, tokens)
        d = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        row: dict = {"prompt": label, "first_divergence": d}
        if d is not None:
            context = prompt + a[:d]
            last = len(context) - 1
            drafted = b[d : d + 4]
            row["plain_token"], row["lookup_token"] = a[d], b[d]
            row["pieces"] = [
                plain.detokenize([a[d]]).decode(errors="replace"),
                plain.detokenize([b[d]]).decode(errors="replace"),
            ]
            row["one_token_per_forward"] = _row(plain, context, [prompt] + [[t] for t in a[:d]], last)
            row["context_in_one_forward"] = _row(plain, context, [context], last)
            head = [prompt] + [[t] for t in a[: d - 1]]
            row["last_token_plus_4_drafted"] = _row(plain, context, [*head, [a[d - 1], *drafted]], last)
            # What the lookup run's own forwards computed for that position, and in which batch.
            row["lookup_forwards_at_that_position"] = [
                {"start": r["start"], "tokens": r["tokens"], **x}
                for r in records
                for x in r["rows"]
                if x["pos"] == last
            ]
            # The plain model fed the lookup run's forwards as they came (same batches, same rollbacks): if it
            # computes the lookup run's logits, the divergence is the forward's batching, not the lookup loop.
            row["plain_model_fed_the_lookup_batches"] = _replay(plain, records, last)
        print(json.dumps(row, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
