"""The sampler stages, one class per sampler (in the spirit of transformers' ``logits_process.py``), and the
:class:`SamplerConfig` that holds their fields.

A stage holds everything about one sampler: the config fields it owns (:class:`Param`: the limit validation
names, what "off" is, the CLI flag's help), the checks across fields, its logits transform under each engine's
arithmetic (``genprobe``, ``hf``, ``vllm`` on (B, V) tensors; ``llama.cpp`` on its float32 candidate array) and
its form in vLLM's ``SamplingParams`` and in llama.cpp's sampler chain, or the refusal naming it. Adding a sampler
is a class here and its fields in :class:`SamplerConfig`, plus its tests; the chain, the CLI and both mappings
pick it up from :data:`STAGES` and :data:`ORDERS`. :class:`Adjustment` and :class:`Truncation` are the two kinds
(:mod:`.chain` says where each runs). The ``hf`` and ``vllm`` arithmetic repeats those engines' tensor operations in
the same order and dtype, so ties and exactly-hit thresholds fall the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch

from ..._io import json_safe
from .llama_cpp import F32, Candidates, breaker_table, dry_penalties, logf, std_sort_equivalent

NEG_INF = float("-inf")
LLAMA_CPP_PENALTY_LAST_N = 64  # common/common.h: penalty_last_n
VLLM_MIN_TEMPERATURE = 0.01  # vllm/sampling_params.py: _MAX_TEMP
# A float64 mass within this of p counts as reaching it: rounding must not add a token when the
# mass hits p exactly (ten equal logits, p = 0.8: 0.1 summed eight times is 0.7999999999999999).
TOP_P_TOLERANCE = 1e-12


class UnsupportedSamplerError(ValueError):
    """A sampler setting an engine (vLLM, llama.cpp) cannot express exactly (named in the message)."""


@dataclass(frozen=True)
class ChainStage:
    """One sampler of llama.cpp's chain: its init function (without ``llama_sampler_init_``) and its arguments."""

    name: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class ChainEnv:
    """What llama.cpp's chain needs beyond the config: the context length (genprobe's ``-1`` windows), the seed,
    the DRY breaker strings."""

    context_length: int
    seed: int
    breakers: tuple[str, ...]


@dataclass(frozen=True)
class Param:
    """A numeric :class:`SamplerConfig` field: its limit as errors say it (``"in (0, 1]"``, ``">= 1"``,
    ``"an integer >= 0"``, ``"a finite number"``), what "off" is (a note naming None accepts None), and the help
    of its CLI flag ``--name-with-dashes``."""

    name: str
    limit: str
    note: str
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @cached_property
    def integer(self) -> bool:
        return self.limit.startswith("an integer")

    def check(self, v: Any) -> None:
        """Raise ValueError naming the field and its limit unless ``v`` is a valid value."""
        if v is None and "None" in self.note:
            return
        number = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
        if number and (not self.integer or int(v) == v) and _within(float(v), self.limit):
            return
        raise ValueError(f"{self.name} must be {self.limit} ({self.note}), got {v!r}")


def _within(v: float, limit: str) -> bool:
    spec = limit.removeprefix("an integer ").removeprefix("in ")
    if spec[0] in "([":
        lo, hi = (float(x) for x in spec[1:-1].split(","))
        return (lo < v if spec[0] == "(" else lo <= v) and (v < hi if spec[-1] == ")" else v <= hi)
    if spec[0] in "<>":
        op, bound = spec.split()
        return v > float(bound) if op == ">" else v >= float(bound)
    return True  # a finite number


class Stage:
    """One sampler. Subclasses set ``name``, ``what`` (how a refusal names it) and ``params``; by default the first
    parameter is its switch, whose value ``off`` leaves the logits alone."""

    name: ClassVar[str]
    what: ClassVar[str]
    params: ClassVar[tuple[Param, ...]] = ()
    off: ClassVar[float] = 0.0
    other_fields: ClassVar[tuple[str, ...]] = ()  # non-numeric fields it owns (no Param)
    #: True where every engine computes it the same way (bans, n-gram bans): any ``engine`` may map it.
    exact_anywhere: ClassVar[bool] = False

    def value(self, c: SamplerConfig) -> float:
        """The switch parameter, ``off`` for None (the form vLLM and llama.cpp take)."""
        v = getattr(c, self.params[0].name)
        v = self.off if v is None else v
        return int(v) if self.params[0].integer else float(v)

    def active(self, c: SamplerConfig) -> bool:
        """True when this stage can change the outcome under ``c``."""
        return self.value(c) != self.off

    def check(self, c: SamplerConfig) -> None:
        """Checks across fields (each field's own range is its :class:`Param`'s)."""

    def vllm(self, c: SamplerConfig, vocab: int) -> dict[str, Any]:
        """vLLM ``SamplingParams`` keywords; by default vLLM has no such sampler: refused while active."""
        if self.active(c):
            raise UnsupportedSamplerError(
                f"{self.what} has no vLLM equivalent; scan with genprobe's own engine or turn it off"
            )
        return {}

    def llama_cpp(self, c: SamplerConfig, env: ChainEnv) -> ChainStage | None:
        """llama.cpp's sampler for this stage; by default it has none: refused while active."""
        if self.active(c):
            raise UnsupportedSamplerError(f"{self.what}: llama.cpp has no such sampler")
        return None

    def __repr__(self) -> str:
        return self.name


