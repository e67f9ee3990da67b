"""Several models' ``phenomena.json`` side by side: one Markdown table of the numbers, one of the chapter's claims.

Everything here reads the ``to_dict()`` form of :class:`genprobe.experiments.phenomena.PhenomenaResult`, so a
table can be rebuilt from the files of earlier runs. A claim is judged with
:class:`~genprobe.report.claims.Claim`: whether it holds on that model's numbers, and the numbers.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..report.claims import Claim, entropy_rises

HEADLINE_TAU = 2.0  # the order trap's headline temperature
TAIL_SHARE = 0.2  # a shadow's tail "near zero": mean tail at most this share of the mean peak


def _row(d: dict, strategy: str) -> dict:
    return next(x for x in d["diversity"] if x["strategy"] == strategy)


def _reading(d: dict, mode: str) -> dict:
    return next(x for x in d["free_running"]["readings"] if x["mode"] == mode)


def _trap(d: dict, tau: float) -> dict:
    return next(x for x in d["distribution"]["order_trap"] if x["tau"] == tau)


def _entropy(d: dict, tau: float) -> dict:
    return next(x for x in d["distribution"]["entropy_vs_temperature"] if x["tau"] == tau)


def claims(d: dict) -> list[Claim]:
    """The chapter's claims about the measured phenomena, judged on one model's ``phenomena.json``."""
    return _decoding_claims(d) + _free_running_claims(d) + _timing_claims(d)


def _decoding_claims(d: dict) -> list[Claim]:
    """§3.3 and §3.5: greedy decoding loops, sampling does not, and what temperature and top-p do."""
    g = _row(d, "greedy")
    sampled = [x for x in d["diversity"] if x["strategy"] != "greedy"]
    low = min(x["distinct_2"] for x in sampled)
    ent = [x["entropy"] for x in d["distribution"]["entropy_vs_temperature"]]
    trap = d["distribution"]["order_trap"]
    first = [x["trunc_then_temp"] for x in trap]
    hot = _trap(d, HEADLINE_TAU)
    return [
        Claim(
            "§3.3 greedy decoding loops (exact loop, near loop or repetitive tail in at least half the continuations)",
            g["degenerate_share"] >= 0.5,
            f"greedy degenerate share {g['degenerate_share']} (exact loops {g['loop_share']})",
        ),
        Claim(
            "§3.3 greedy distinct-2 is well below (< half of) every sampling strategy's",
            g["distinct_2"] < 0.5 * low,
            f"greedy {g['distinct_2']} vs lowest sampled {low}",
        ),
        Claim(
            "§3.5 every sampling strategy has distinct-2 >= 0.9",
            low >= 0.9,
            ", ".join(f"{x['strategy']} {x['distinct_2']}" for x in sampled),
        ),
        Claim(
            "§3.5 entropy rises with τ and stays <= ln V",
            entropy_rises(ent, d["distribution"]["log_vocab"]),
            f"mean entropies {ent}, ln V = {d['distribution']['log_vocab']}",
        ),
        Claim(
            "§3.5.5 top-p then temperature: the kept set does not depend on τ",
            len(set(first)) == 1,
            f"median kept {first} for τ {[x['tau'] for x in trap]}",
        ),
        Claim(
            f"§3.5.5 temperature then top-p lets several times (>= 2x) more tokens in at τ = {HEADLINE_TAU:g}",
            hot["temp_then_trunc"] >= 2 * hot["trunc_then_temp"],
            f"median kept {hot['temp_then_trunc']} vs {hot['trunc_then_temp']}",
        ),
    ]


def _free_running_claims(d: dict) -> list[Claim]:
    """§3.7: the model on its own tokens, one wrong token's shadow, and loops as fixed points."""
    tf, free = _reading(d, "teacher forcing"), _reading(d, "free running, τ = 1")
    sh, dv = d["shadow"], d["divergence"]
    return [
        Claim(
            "§3.7.3 the model is surer (lower NLL) of its own τ = 1 tokens than of its argmax on real text",
            free["own_nll"] < tf["own_nll"],
            f"own-token NLL free running {free['own_nll']} vs argmax on real text {tf['own_nll']}",
        ),
        Claim(
            "§3.7.2 one wrong token's shadow is short: median half-life <= 3 steps, tail near zero",
            (sh["median_half_life_steps"] or 99) <= 3 and sh["mean_tail"] <= TAIL_SHARE * sh["mean_peak"],
            f"half-life {sh['median_half_life_steps']}, peak {sh['mean_peak']}, tail {sh['mean_tail']}",
        ),
        Claim(
            "§3.7.2 a loop is a stable fixed point: greedy continuations of a prefix with one token changed agree "
            "again at the end (>= half the positions of the last quarter)",
            dv["tail_agreement"] >= 0.5,
            f"tail agreement {dv['tail_agreement']}, never diverged {dv['never_diverged']}",
        ),
    ]


def _timing_claims(d: dict) -> list[Claim]:
    """§3.10, when the run was timed: the cache saves far more compute than wall-clock time."""
    if not d.get("timing"):
        return []
    t1 = d["timing"]["rows"][0]
    return [
        Claim(
            "§3.10 the cache saves far more compute than time (compute ratio > 2x the wall-clock speed-up)",
            t1["compute_ratio"] > 2 * t1["speedup"],
            f"batch {t1['batch']}: compute {t1['compute_ratio']}x, wall clock {t1['speedup']}x",
        )
    ]


