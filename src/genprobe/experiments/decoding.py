"""Seed §3.1.2–3.1.4: seven decoding strategies on one prompt, greedy on three more, and why it is not the model.

Metrics are computed on the generated tokens only (the seed's 50, not prompt + 50), with
``<unk>`` kept as a token: decode() hides it, so the texts are given both ways.
"""

from __future__ import annotations

import torch

from ..corpus import CharTokenizer, Corpus, UNK_ID
from ..engine.generate import generate
from ..engine.sampling import SamplerConfig
from ..metrics import degeneracy_metrics
from ..model.gpt import GPT
from ..model.train import evaluate_loss, unigram_cross_entropy
from ._common import CASE_PROMPT, encode_prompt, quiet_encode, r

#: (name as in the seed's table, sampler) — sampling strategies all use the same fixed seed.
#: The seed's table gives 0% ``<unk>`` for every sampling row, which cannot happen by chance when
#: ~12–19% of training positions are ``<unk>``: its sampling rows ban ``<unk>``, and so do ours.
#: The same strategies WITHOUT the ban are reported too (``rows_sampling_with_unk``).
_BAN = (UNK_ID,)
SAMPLING: tuple[tuple[str, dict], ...] = (
    ("temperature 0.8", dict(temperature=0.8)),
    ("temperature 1.2", dict(temperature=1.2)),
    ("top-k 10", dict(top_k=10)),
    ("top-p 0.9", dict(top_p=0.9)),
    ("top-p 0.9 + temperature 1.2", dict(top_p=0.9, temperature=1.2)),
)
STRATEGIES: tuple[tuple[str, SamplerConfig], ...] = (
    ("greedy", SamplerConfig(greedy=True)),
    ("greedy + ban <unk>", SamplerConfig(greedy=True, ban_ids=_BAN)),
    *((name, SamplerConfig(ban_ids=_BAN, **kw)) for name, kw in SAMPLING),
)
OTHER_PROMPTS = ("床前明月光", "白日依山尽", "两个黄鹂鸣翠柳")
NEW_TOKENS = 50
#: One 50-token sample is one draw; the spread over a few seeds shows how much a row's metrics move.
SPREAD_SEEDS = (0, 1, 2, 3, 4)


def _metrics(tok: CharTokenizer, ids: list[int]) -> dict:
    m = degeneracy_metrics(ids, UNK_ID)
    return {
        "distinct_1": r(m["distinct_1"]),
        "distinct_2": r(m["distinct_2"]),
        "distinct_3": r(m["distinct_3"]),
        "longest_repeat": m["longest_repeat"] or None,
        "longest_repeat_text": tok.decode(m["longest_repeat_ngram"], show_unk=True) or None,
        "unk_share": r(m["unk_share"]),
        "seq_rep_4": r(m["seq_rep_4"]),
        "looping": m["looping"],
        "loop_period": m["loop_period"],
        "loop_onset": m["loop_onset"],
        "loop_unit": tok.decode(m["loop_unit"], show_unk=True) if m["looping"] else None,
    }


def decode_once(model: GPT, tok: CharTokenizer, prompt_ids: list[int], sampler: SamplerConfig,
                new_tokens: int = NEW_TOKENS, seed: int = 0) -> dict:
    """Generate ``new_tokens`` after ``prompt_ids`` and describe the result (texts + degeneration metrics)."""
    res = generate(model, [prompt_ids], new_tokens, sampler=sampler, seed=seed)
    ids = list(res.tokens[0])
    return {
        "text": tok.decode(prompt_ids + ids),
        "text_with_unk": tok.decode(prompt_ids + ids, show_unk=True),
        "new_ids": ids,
        **_metrics(tok, ids),
    }


def run_decoding(model: GPT, tok: CharTokenizer, corpus: Corpus | None = None, prompt: str = CASE_PROMPT,
                 new_tokens: int = NEW_TOKENS, seed: int = 0, tf_tokens: int | None = None,
                 spread_seeds: tuple[int, ...] = SPREAD_SEEDS) -> dict:
    """The ``decoding`` key of ``ch3_case.json`` (``tf_tokens`` caps the validation text scored, None = all)."""
    ids, unknown = encode_prompt(tok, prompt)
    rows = []
    for name, sampler in STRATEGIES:
        row = {"strategy": name, "sampler": sampler.to_dict(), "seed": seed,
               **decode_once(model, tok, ids, sampler, new_tokens, seed)}
        if not sampler.greedy:
            vals = [row["distinct_2"] if s == seed else decode_once(model, tok, ids, sampler, new_tokens, s)["distinct_2"]
                    for s in spread_seeds]
            row["distinct_2_over_seeds"] = {"seeds": list(spread_seeds), "values": vals,
                                            "mean": r(sum(vals) / len(vals)), "min": min(vals)}
        rows.append(row)
    with_unk = []
    for name, kw in SAMPLING:
        d = decode_once(model, tok, ids, SamplerConfig(**kw), new_tokens, seed)
        with_unk.append({"strategy": name, "seed": seed, **{k: v for k, v in d.items() if k != "new_ids"}})
    others = []
    keys = ("text", "text_with_unk", "distinct_2", "looping", "loop_unit", "loop_period", "longest_repeat",
            "longest_repeat_text")
    for p in OTHER_PROMPTS:
        pids, punk = encode_prompt(tok, p)
        g = decode_once(model, tok, pids, STRATEGIES[0][1], new_tokens, seed)
        b = decode_once(model, tok, pids, STRATEGIES[1][1], new_tokens, seed)
        others.append({"prompt": p, "prompt_unknown_chars": punk,
                       "greedy": {k: g[k] for k in keys}, "greedy_ban_unk": {k: b[k] for k in keys}})
    out = {
        "prompt": prompt,
        "prompt_ids": ids,
        "prompt_unknown_chars": unknown,
        "new_tokens": new_tokens,
        "rows": rows,
        "sampling_bans_unk": True,
        "rows_sampling_with_unk": with_unk,
        "greedy_text": rows[0]["text"],
        "greedy_ban_unk_text": rows[1]["text"],
        "other_prompts": others,
        # the seed's units are real characters, i.e. what greedy repeats once <unk> is out of the way
        "other_prompts_loop_units": {o["prompt"]: o["greedy_ban_unk"]["loop_unit"] or o["greedy_ban_unk"]["longest_repeat_text"]
                                     for o in others},
    }
    if corpus is not None:
        tr = torch.tensor(quiet_encode(tok, corpus.train), dtype=torch.long)
        va = torch.tensor(quiet_encode(tok, corpus.val), dtype=torch.long)
        scored = va if tf_tokens is None else va[: tf_tokens + 1]
        out["teacher_forcing"] = {"val_loss": r(evaluate_loss(model, scored)), "tokens": len(scored) - 1,
                                  "unigram_ce": r(unigram_cross_entropy(tr, va, tok.vocab_size))}
    return out