def _window(n: int | None, default: int, context_length: int) -> int:
    """genprobe's window (None = the engine default, -1 = everything) as llama.cpp's non-negative last_n."""
    if n is None:
        return default
    return context_length if n < 0 else n


# ---- adjustments: read the history, run first (greedy too) ----------------------------------------------
class Adjustment(Stage):
    def adjust(self, z: torch.Tensor, history: torch.Tensor, c: SamplerConfig, prompt_len: int) -> torch.Tensor:
        """``z`` (B, V) adjusted (out of place); ``history`` (B, t) with entries < 0 as padding."""
        raise NotImplementedError


class Bans(Adjustment):
    name, what, exact_anywhere = "bans", "ban_ids", True
    other_fields = ("ban_ids",)

    def active(self, c: SamplerConfig) -> bool:
        return bool(c.ban_ids)

    def check(self, c: SamplerConfig) -> None:
        if any(i < 0 for i in c.ban_ids):
            raise ValueError(f"ban_ids must be token ids >= 0, got {list(c.ban_ids)}")

    @staticmethod
    def check_vocab(c: SamplerConfig, vocab: int, error: type[ValueError] = ValueError) -> None:
        """Raise ``error`` when a banned id is outside the vocabulary or every id is banned."""
        bad = sorted(i for i in set(c.ban_ids) if i >= vocab)
        if bad:
            raise error(f"ban_ids {bad} are outside the vocabulary of {vocab}")
        if len(set(c.ban_ids)) >= vocab:
            raise error(f"ban_ids ban all {vocab} tokens: nothing left to generate")

    def adjust(self, z: torch.Tensor, history: torch.Tensor, c: SamplerConfig, prompt_len: int) -> torch.Tensor:
        self.check_vocab(c, z.shape[1])
        out = z.clone()
        out[:, list(c.ban_ids)] = NEG_INF
        return out

    def vllm(self, c: SamplerConfig, vocab: int) -> dict[str, Any]:
        """An exact whitelist: vLLM's ``logit_bias`` is clamped to ±100, which is not a ban."""
        if not c.ban_ids:
            return {}
        self.check_vocab(c, vocab, UnsupportedSamplerError)
        return {"allowed_token_ids": [i for i in range(vocab) if i not in set(c.ban_ids)]}

    def llama_cpp(self, c: SamplerConfig, env: ChainEnv) -> ChainStage | None:
        """``-INFINITY`` logit biases, first (as common does with suppressed tokens)."""
        return ChainStage("logit_bias", (tuple(sorted(set(c.ban_ids))),)) if c.ban_ids else None


def history_counts(history: torch.Tensor, V: int) -> torch.Tensor:
    """(B, V) float counts of each token in ``history``; entries < 0 (padding) are ignored."""
    idx = torch.where(history >= 0, history, torch.full_like(history, V))
    counts = torch.zeros(history.shape[0], V + 1, dtype=torch.float32, device=history.device)
    counts.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float32))
    return counts[:, :V]