#: (label, getter) rows of the numbers table.
ROWS: list[tuple[str, Callable[[dict], Any]]] = [
    ("parameters", lambda d: f"{d['model']['parameters']:,}"),
    ("tokenizer (vocab)", lambda d: f"{d['model']['tokenizer']['kind']} ({d['model']['vocab_size']:,})"),
    ("inputs", lambda d: f"{d['inputs'].get('corpus', 'files')}: {d['inputs']['prompts']} prompts, "
     f"{d['inputs']['texts']} texts"),
    ("new tokens / prefix + continuation", lambda d: f"{d['new_tokens']} / {d['config']['prefix_tokens']} + "
     f"{d['continuation_tokens']}"),
    ("greedy distinct-2", lambda d: _row(d, "greedy")["distinct_2"]),
    ("greedy exact-loop share", lambda d: _row(d, "greedy")["loop_share"]),
    ("greedy degenerate share", lambda d: _row(d, "greedy")["degenerate_share"]),
    ("τ 0.8 distinct-2 / loop share", lambda d: _pair(_row(d, "temperature 0.8"), "distinct_2", "loop_share")),
    ("top-p 0.9 distinct-2 / loop share", lambda d: _pair(_row(d, "top-p 0.9"), "distinct_2", "loop_share")),
    ("entropy τ = 0.5 / 1 / 2 (nats)", lambda d: " / ".join(str(_entropy(d, t)["entropy"]) for t in (0.5, 1.0, 2.0))),
    ("ln V", lambda d: d["distribution"]["log_vocab"]),
    ("max prob at τ = 1", lambda d: _entropy(d, 1.0)["max_prob"]),
    ("kept, top-p 0.9, τ = 2: top-p first / τ first", lambda d: _pair(_trap(d, 2.0), "trunc_then_temp",
     "temp_then_trunc")),
    ("kept, top-p 0.9, τ = 0.5: top-p first / τ first", lambda d: _pair(_trap(d, 0.5), "trunc_then_temp",
     "temp_then_trunc")),
    ("TF: NLL of truth / accuracy", lambda d: _pair(_reading(d, "teacher forcing"), "truth_nll", "accuracy")),
    ("free greedy: NLL of truth / accuracy", lambda d: _pair(_reading(d, "free running, greedy"), "truth_nll",
     "accuracy")),
    ("free τ = 1: NLL of truth / accuracy", lambda d: _pair(_reading(d, "free running, τ = 1"), "truth_nll",
     "accuracy")),
    ("own-token NLL: TF argmax / greedy / τ = 1", lambda d: " / ".join(
        str(_reading(d, m)["own_nll"]) for m in ("teacher forcing", "free running, greedy", "free running, τ = 1"))),
    ("shadow: next Δloss / peak / tail", lambda d: " / ".join(
        str(d["shadow"][k]) for k in ("mean_next_dloss", "mean_peak", "mean_tail"))),
    ("shadow: median half-life (steps)", lambda d: d["shadow"]["median_half_life_steps"]),
    ("one token changed: never diverged / median first step", lambda d: _pair(d["divergence"], "never_diverged",
     "median_first_divergence")),
    ("one token changed: agreement in the last quarter", lambda d: d["divergence"]["tail_agreement"]),
    ("naive / cached, batch 1: compute ratio / speed-up", lambda d: _timing(d, 0)),
    ("naive / cached, last batch: compute ratio / speed-up", lambda d: _timing(d, -1)),
    ("naive = cached tokens (rows)", lambda d: "–" if not d.get("timing") else
     f"{d['timing']['tokens_match']['identical']}/{d['timing']['tokens_match']['rows']}"),
]  # fmt: skip


def _pair(x: dict, a: str, b: str) -> str:
    return f"{x[a]} / {x[b]}"


def _timing(d: dict, i: int) -> str:
    if not d.get("timing"):
        return "–"
    t = d["timing"]["rows"][i]
    return f"b{t['batch']}: {t['compute_ratio']}x / {t['speedup']}x"


def _md(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def markdown_table(results: Mapping[str, dict]) -> str:
    """The numbers of each model (``name -> phenomena.json`` data) as one Markdown table, a column per model."""
    names = list(results)
    lines = [_md(["", *names]), _md(["---"] * (len(names) + 1))]
    lines += [_md([label, *(get(results[n]) for n in names)]) for label, get in ROWS]
    return "\n".join(lines)


def claims_table(results: Mapping[str, dict]) -> str:
    """Each claim, holds or not per model, as a Markdown table (the evidence in the cell)."""
    names = list(results)
    judged = {n: claims(results[n]) for n in names}
    first = judged[names[0]]
    lines = [_md(["claim", *names]), _md(["---"] * (len(names) + 1))]
    for i, c in enumerate(first):
        cells = [f"{'holds' if judged[n][i].holds else 'fails'}: {judged[n][i].evidence}" for n in names]
        lines.append(_md([c.claim, *cells]))
    return "\n".join(lines)


def summary_lines(d: dict) -> list[str]:
    """What ``genprobe phenomena`` prints: the numbers of one model, then each claim with its verdict."""
    lines = [f"{label}: {get(d)}" for label, get in ROWS]
    lines.append("")
    lines += [f"[{'holds' if c.holds else 'fails'}] {c.claim} ({c.evidence})" for c in claims(d)]
    return lines
