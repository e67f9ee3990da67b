"""The chapter's claims judged on our numbers: the case study's ``ch3_case.json`` (:func:`case_claims`, in the report)
and any model's ``phenomena.json`` (:func:`phenomena_claims`, docs/three-models.md, beside the numbers table that
:func:`markdown_table` writes). Each check returns whether it holds and the numbers behind it, so a claim that fails
on a model is reported with its evidence instead of being hidden."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Callable, Mapping

HEADLINE_TAU = 2.0  # the order trap's headline temperature
TAIL_SHARE = 0.2  # a shadow's tail "near zero": mean tail at most this share of the mean peak


@dataclass(frozen=True)
class Claim:
    """One of the chapter's claims, whether it holds on our numbers, and those numbers."""

    claim: str
    holds: bool
    evidence: str


def _diversity_claims(greedy: float, sampled: dict[str, float]) -> list[Claim]:
    """§3.3 / §3.5: greedy distinct-2 against every sampling strategy's (name -> distinct-2)."""
    low = min(sampled.values())
    return [
        Claim(
            "§3.3 greedy distinct-2 is well below (< half of) every sampling strategy's",
            greedy < 0.5 * low,
            f"greedy {greedy} vs lowest sampled {low}",
        ),
        Claim(
            "§3.5 every sampling strategy has distinct-2 >= 0.9",
            low >= 0.9,
            ", ".join(f"{name} {d2}" for name, d2 in sampled.items()),
        ),
    ]


def _entropy_claim(entropies: list[float], log_vocab: float) -> Claim:
    """Entropy rises with τ (two ~0 entropies at a tiny τ may tie) and stays <= ln V."""
    rising = all(b > a for a, b in pairwise(entropies) if a > 1e-6 or b > 1e-6)
    ok = rising and max(entropies) <= log_vocab + 1e-9
    return Claim("§3.5 entropy rises with τ and stays <= ln V", ok, f"entropies {entropies}, ln V = {log_vocab}")


def _order_claim(trap: list[dict]) -> Claim:
    """§3.5.5: truncating before the temperature keeps a kept set that does not depend on τ."""
    first = [x["trunc_then_temp"] for x in trap]
    ev = f"kept {first} for τ {[x['tau'] for x in trap]}"
    return Claim("§3.5.5 top-p then temperature: the kept set does not depend on τ", len(set(first)) == 1, ev)


def _compute_claim(timing: dict) -> Claim:
    """§3.10 at the first batch size: the cache saves far more compute than wall-clock time."""
    t1 = timing["rows"][0]
    return Claim(
        "§3.10 the cache saves far more compute than time (compute ratio > 2x the wall-clock speed-up)",
        t1["compute_ratio"] > 2 * t1["speedup"],
        f"batch {t1['batch']}: compute {t1['compute_ratio']}x, wall clock {t1['speedup']}x",
    )