class Penalties(Adjustment):
    """Repetition, presence and frequency penalties with the engine's scope and arithmetic (history entries < 0
    are left padding and never count):

    =============  =========================================  =====================================
    engine         repetition penalty                         presence / frequency penalties
    =============  =========================================  =====================================
    ``genprobe``   prompt + output (or the last ``n``); HF's  output tokens only (OpenAI/vLLM); a
                   ``x/p`` / ``x·p`` arithmetic               window keeps only the last ``n``
    ``hf``         prompt + output: ``where(x<0, x·p, x/p)``  not in transformers: OpenAI definition
                   (RepetitionPenaltyLogitsProcessor)         (output tokens only)
    ``vllm``       prompt ∪ output: ``x · where(x>0, 1/p,     output tokens only:
                   p)`` (_custom_ops.apply_repetition_...)    ``x -= f·count + r·1[count>0]``
    ``llama.cpp``  the last ``penalty_last_n`` (64) tokens,   the same window, prompt included
                   prompt included: ``x<=0 ? x·p : x/p``      (llama_sampler_penalties_apply)
    =============  =========================================  =====================================
    """

    name, what = "penalties", "penalties"
    params = (
        Param("repetition_penalty", "> 0", "1 = off", "CTRL penalty on seen tokens"),
        Param("presence_penalty", "a finite number", "0 = off", "subtract P once per generated token id"),
        Param("frequency_penalty", "a finite number", "0 = off", "subtract F per occurrence in the output"),
        Param(
            "penalty_last_n",
            "an integer >= -1",
            "None = the engine's window, -1 = the whole history, 0 = off",
            "penalties count only the last N tokens (llama.cpp: 64)",
        ),
    )

    def active(self, c: SamplerConfig) -> bool:
        return c.repetition_penalty != 1.0 or c.presence_penalty != 0.0 or c.frequency_penalty != 0.0

    def check(self, c: SamplerConfig) -> None:
        if c.engine in ("hf", "vllm") and c.penalty_last_n not in (None, -1):
            raise ValueError(
                f"penalty_last_n={c.penalty_last_n}: the {c.engine} engine has no penalty window (its penalties "
                "see the whole prompt and output); use engine='llama.cpp' or 'genprobe' for a window"
            )

    def adjust(self, z: torch.Tensor, history: torch.Tensor, c: SamplerConfig, prompt_len: int) -> torch.Tensor:
        V, n = z.shape[1], c.penalty_last_n  # how many recent tokens count: -1 = all, 0 = none
        if n is None:
            n = LLAMA_CPP_PENALTY_LAST_N if c.engine == "llama.cpp" else -1
        if n == 0:
            return z
        scoped = history  # a window: each row's last n real (>= 0) tokens, the others turned into padding (-1)
        if n > 0:
            from_end = (history >= 0).flip(1).cumsum(1).flip(1)  # 1 for the newest real token, 2 for the one before
            scoped = torch.where((history >= 0) & (from_end <= n), history, torch.full_like(history, -1))
        if c.engine == "llama.cpp":  # x <= 0 ? x·p : x/p, then x -= count·f + 1[count>0]·r, on the window's tokens
            counts = history_counts(scoped, V)
            seen = counts > 0
            rep = torch.where(z <= 0, z * c.repetition_penalty, z / c.repetition_penalty)
            return torch.where(seen, rep - (counts * c.frequency_penalty + seen.to(z.dtype) * c.presence_penalty), z)
        if c.repetition_penalty != 1.0:  # each id in the history penalised once, gathering only those columns (as HF)
            penalty, idx = c.repetition_penalty, torch.where(scoped >= 0, scoped, torch.full_like(scoped, V))  # pad → V
            ext = torch.cat([z, z.new_zeros(z.shape[0], 1)], dim=1)
            x = ext.gather(1, idx)
            if c.engine == "vllm":
                p = torch.tensor(penalty, dtype=torch.float32, device=z.device)
                x = x * torch.where(x > 0, 1.0 / p, p)
            else:
                x = torch.where(x < 0, x * penalty, x / penalty)
            z = ext.scatter(1, idx, x)[:, :V]
        if c.presence_penalty or c.frequency_penalty:  # OpenAI/vLLM: output tokens only
            counts = history_counts(scoped[:, prompt_len:], V)
            z = z - c.frequency_penalty * counts.to(z.dtype)
            z = z - c.presence_penalty * (counts > 0).to(z.dtype)
        return z

    def vllm(self, c: SamplerConfig, vocab: int) -> dict[str, Any]:
        if c.penalty_last_n not in (None, -1):
            raise UnsupportedSamplerError(
                f"penalty_last_n={c.penalty_last_n}: vLLM's penalties see the whole prompt and output, it has no window"
            )
        return {p.name: float(getattr(c, p.name)) for p in self.params if p.name != "penalty_last_n"}  # same names

    def llama_cpp(self, c: SamplerConfig, env: ChainEnv) -> ChainStage | None:
        """llama.cpp clamps a negative window to 0 = *off*: genprobe's -1 becomes the context length."""
        if not self.active(c):
            return None
        last_n = _window(c.penalty_last_n, LLAMA_CPP_PENALTY_LAST_N, env.context_length)
        return ChainStage(
            "penalties", (last_n, float(c.repetition_penalty), float(c.frequency_penalty), float(c.presence_penalty))
        )


def no_repeat_ngram_mask(history: torch.Tensor, n: int, V: int) -> torch.Tensor:
    """(B, V) bool: tokens that would complete an n-gram already present in ``history`` (HF semantics).

    Entries < 0 are padding and never match, so left-padded rows behave like the row alone.
    """
    B, t = history.shape
    banned = torch.zeros(B, V + 1, dtype=torch.bool, device=history.device)
    if t < n or n < 1:
        return banned[:, :V]
    windows = history.unfold(1, n, 1)  # (B, t-n+1, n)
    real = (windows >= 0).all(-1)
    prefix = history[:, t - (n - 1) :] if n > 1 else history[:, :0]
    match = (windows[:, :, : n - 1] == prefix[:, None, :]).all(-1) & real & (prefix >= 0).all(-1, keepdim=True)
    nxt = torch.where(match, windows[:, :, n - 1], torch.full_like(windows[:, :, n - 1], V))
    banned.scatter_(1, nxt, True)
    return banned[:, :V]


class NoRepeatNgram(Adjustment):
    name, what, exact_anywhere = "no_repeat_ngram", "no_repeat_ngram (an n-gram ban)", True
    params = (Param("no_repeat_ngram", "an integer >= 0", "0 = off", "ban tokens completing a repeated N-gram (HF)"),)

    def adjust(self, z: torch.Tensor, history: torch.Tensor, c: SamplerConfig, prompt_len: int) -> torch.Tensor:
        return z.masked_fill(no_repeat_ngram_mask(history, c.no_repeat_ngram, z.shape[1]), NEG_INF)


