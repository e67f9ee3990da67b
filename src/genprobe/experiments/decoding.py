"""The chapter's opening experiment: seven decoding strategies on one prompt, greedy on three more prompts, and the
check that rules out "the model is not trained" (validation loss against the unigram baseline). Metrics are over the
generated tokens only (the chapter's 50), ``<unk>`` kept as a token: decode() hides it, so texts come both ways."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..corpus.tang import Corpus
from ..corpus.tokenizer import UNK_ID, CharTokenizer
from ..engine.generate import generate
from ..engine.samplers.stages import SamplerConfig
from ..metrics.degeneracy import degeneracy_metrics
from ..model.gpt import GPT
from ..model.train import evaluate_loss, unigram_cross_entropy
from ._common import CASE_PROMPT, Rounded, r

#: (name as in the chapter's table, sampler) — sampling strategies all use the same fixed seed.
#: The chapter's table gives 0% ``<unk>`` for every sampling row, which cannot happen by chance when
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
NEW_TOKENS = 50  # generated after each prompt (the chapter's 50; the case study's decode steps)
#: One 50-token sample is one draw; the spread over a few seeds shows how much a row's metrics move.
SPREAD_SEEDS = (0, 1, 2, 3, 4)


#: What the other-prompt rows report of each generation.
OTHER_PROMPT_KEYS = tuple(
    "text text_with_unk distinct_2 looping loop_unit loop_period longest_repeat longest_repeat_text".split()
)


@dataclass(frozen=True)
class Decoded:
    """One generation after a prompt: its texts, the new token ids and their degeneration metrics."""

    text: str
    text_with_unk: str
    new_ids: list[int]
    metrics: dict  # the keys of _metrics(): distinct-n, longest repeat, <unk> share, loop fields

    def to_dict(self, keys: tuple[str, ...] | None = None) -> dict:
        """JSON form; ``keys`` keeps only those fields."""
        d = {"text": self.text, "text_with_unk": self.text_with_unk, "new_ids": self.new_ids, **self.metrics}
        return d if keys is None else {k: d[k] for k in keys}


def _metrics(tok: CharTokenizer, ids: list[int]) -> dict:
    m = degeneracy_metrics(ids, UNK_ID)
    distinct = {f"distinct_{n}": r(m[f"distinct_{n}"]) for n in (1, 2, 3)}
    return distinct | {
        "longest_repeat": m["longest_repeat"] or None,
        "longest_repeat_text": tok.decode(m["longest_repeat_ngram"], show_unk=True) or None,
        "unk_share": r(m["unk_share"]),
        "seq_rep_4": r(m["seq_rep_4"]),
        **{k: m[k] for k in ("looping", "loop_period", "loop_onset")},
        "loop_unit": tok.decode(m["loop_unit"], show_unk=True) if m["looping"] else None,
    }


@dataclass(frozen=True)
class StrategyRow:
    """One decoding strategy on the case prompt (sampled rows: with distinct-2 over a few seeds)."""

    strategy: str
    sampler: SamplerConfig
    seed: int
    decoded: Decoded
    spread: dict[int, float] | None = None  # seed -> distinct-2, sampled strategies only

    def to_dict(self) -> dict:
        """JSON form: the strategy, its sampler and seed, the generation's fields (and distinct-2 over the seeds)."""
        d = {"strategy": self.strategy, "sampler": self.sampler, "seed": self.seed, **self.decoded.to_dict()}
        if self.spread is not None:
            vals = list(self.spread.values())
            mean = r(sum(vals) / len(vals))
            d["distinct_2_over_seeds"] = {"seeds": list(self.spread), "values": vals, "mean": mean, "min": min(vals)}
        return d


@dataclass(frozen=True)
class OtherPrompt:
    """Greedy, with and without ``<unk>`` banned, on one more prompt."""

    prompt: str
    prompt_unknown_chars: list[str]
    greedy: Decoded
    greedy_ban_unk: Decoded

    def to_dict(self) -> dict:
        """JSON form."""
        return {
            "prompt": self.prompt,
            "prompt_unknown_chars": self.prompt_unknown_chars,
            "greedy": self.greedy.to_dict(OTHER_PROMPT_KEYS),
            "greedy_ban_unk": self.greedy_ban_unk.to_dict(OTHER_PROMPT_KEYS),
        }