def case_claims(case: dict) -> list[Claim]:
    """Evaluate every finding whose data is present in ``case``: decoding, sampling, then the cache (exact, the
    mutants caught, no_mask hidden at one token a step, compute ≠ time)."""
    out: list[Claim] = []
    if d := case.get("decoding"):  # greedy loops, sampling does not; banning <unk> only moves the loop
        g, b = d["rows"][0], d["rows"][1]
        sampled = {r["strategy"]: r["distinct_2"] for r in d["rows"] if not r["sampler"]["greedy"]}
        ban_repeats = b["looping"] or (b["longest_repeat"] or 0) >= 3
        ban_loop = f"period {b['loop_period']}" if b["looping"] else "none within 50 tokens"
        out += [
            Claim(
                "§3.3 greedy decoding loops (a repeated unit)",
                g["looping"],
                f"period {g['loop_period']}, onset {g['loop_onset']}, distinct-2 {g['distinct_2']}",
            ),
            Claim(
                "banning <unk> changes the loop unit but output still repeats",
                b["loop_unit"] != g["loop_unit"] and ban_repeats and b["distinct_2"] < 0.9,
                f"exact loop: {ban_loop}; longest n-gram seen ≥3×: {b['longest_repeat']} ({b['longest_repeat_text']}); "
                f"distinct-2 {b['distinct_2']}",
            ),
            *_diversity_claims(g["distinct_2"], sampled),
        ]
    if s := case.get("sampling"):  # entropy grows with τ, the kept set with p; truncating first freezes the kept set
        kept = [r["kept"] for r in s["nucleus_curve_tau_1"]]
        trap = s["order_trap_top_p_0_9"]
        bb = [r["temp_then_trunc"] for r in trap]
        at1 = [r for r in trap if r["tau"] == 1.0]
        out += [
            _entropy_claim([r["entropy"] for r in s["entropy_vs_temperature"]], s["log_vocab"]),
            Claim(
                "kept-set size grows with p",
                all(b_ >= a_ for a_, b_ in pairwise(kept)) and kept[-1] > kept[0],
                f"kept {kept} for p {[r['p'] for r in s['nucleus_curve_tau_1']]}",
            ),
            _order_claim(trap),
            Claim(
                "temp_then_trunc: kept set grows with τ, equal to trunc_then_temp at τ = 1",
                all(y >= x for x, y in pairwise(bb))
                and bb[-1] > bb[0]
                and all(r["trunc_then_temp"] == r["temp_then_trunc"] for r in at1),
                f"{bb} for τ {[r['tau'] for r in trap]}",
            ),
        ]
    if c := case.get("cache_exact"):
        exact = c["prefill_max_abs_dlogit"] == 0.0 and c["incremental_max_abs_dlogit"] < 1e-4
        ev = f"prefill {c['prefill_max_abs_dlogit']}, incremental {c['incremental_max_abs_dlogit']:.2e}"
        out.append(Claim("KV cache: prefill Δ = 0.0, incremental < 1e-4", exact, ev))
    if bugs := case.get("cache_bugs"):
        claim = "the harness flags pos_zero, no_cat, no_mask, kv_mismatch and passes cat_order"
        ev = ", ".join(f"{r['impl']}: {r['verdict']}" for r in bugs)
        out.append(Claim(claim, all(r.get("as_expected", False) for r in bugs), ev))
    if m := case.get("mask_noop"):
        chunk = next((v for k, v in m.items() if k.startswith("no_mask_chunk")), None)
        chunk_txt = "none measured" if chunk is None else f"{chunk:.3g}"
        hidden = m.get("no_mask_t_new_1") == 0.0 and (chunk or 0) > 1e-3
        ev = f"T_new=1: {m.get('no_mask_t_new_1')}, chunks: {chunk_txt}"
        out.append(Claim("no_mask is invisible at T_new = 1 and visible in chunks", hidden, ev))
    if t := case.get("cache_timing"):
        out.append(_compute_claim(t))
    return out


def _row(d: dict, strategy: str) -> dict:
    return next(x for x in d["diversity"] if x["strategy"] == strategy)


def _reading(d: dict, mode: str) -> dict:
    return next(x for x in d["free_running"]["readings"] if x["mode"] == mode)


def _trap(d: dict, tau: float) -> dict:
    return next(x for x in d["distribution"]["order_trap"] if x["tau"] == tau)


def _entropy(d: dict, tau: float) -> dict:
    return next(x for x in d["distribution"]["entropy_vs_temperature"] if x["tau"] == tau)


def phenomena_claims(d: dict) -> list[Claim]:
    """The chapter's claims about the measured phenomena, judged on one model's ``phenomena.json``: decoding, then
    §3.7 (the model on its own tokens, one wrong token's shadow, loops as fixed points) and the cache's compute."""
    tf, free = _reading(d, "teacher forcing"), _reading(d, "free running, τ = 1")
    sh, dv = d["shadow"], d["divergence"]
    free_running = [
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
    return _decoding_claims(d) + free_running + ([_compute_claim(d["timing"])] if d.get("timing") else [])


def _decoding_claims(d: dict) -> list[Claim]:
    """§3.3 and §3.5: greedy decoding loops, sampling does not, and what temperature and top-p do."""
    g = _row(d, "greedy")
    sampled = {x["strategy"]: x["distinct_2"] for x in d["diversity"] if x["strategy"] != "greedy"}
    hot = _trap(d, HEADLINE_TAU)
    return [
        Claim(
            "§3.3 greedy decoding loops (exact loop, near loop or repetitive tail in at least half the continuations)",
            g["degenerate_share"] >= 0.5,
            f"greedy degenerate share {g['degenerate_share']} (exact loops {g['loop_share']})",
        ),
        *_diversity_claims(g["distinct_2"], sampled),
        _entropy_claim(
            [x["entropy"] for x in d["distribution"]["entropy_vs_temperature"]], d["distribution"]["log_vocab"]
        ),
        _order_claim(d["distribution"]["order_trap"]),
        Claim(
            f"§3.5.5 temperature then top-p lets several times (>= 2x) more tokens in at τ = {HEADLINE_TAU:g}",
            hot["temp_then_trunc"] >= 2 * hot["trunc_then_temp"],
            f"median kept {hot['temp_then_trunc']} vs {hot['trunc_then_temp']}",
        ),
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


def summary_lines(d: dict) -> list[str]:
    """What ``genprobe phenomena`` prints: the numbers of one model, then each claim with its verdict."""
    lines = [f"{label}: {get(d)}" for label, get in ROWS]
    lines.append("")
    lines += [f"[{'holds' if c.holds else 'fails'}] {c.claim} ({c.evidence})" for c in phenomena_claims(d)]
    return lines