class Dry(Adjustment):
    """DRY as llama.cpp computes it in every engine (:mod:`genprobe.engine.samplers.llama_cpp`)."""

    name, what = "dry", "DRY (dry_multiplier > 0)"
    params = (
        Param("dry_multiplier", ">= 0", "0 = off", "DRY strength (llama.cpp)"),
        Param("dry_base", ">= 1", "llama.cpp disables DRY below 1", "DRY base, default 1.75"),
        Param("dry_allowed_length", "an integer >= 1", "repeats up to this length are free", "DRY: default 2"),
        Param("dry_last_n", "an integer >= -1", "-1 = the whole context, 0 = DRY off", "tokens DRY scans, default -1"),
    )
    other_fields = ("dry_sequence_breakers",)

    def active(self, c: SamplerConfig) -> bool:
        return c.dry_multiplier != 0.0 and c.dry_last_n != 0

    def check(self, c: SamplerConfig) -> None:
        for s in c.dry_sequence_breakers:
            if not s or any(t < 0 for t in s):
                raise ValueError(
                    f"dry_sequence_breakers must be non-empty token-id sequences (ids >= 0), got {list(s)}"
                )

    def adjust(self, z: torch.Tensor, history: torch.Tensor, c: SamplerConfig, prompt_len: int) -> torch.Tensor:
        table = breaker_table(c.dry_sequence_breakers)
        out = z
        for b, row in enumerate(history.tolist()):
            real = [t for t in row if t >= 0]
            pens = dry_penalties(real, c.dry_multiplier, c.dry_base, c.dry_allowed_length, c.dry_last_n, table)
            if pens:
                out = out.clone() if out is z else out
                ids = torch.tensor(list(pens), dtype=torch.long, device=z.device)
                out[b, ids] -= torch.tensor([float(v) for v in pens.values()], dtype=z.dtype, device=z.device)
        return out

    def llama_cpp(self, c: SamplerConfig, env: ChainEnv) -> ChainStage | None:
        """Breakers go as *strings* (llama.cpp tokenizes them); ``dry_last_n=-1`` → the context length."""
        if not self.active(c):
            return None
        dry_n = _window(c.dry_last_n, env.context_length, env.context_length)
        return ChainStage(
            "dry", (float(c.dry_multiplier), float(c.dry_base), int(c.dry_allowed_length), dry_n, env.breakers)
        )


class Contrastive(Stage):
    """Contrastive search (:class:`genprobe.engine.generate.ContrastiveRun`): a decoding mode, no logits transform."""

    name, what = "contrastive", "contrastive search (penalty_alpha > 0)"
    params = (Param("penalty_alpha", "in [0, 1]", "0 = off; contrastive search", "degeneration penalty, with --top-k"),)

    def check(self, c: SamplerConfig) -> None:
        if not self.active(c):
            return
        if not c.top_k or c.top_k < 2:
            raise ValueError(
                f"penalty_alpha > 0 (contrastive search) needs top_k >= 2 candidates, got top_k={c.top_k!r}"
            )
        if c.greedy:
            raise ValueError(
                "penalty_alpha > 0 is contrastive search, its own deterministic mode: do not also set greedy"
            )
        ignored = [s.params[0].name for s in TRUNCATIONS if s is not TOP_K and s.active(c)]
        if ignored:
            raise ValueError(f"contrastive search (penalty_alpha > 0) does not sample: unset {', '.join(ignored)}")


# ---- truncations and temperature: placed by ORDERS, skipped when greedy ------------------------------
class Truncation(Stage):
    """A stage that may remove tokens (or rescale them: temperature), skipped when greedy."""

    vllm_name: ClassVar[str | None] = None  # its SamplingParams keyword; None: vLLM has no such sampler
    chain_args: ClassVar[tuple[Any, ...]] = ()  # llama.cpp's init arguments after the value (min_keep 0)

    def vllm(self, c: SamplerConfig, vocab: int) -> dict[str, Any]:
        if self.vllm_name is None:
            return super().vllm(c, vocab)
        return {} if c.greedy else {self.vllm_name: self.value(c)}

    def llama_cpp(self, c: SamplerConfig, env: ChainEnv) -> ChainStage | None:
        return ChainStage(self.name, (self.value(c), *self.chain_args))

    def logits(self, z: torch.Tensor, c: SamplerConfig, draws: torch.Tensor | None) -> torch.Tensor:
        """The ``genprobe`` / ``hf`` / ``vllm`` arithmetic on (B, V) logits (only called while active)."""
        raise NotImplementedError

    def candidates(self, a: Candidates, c: SamplerConfig, draw: float) -> None:
        """llama.cpp's arithmetic on one row's candidate array (only called while active)."""
        raise NotImplementedError


class Temperature(Truncation):
    name, what, off = "temp", "temperature", 1.0
    params = (Param("temperature", "a finite number", "1 = off", "divide logits by T > 0"),)

    def check(self, c: SamplerConfig) -> None:
        if not c.greedy and c.penalty_alpha <= 0 and c.temperature <= 0:
            raise ValueError(
                f"temperature must be > 0 when sampling, got {c.temperature}; for deterministic decoding use "
                "greedy=True (an explicit argmax), not temperature≈0"
            )

    def logits(self, z: torch.Tensor, c: SamplerConfig, draws: torch.Tensor | None) -> torch.Tensor:
        """vLLM raises 0 < τ < 0.01 to 0.01 (SamplingParams.__post_init__) and divides by a float32 tensor."""
        if c.engine == "vllm":
            return z / torch.tensor([max(c.temperature, VLLM_MIN_TEMPERATURE)], dtype=torch.float32, device=z.device)
        return z / c.temperature

    def candidates(self, a: Candidates, c: SamplerConfig, draw: float) -> None:
        a.logit = (a.logit / F32(c.temperature)).astype(F32)  # llama_sampler_temp_impl

    def vllm(self, c: SamplerConfig, vocab: int) -> dict[str, Any]:
        return {"temperature": 0.0 if c.greedy else self.value(c)}  # vLLM's greedy: an explicit argmax

    def llama_cpp(self, c: SamplerConfig, env: ChainEnv) -> ChainStage | None:
        return ChainStage("temp_ext", (self.value(c), 0.0, 1.0))