@dataclass(frozen=True)
class TeacherForcingCheck(Rounded):
    """Suspect one, "the model is not trained": validation loss beside the unigram baseline."""

    val_loss: float
    tokens: int
    unigram_ce: float


@dataclass(frozen=True)
class DecodingResult:
    """The ``decoding`` key: seven strategies on the case prompt, sampling without the ``<unk>`` ban, other prompts."""

    prompt: str
    prompt_ids: list[int]
    prompt_unknown_chars: list[str]
    new_tokens: int
    rows: list[StrategyRow]
    rows_sampling_with_unk: list[StrategyRow]
    other_prompts: list[OtherPrompt]
    teacher_forcing: TeacherForcingCheck

    def to_dict(self) -> dict:
        """JSON form (the ``decoding`` key of ``ch3_case.json``)."""
        unk = [{"strategy": u.strategy, "seed": u.seed, **u.decoded.to_dict()} for u in self.rows_sampling_with_unk]
        return {
            "prompt": self.prompt,
            "prompt_ids": self.prompt_ids,
            "prompt_unknown_chars": self.prompt_unknown_chars,
            "new_tokens": self.new_tokens,
            "rows": self.rows,
            "sampling_bans_unk": True,
            "rows_sampling_with_unk": [{k: v for k, v in d.items() if k != "new_ids"} for d in unk],
            "greedy_text": self.rows[0].decoded.text,
            "greedy_ban_unk_text": self.rows[1].decoded.text,
            "other_prompts": self.other_prompts,
            # what greedy repeats once <unk> is out of the way (the chapter's units are real characters)
            "other_prompts_loop_units": {
                o.prompt: (b := o.greedy_ban_unk.metrics)["loop_unit"] or b["longest_repeat_text"]
                for o in self.other_prompts
            },
            "teacher_forcing": self.teacher_forcing,
        }


def run_decoding(
    model: GPT,
    tok: CharTokenizer,
    corpus: Corpus,
    seed: int = 0,
    tf_tokens: int | None = None,
    spread_seeds: tuple[int, ...] = SPREAD_SEEDS,
) -> DecodingResult:
    """Every strategy on the case prompt (a sampled one also at every seed of ``spread_seeds``, distinct-2 only),
    sampling without the ban, greedy with and without the ban on other prompts, the teacher-forcing check (validation
    loss of the first ``tf_tokens`` tokens, None = all)."""

    def decode(ids: list[int], sampler: SamplerConfig, at: int = seed) -> Decoded:
        new = list(generate(model, [ids], NEW_TOKENS, sampler=sampler, seed=at).tokens[0])
        return Decoded(tok.decode(ids + new), tok.decode(ids + new, show_unk=True), new, _metrics(tok, new))

    def strategy(name: str, sampler: SamplerConfig) -> StrategyRow:
        row = decode(ids, sampler)
        if sampler.greedy:
            return StrategyRow(name, sampler, seed, row)
        spread = {s: (row if s == seed else decode(ids, sampler, s)).metrics["distinct_2"] for s in spread_seeds}
        return StrategyRow(name, sampler, seed, row, spread)

    def other(text: str) -> OtherPrompt:
        p = tok.encode_with_report(text)
        return OtherPrompt(text, p.unknown_chars, decode(p.ids, STRATEGIES[0][1]), decode(p.ids, STRATEGIES[1][1]))

    prompt = tok.encode_with_report(CASE_PROMPT)
    ids, unknown = prompt.ids, prompt.unknown_chars
    rows = [strategy(name, sampler) for name, sampler in STRATEGIES]
    unbanned = [(name, SamplerConfig(**kw)) for name, kw in SAMPLING]
    with_unk = [StrategyRow(name, sampler, seed, decode(ids, sampler)) for name, sampler in unbanned]
    others = [other(p) for p in OTHER_PROMPTS]
    tr = torch.tensor(tok.encode(corpus.train, warn=False), dtype=torch.long)
    va = torch.tensor(tok.encode(corpus.val, warn=False), dtype=torch.long)
    scored = va if tf_tokens is None else va[: tf_tokens + 1]
    tf = TeacherForcingCheck(
        evaluate_loss(model, scored), len(scored) - 1, unigram_cross_entropy(tr, va, tok.vocab_size)
    )
    return DecodingResult(CASE_PROMPT, ids, unknown, NEW_TOKENS, rows, with_unk, others, tf)