class TopK(Truncation):
    """Keep the ``k`` largest logits: ties at the k-th value all kept (HF, vLLM); llama.cpp keeps exactly k (which
    tied ids survive is left to ``std::partial_sort`` there — here the lower ids, from a stable sort)."""

    name, what, vllm_name = "top_k", "top_k", "top_k"
    params = (
        Param("top_k", "an integer >= 0", "0 or None = off", "keep the K likeliest (candidates with --penalty-alpha)"),
    )

    def logits(self, z: torch.Tensor, c: SamplerConfig, draws: torch.Tensor | None) -> torch.Tensor:
        k = int(self.value(c))
        if k >= z.shape[-1]:
            return z
        return z.masked_fill(z < torch.topk(z, k, dim=-1).values[..., -1:], NEG_INF)

    def candidates(self, a: Candidates, c: SamplerConfig, draw: float) -> None:
        a.sort()
        a.take(np.arange(min(int(self.value(c)), len(a.ids))))


class TopP(Truncation):
    """Nucleus sampling.

    * ``genprobe``: the smallest prefix by descending probability (ties: lower id first) whose mass reaches ``p``,
      accumulated in float64 (a mass within 1e-12 of ``p`` reaches it) — the report's sampling lab's rule;
    * ``hf`` (TopPLogitsWarper) and ``vllm`` (apply_top_k_top_p_pytorch): sort *ascending* with the same
      ``torch.sort`` call, drop the prefix whose float32 cumulative mass is ``<= 1 - p`` (among tied tokens at the
      cut the ones sorted first go); HF compares with ``float32(1 - p)``, vLLM with ``1 - float32(p)``;
    * ``llama.cpp``: keep up to the first token whose running float32 sum is ``>= p``.
    """

    name, what, off, vllm_name, chain_args = "top_p", "top_p", 1.0, "top_p", (0,)
    params = (Param("top_p", "in (0, 1]", "1 or None = off", "nucleus: smallest set whose mass reaches P"),)

    def logits(self, z: torch.Tensor, c: SamplerConfig, draws: torch.Tensor | None) -> torch.Tensor:
        p = self.value(c)
        if c.engine == "genprobe":
            srt, idx = torch.sort(z.double(), dim=-1, descending=True, stable=True)
            cum = torch.softmax(srt, dim=-1).cumsum(-1)
            before = torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1]], dim=-1)  # float64 mass before each
            remove_sorted = before >= p - TOP_P_TOLERANCE
            remove_sorted[..., 0] = False  # the top token is always kept
            return z.masked_fill(torch.zeros_like(remove_sorted).scatter_(-1, idx, remove_sorted), NEG_INF)
        srt, idx = torch.sort(z, dim=-1, descending=False)  # the engines' own call: ties fall as theirs do
        cum = srt.softmax(dim=-1).cumsum(dim=-1)
        if c.engine == "vllm":
            remove_sorted = cum <= 1 - torch.tensor([p], dtype=torch.float32, device=z.device)  # float32 arithmetic
        else:
            remove_sorted = cum <= (1 - p)  # Python float 1 - p, rounded to float32 by the comparison
        remove_sorted[..., -1] = False
        return z.masked_fill(remove_sorted.scatter(-1, idx, remove_sorted), NEG_INF)

    def candidates(self, a: Candidates, c: SamplerConfig, draw: float) -> None:
        a.softmax(do_sort=False)  # llama_sampler_top_p_apply (min_keep 0)
        a.sort()
        reached = np.nonzero(np.cumsum(a.p, dtype=F32) >= F32(self.value(c)))[0]
        if len(reached):
            a.take(np.arange(reached[0] + 1))


class MinP(Truncation):
    """Keep tokens whose probability is at least ``p`` × the top one; llama.cpp compares *logits*:
    ``logit >= max_logit + logf(p)`` (array order kept when unsorted)."""

    name, what, vllm_name, chain_args = "min_p", "min_p", "min_p", (0,)
    params = (Param("min_p", "in [0, 1]", "0 or None = off", "keep tokens with p >= M * p_max"),)

    def logits(self, z: torch.Tensor, c: SamplerConfig, draws: torch.Tensor | None) -> torch.Tensor:
        probs = torch.softmax(z, dim=-1)
        return z.masked_fill(probs < probs.amax(dim=-1, keepdim=True) * self.value(c), NEG_INF)

    def candidates(self, a: Candidates, c: SamplerConfig, draw: float) -> None:
        if not len(a.ids):
            return
        with np.errstate(divide="ignore"):  # a denormal p rounds to 0 in float32: logf gives -inf, as in C
            min_logit = F32(a.logit.max() + logf(F32(self.value(c))))
        if a.sorted:
            below = np.nonzero(a.logit[1:] < min_logit)[0]
            a.take(np.arange(below[0] + 1 if len(below) else len(a.ids)))
        else:
            a.take(np.nonzero(a.logit >= min_logit)[0])


class Typical(Truncation):
    """Locally typical sampling: transformers' TypicalLogitsWarper (min_tokens_to_keep 1), or llama.cpp's
    ``llama_sampler_typical_apply`` — nearest-to-entropy surprisals until the float32 mass exceeds p. There a
    ``-inf`` candidate (p = 0) makes the entropy NaN (``0·log 0``), every surprisal NaN, and typical-p cuts like
    a top-p with ``>`` over the order libstdc++'s ``std::sort`` leaves all-equivalent elements in."""

    name, what, off, chain_args = "typical", "typical_p (locally typical sampling)", 1.0, (0,)
    params = (Param("typical_p", "in (0, 1]", "1 or None = off", "locally typical sampling mass (HF semantics)"),)

    def logits(self, z: torch.Tensor, c: SamplerConfig, draws: torch.Tensor | None) -> torch.Tensor:
        normalized = torch.nn.functional.log_softmax(z, dim=-1)
        p = torch.exp(normalized)
        ent = -(normalized * p).nansum(-1, keepdim=True)
        shifted = torch.abs((-normalized) - ent)
        sorted_scores, sorted_indices = torch.sort(shifted, descending=False)
        cumulative = z.gather(-1, sorted_indices).softmax(dim=-1).cumsum(dim=-1)
        last_ind = (cumulative < self.value(c)).sum(dim=1).clamp_(max=sorted_scores.shape[-1] - 1)
        remove_sorted = sorted_scores > sorted_scores.gather(1, last_ind.view(-1, 1))
        remove_sorted[..., :1] = False
        return z.masked_fill(remove_sorted.scatter(1, sorted_indices, remove_sorted), NEG_INF)

    def candidates(self, a: Candidates, c: SamplerConfig, draw: float) -> None:
        a.softmax(do_sort=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            logp = logf(a.p)
            entropy = np.cumsum(-a.p * logp, dtype=F32)[-1]  # NaN when some p == 0, as in llama.cpp
            shifted = np.abs(-logp - entropy, dtype=F32)
        # All-NaN keys compare false both ways: std::sort permutes "equal" elements its own way.
        order = np.argsort(shifted, kind="stable") if not np.isnan(entropy) else std_sort_equivalent(len(a.ids))
        over = np.nonzero(np.cumsum(a.p[order], dtype=F32) > F32(self.value(c)))[0]
        a.take(order[: over[0] + 1] if len(over) else order)
        a.sorted = False


class TopNSigma(Truncation):
    """Keep logits >= max − n·σ over the finite logits (population σ; llama.cpp's definition, which sets the
    others to ``-inf`` in its array)."""

    name, what = "top_n_sigma", "top_n_sigma"
    params = (Param("top_n_sigma", ">= 0", "0 or None = off", "keep logits >= max - N*sigma (llama.cpp semantics)"),)

    def logits(self, z: torch.Tensor, c: SamplerConfig, draws: torch.Tensor | None) -> torch.Tensor:
        finite = torch.isfinite(z)
        count = finite.sum(-1, keepdim=True).clamp(min=1)
        mean = torch.where(finite, z, torch.zeros_like(z)).sum(-1, keepdim=True) / count
        var = torch.where(finite, (z - mean) ** 2, torch.zeros_like(z)).sum(-1, keepdim=True) / count
        top = torch.where(finite, z, torch.full_like(z, NEG_INF)).amax(-1, keepdim=True)
        return z.masked_fill(z < top - self.value(c) * var.sqrt(), NEG_INF)

    def candidates(self, a: Candidates, c: SamplerConfig, draw: float) -> None:
        if len(a.ids) <= 1:
            return
        finite = a.logit[a.logit != -np.inf]
        count = F32(max(len(finite), 1))
        mean = F32(np.cumsum(finite, dtype=F32)[-1] / count) if len(finite) else F32(0)
        acc = F32(0)
        for x in finite:  # acc (float) += pow(x − mean, 2) (a double)
            acc = F32(float(acc) + float(F32(x - mean)) ** 2)
        std = F32(np.sqrt(F32(acc / count)))
        cut = F32(finite.max() - F32(F32(self.value(c)) * std))
        a.logit = np.where(a.logit < cut, F32(-np.inf), a.logit).astype(F32)
        a.softmax(do_sort=True)

    def llama_cpp(self, c: SamplerConfig, env: ChainEnv) -> ChainStage | None:
        return ChainStage(self.name, (self.value(c) or -1.0,))  # common.h: -1 = off


class Xtc(Truncation):
    """XTC ("exclude top choices", llama_sample_xtc_apply): with probability ``xtc_probability`` per step and row,
    every candidate whose probability is ``>= xtc_threshold`` is removed but the least likely of them. Nothing
    happens with fewer than two candidates, when ``threshold > 0.5`` or fewer than two tokens reach it. The draw
    comes from the generation's seeded generator; among equal probabilities the higher id counts as less likely
    (a stable descending sort), where llama.cpp leaves the order to ``std::partial_sort``."""

    name, what = "xtc", "XTC (xtc_probability > 0)"
    params = (
        Param("xtc_probability", "in [0, 1]", "0 = off", "XTC: chance per step to exclude top choices"),
        Param("xtc_threshold", "in [0, 1]", "above 0.5 XTC is off", "XTC: what makes a top choice, default 0.1"),
    )

    def active(self, c: SamplerConfig) -> bool:
        return not c.greedy and c.xtc_probability > 0 and c.xtc_threshold <= 0.5

    def logits(self, z: torch.Tensor, c: SamplerConfig, draws: torch.Tensor | None) -> torch.Tensor:
        assert draws is not None  # process_logits draws while XTC is active
        sp, idx = torch.sort(torch.softmax(z, dim=-1), dim=-1, descending=True, stable=True)
        n_above = (sp >= c.xtc_threshold).sum(-1, keepdim=True)  # a prefix of the sorted row
        remove_sorted = torch.arange(z.shape[-1], device=z.device) < (n_above - 1)  # all above but the last
        fires = (draws.to(z.device) <= c.xtc_probability) & (torch.isfinite(z).sum(-1) >= 2)
        remove_sorted &= fires[:, None]
        return z.masked_fill(torch.zeros_like(remove_sorted).scatter_(-1, idx, remove_sorted), NEG_INF)

    def candidates(self, a: Candidates, c: SamplerConfig, draw: float) -> None:
        if len(a.ids) < 2 or draw > c.xtc_probability:
            return
        a.softmax(do_sort=True)
        below = np.nonzero(a.p < F32(c.xtc_threshold))[0]  # p is sorted: the above-threshold run ends here
        pos_last = (below[0] if len(below) else len(a.ids)) - 1
        if pos_last > 0:
            a.take(np.arange(pos_last, len(a.ids)))

    def llama_cpp(self, c: SamplerConfig, env: ChainEnv) -> ChainStage | None:
        return ChainStage("xtc", (float(c.xtc_probability), float(c.xtc_threshold), 0, env.seed))


BANS, PENALTIES, NO_REPEAT_NGRAM, DRY, CONTRASTIVE = Bans(), Penalties(), NoRepeatNgram(), Dry(), Contrastive()
TEMPERATURE, TOP_K, TOP_P, MIN_P = Temperature(), TopK(), TopP(), MinP()
TYPICAL, TOP_N_SIGMA, XTC = Typical(), TopNSigma(), Xtc()
#: The adjustments, in the order they run (each commutes with the others: a ban's ``-inf`` stays ``-inf``).
ADJUSTMENTS: tuple[Adjustment, ...] = (BANS, PENALTIES, NO_REPEAT_NGRAM, DRY)
TRUNCATIONS: tuple[Truncation, ...] = (TEMPERATURE, TOP_K, TOP_P, MIN_P, TYPICAL, TOP_N_SIGMA, XTC)
#: Every stage: what validates a config, builds the CLI and maps it to another engine.
STAGES: tuple[Stage, ...] = (*ADJUSTMENTS, *TRUNCATIONS, CONTRASTIVE)

#: Truncation/temperature stages per order (the adjustments always come first). Stages an engine does not have
#: sit where they do least harm: after its own truncations.
ORDERS: dict[str, tuple[Truncation, ...]] = {
    "trunc_then_temp": (TOP_N_SIGMA, TOP_K, TYPICAL, TOP_P, MIN_P, XTC, TEMPERATURE),
    "temp_then_trunc": (TEMPERATURE, TOP_N_SIGMA, TOP_K, TYPICAL, TOP_P, MIN_P, XTC),
    "hf": (TEMPERATURE, TOP_K, TOP_P, MIN_P, TYPICAL, TOP_N_SIGMA, XTC),
    "vllm": (TEMPERATURE, MIN_P, TOP_K, TOP_P, TYPICAL, TOP_N_SIGMA, XTC),
    "llama.cpp": (TOP_N_SIGMA, TOP_K, TYPICAL, TOP_P, MIN_P, XTC, TEMPERATURE),
}


def active_truncations(c: SamplerConfig, order: str | None = None) -> list[Truncation]:
    """The truncation stages that act under ``c`` (none when greedy), in ``order`` (default: the config's)."""
    return [] if c.greedy else [s for s in ORDERS[order or c.order] if s.active(c)]


def refuse_for(c: SamplerConfig, engine: str, label: str, stages: tuple[Stage, ...] = STAGES) -> None:
    """Refuse, naming the setting, what ``label`` (vLLM, llama.cpp) cannot run exactly: a field no stage maps
    (a sampler added later is never dropped silently) or an active stage in another engine's arithmetic."""
    owned = {"greedy", "order", "engine", *(f for s in stages for f in (*(p.name for p in s.params), *s.other_fields))}
    unmapped = [
        f"{f.name}={getattr(c, f.name)!r}" for f in fields(c) if f.name not in owned and getattr(c, f.name) != f.default
    ]
    if unmapped:
        raise UnsupportedSamplerError(
            f"no exact {label} form is known for {', '.join(unmapped)}; genprobe refuses to approximate it"
        )
    arithmetic = [s.name for s in (*c.adjustments, *c.truncations) if not s.exact_anywhere]
    if arithmetic and c.engine != engine:
        raise UnsupportedSamplerError(
            f"engine={c.engine!r} computes {', '.join(arithmetic)} with its own arithmetic (rounding, ties, windows); "
            f"{label}'s differs. Describe {label}'s sampler with engine={engine!r} (e.g. order={engine!r}, or "
            f"SamplerConfig.preset({engine!r}, ...)) to run it through {label}"
        )


# ---- the config: every stage's fields, validated by the stages ----------------------------------------
ENGINES = ("genprobe", "hf", "vllm", "llama.cpp")
PARAMS = tuple(p for s in STAGES for p in s.params)

#: Engine defaults filled by :meth:`SamplerConfig.preset` (τ 1, no truncation unless said).
PRESETS: dict[str, dict[str, Any]] = {
    "genprobe": {},
    "hf": {"top_k": 50},  # GenerationConfig default: generate(do_sample=True) adds top_k=50
    "vllm": {},  # SamplingParams defaults
    # common/common.h (common_params_sampling): penalty_last_n and dry_penalty_last_n are both 64; DRY, XTC off
    "llama.cpp": dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, penalty_last_n=64, dry_last_n=64),
}


@dataclass(frozen=True)
class SamplerConfig:
    """Validated sampler parameters; every "off" value is the engines' own (0, None or 1.0)."""

    greedy: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    top_n_sigma: float | None = None
    ban_ids: tuple[int, ...] = field(default=())
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int | None = None
    no_repeat_ngram: int = 0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_last_n: int = -1
    dry_sequence_breakers: tuple[tuple[int, ...], ...] = field(default=())
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    penalty_alpha: float = 0.0
    order: str = "trunc_then_temp"
    engine: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ban_ids", tuple(int(i) for i in self.ban_ids))
        breakers = tuple(tuple(int(t) for t in s) for s in self.dry_sequence_breakers)
        object.__setattr__(self, "dry_sequence_breakers", breakers)
        if self.engine is None:
            object.__setattr__(self, "engine", self.order if self.order in ENGINES else "genprobe")
        if self.order not in ORDERS:
            raise ValueError(f"unknown sampler order {self.order!r}; choose one of {sorted(ORDERS)}")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown sampler engine {self.engine!r}; choose one of {list(ENGINES)}")
        for param in PARAMS:  # each field's own range first: the checks across fields compare them
            param.check(getattr(self, param.name))
        for stage in STAGES:
            stage.check(self)

    @classmethod
    def preset(cls, engine: str, **overrides: Any) -> "SamplerConfig":
        """An engine's defaults (its order and arithmetic too); ``overrides`` win, ``order`` included."""
        if engine not in PRESETS:
            raise ValueError(f"unknown sampler preset {engine!r}; choose one of {sorted(PRESETS)}")
        base: dict[str, Any] = {"order": engine if engine in ORDERS else "trunc_then_temp", "engine": engine}
        return cls(**{**base, **PRESETS[engine], **overrides})

    def replace(self, **changes: Any) -> "SamplerConfig":
        """A copy with ``changes`` (validated again)."""
        return replace(self, **changes)

    # ---- what is active (each stage's ``active``; these, cached, are asked at every decoding step) ----------
    # Cached: a config is immutable, and the chain asks these at every decoding step.
    @cached_property
    def uses_history(self) -> bool:
        """True when some stage reads the token history (penalties, no-repeat-n-gram, DRY)."""
        penalties = PENALTIES.active(self) and self.penalty_last_n != 0
        return penalties or NO_REPEAT_NGRAM.active(self) or DRY.active(self)

    @cached_property
    def adjustments(self) -> tuple[Adjustment, ...]:
        """The adjustments that act under this config, in the order they run."""
        return tuple(s for s in ADJUSTMENTS if s.active(self))

    @cached_property
    def truncations(self) -> tuple[Truncation, ...]:
        """The truncation stages that act under this config, in its order (none when greedy)."""
        return tuple(active_truncations(self))

    @cached_property
    def is_identity(self) -> bool:
        """True when processing cannot change the outcome (plain greedy / plain τ=1 sampling)."""
        return not (self.uses_history or self.ban_ids) and (self.greedy or not self.truncations)

    # A SamplingParams and a SamplerConfig with the same parameters are the same sampler (dataclass equality
    # would compare the classes too).
    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def __eq__(self, other: object) -> bool:
        return self._key() == other._key() if isinstance(other, SamplerConfig) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (every parameter, the resolved engine included)."""
        return {f.name: json_safe(getattr(self, f.name)) for f in fields(self)}  # asdict() deep-copies: slow


@dataclass(frozen=True, eq=False)
class SamplingParams(SamplerConfig):
    """The sampler configuration under its public name (``genprobe.SamplingParams``): a :class:`SamplerConfig`
    whose repr, presets, copies and argument errors say ``SamplingParams``; equal to a ``SamplerConfig`` with the
    same parameters and accepted wherever one is."""
