"""Speculative decoding: a draft proposes k tokens, the target checks them all in one cached forward.

Greedy keeps each draft while it is the target's argmax (the output is plain greedy's, token for token); sampled
runs keep ``d_j`` with probability ``min(1, p_j(d_j) / q_j(d_j))`` and draw a rejected position from
``norm(max(0, p_j - q_j))`` (Leviathan et al. 2023, Alg. 1; Chen et al. 2023, Alg. 2), ``p`` and ``q`` being the
*processed* distributions of the sampler chain, so the output is distributed as plain sampling's. Each rule is one
method of :class:`SpeculativeDecoder`, so that the verifier's mutants (``genprobe.verify.speculative.MUTANTS``)
override one each. docs/speculative.md has the round step by step.

Drafts (:class:`Draft`): :class:`PromptLookupDraft` (deterministic: ``q`` a point mass) and :class:`ModelDraft` (a
smaller model or the target's first layers, :func:`first_layers`; its ``q`` is the target's sampler chain's).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence, TypeAlias, cast

import torch

from ..model.arch import count_parameters
from ..model.gpt import GPT
from .generate import GREEDY
from .runner import ModelLike, Runner, check_inputs, device_of, runner_for
from .samplers.chain import process_logits, sample_next
from .samplers.stages import CONTRASTIVE, XTC, SamplerConfig

#: What a draft proposes: tokens, and the distributions they were drawn from (None: point masses).
Proposal: TypeAlias = "tuple[list[int], list[torch.Tensor] | None]"


class Draft(Protocol):
    """What proposes tokens (:class:`PromptLookupDraft`, :class:`ModelDraft`, a verifier's mutant)."""

    name: str
    forwards: int  # forward calls so far

    def start(self, capacity: int) -> None:
        """Get ready for one generation of up to ``capacity`` tokens."""

    def propose(self, context: Sequence[int], k: int, chooser: SpeculativeDecoder) -> Proposal:
        """Up to ``k`` tokens after ``context`` and the distributions they were drawn from (None: point masses)."""

    def rollback(self, context: Sequence[int]) -> None:
        """Forget cached tokens ``context`` does not continue."""


class CachedModel:
    """A model driving one row of tokens through its own cache; ``tokens`` = what the cache holds."""

    def __init__(self, model: ModelLike, name: str = "model"):
        self.runner, self.name = runner_for(model), name
        self.device = device_of(self.runner)

    def start(self, capacity: int) -> None:
        """A fresh cache for one generation of up to ``capacity`` tokens."""
        self.state = self.runner.new_state(1, capacity)
        self.tokens: list[int] = []
        self.forwards = 0  # forward calls

    def feed(self, new: Sequence[int]) -> torch.Tensor:
        """Logits (T, V) of ``new`` appended to the cached tokens, in one forward."""
        ids = torch.tensor([list(new)], dtype=torch.long, device=self.device)
        logits: torch.Tensor = self.runner.step(ids, None, self.state)[0]
        self.tokens.extend(int(t) for t in new)
        self.forwards += 1
        return logits.float()

    def catch_up(self, context: Sequence[int], extra: Sequence[int] = ()) -> torch.Tensor:
        """Feed what ``context`` + ``extra`` holds beyond the cache; logits of those positions."""
        return self.feed([*context[len(self.tokens) :], *extra])

    def keep_for(self, context: Sequence[int]) -> int:
        """How many cached tokens stay valid for ``context``: the common prefix, short of the last (pending) one."""
        n = 0
        limit = min(len(self.tokens), len(context) - 1)
        while n < limit and self.tokens[n] == context[n]:
            n += 1
        return n

    def rollback(self, context: Sequence[int]) -> None:
        """Drop the cached tokens ``context`` does not continue (the cache truncated, the bookkeeping with it)."""
        keep = self.keep_for(context)
        if keep < len(self.tokens):
            self.state.truncate(keep)
            del self.tokens[keep:]


class PromptLookupDraft:
    """Prompt lookup decoding (transformers' ``PromptLookupCandidateGenerator``, ``prompt_lookup_num_tokens``):
    the last ``max_ngram`` .. 1 tokens are searched for earlier in the context, and the tokens that followed the
    first match are proposed. Deterministic: ``q`` is a point mass on each proposed token."""

    name, max_ngram, forwards = "prompt-lookup", 2, 0  # 2-grams (docs/speculative.md); no forwards of its own

    def start(self, capacity: int) -> None:
        """Nothing to allocate."""

    def propose(self, context: Sequence[int], k: int, chooser: SpeculativeDecoder) -> Proposal:
        n = len(context)
        for size in range(min(self.max_ngram, n - 1), 0, -1):
            tail = list(context[n - size :])
            for start in range(n - size):  # earliest match first, as transformers' match_indices
                if list(context[start : start + size]) == tail and start + size < n:
                    return [int(t) for t in context[start + size : min(start + size + k, n)]], None
        return [], None

    def rollback(self, context: Sequence[int]) -> None:
        """Nothing cached."""


class ModelDraft(CachedModel):
    """A smaller model with the target's vocabulary proposes ``k`` tokens, one cached forward each."""

    def propose(self, context: Sequence[int], k: int, chooser: SpeculativeDecoder) -> Proposal:
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        logits = self.catch_up(context)[-1]
        for j in range(k):
            x, q = chooser.pick(logits, [*context, *tokens])
            tokens.append(x)
            if q is not None:
                qs.append(q)
            if j < k - 1:
                logits = self.feed([x])[-1]
        return tokens, (qs if qs else None)


def first_layers(model: ModelLike, n_layer: int) -> Runner:
    """A copy of ``model`` (a genprobe GPT or a Llama-family transformers model) keeping its first ``n_layer`` blocks
    and its final norm and head, as a runner: the self-speculative draft (an early exit)."""
    runner = runner_for(model)
    hf = getattr(runner, "model", None)  # GPTRunner and HFCausalLM hold the module they drive
    inner: Any = getattr(hf, "model", None)
    if isinstance(hf, GPT):
        total = hf.cfg.n_layer
    elif hf is not None and hasattr(inner, "layers"):
        total = len(inner.layers)
    else:
        raise ValueError(
            f"a first-layers draft needs a genprobe GPT or a Llama-family model, got {type(runner).__name__}"
        )
    if not 1 <= n_layer < total:
        raise ValueError(f"a first-layers draft keeps 1 .. {total - 1} of the target's {total} layers, got {n_layer}")
    small = copy.deepcopy(hf)
    if isinstance(small, GPT):
        small.h = small.h[:n_layer]
        small.cfg = replace(small.cfg, n_layer=n_layer)
        return runner_for(small.eval())
    from .hf_adapter import HFCausalLM

    small.model.layers = small.model.layers[:n_layer]
    small.config.num_hidden_layers = n_layer
    if getattr(small.config, "layer_types", None):
        small.config.layer_types = small.config.layer_types[:n_layer]
    return HFCausalLM(small)


class Draws(Protocol):
    """The randomness of a sampled run: a token drawn from a distribution, a coin with a given probability."""

    def token(self, probs: torch.Tensor) -> int: ...

    def coin(self, prob: float) -> bool: ...


class SeededDraws:
    """Draws from one seeded CPU generator."""

    def __init__(self, seed: int = 0):
        self.gen = torch.Generator().manual_seed(int(seed))

    def token(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs.float().cpu(), 1, generator=self.gen))

    def coin(self, prob: float) -> bool:
        return float(torch.rand((), generator=self.gen)) < prob


@dataclass
class SpeculativeStats:
    """What a speculative generation cost and how much of the draft the target kept."""

    JSON_PROPERTIES = ("acceptance_rate", "tokens_per_forward")  # computed from the fields, kept in the JSON form

    rounds: int = 0  # target forwards (one per round)
    drafted: int = 0  # tokens proposed
    accepted: int = 0  # proposed tokens kept
    tokens: int = 0  # tokens generated
    draft_forwards: int = 0
    seconds: float = 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed (None when nothing was proposed)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_forward(self) -> float | None:
        """Generated tokens per target forward (plain decoding: 1)."""
        return self.tokens / self.rounds if self.rounds else None


@dataclass
class SpeculativeResult:
    """One prompt's speculative generation."""

    tokens: list[int]
    prompt_tokens: list[int]
    finished: str  # "length" | "eos"
    draft: str
    k: int
    sampler: dict[str, Any]
    stats: SpeculativeStats


def make_draft(target: ModelLike, draft: str | ModelLike | Draft) -> Draft:
    """A draft from its spec: ``"lookup"`` (prompt lookup), ``"layers:N"`` (the target's first N layers), a model
    with the target's vocabulary and at most its size, or a ready draft object (``propose`` / ``rollback``)."""
    if hasattr(draft, "propose"):
        return cast(Draft, draft)  # duck-typed: a ready draft object
    if isinstance(draft, str):
        if draft in ("lookup", "prompt-lookup"):
            return PromptLookupDraft()
        if draft.startswith("layers:"):
            n = draft.split(":", 1)[1]
            if not n.isdigit():
                raise ValueError(f"a first-layers draft is 'layers:N' with N a layer count, got {draft!r}")
            return ModelDraft(first_layers(target, int(n)), name=draft)
        raise ValueError(f"draft must be 'lookup', 'layers:N' or a model, got {draft!r}")
    t_runner, d_runner = runner_for(target), runner_for(draft)
    if d_runner.vocab_size != t_runner.vocab_size:
        raise ValueError(
            f"the draft's vocabulary ({d_runner.vocab_size} tokens) is not the target's ({t_runner.vocab_size}): "
            "speculative decoding needs one tokenizer"
        )
    t_size, d_size = count_parameters(t_runner), count_parameters(d_runner)
    if d_size > t_size:
        raise ValueError(
            f"the draft ({d_size:,} parameters) is larger than the target ({t_size:,}): a draft must be at most the "
            "target's size"
        )
    return ModelDraft(d_runner)


def check_k(k: Any) -> int:
    """``k`` as an int >= 1 (ValueError otherwise)."""
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"k (tokens proposed per round) must be an integer >= 1, got {k!r}")
    return int(k)


class SpeculativeDecoder:
    """One speculative generation's rules (batch 1). Each rule is one method, so that a mutant overrides one."""

    def __init__(
        self,
        target: ModelLike,
        draft: str | ModelLike | Draft,
        k: int = 4,
        sampler: SamplerConfig | None = None,
        draws: Draws | None = None,
        eos_id: int | None = None,
    ):
        self.runner = runner_for(target)
        self.draft = make_draft(target, draft)
        self.k = check_k(k)
        self.cfg = sampler or GREEDY
        if XTC.active(self.cfg):
            raise ValueError("speculative decoding cannot use XTC: its random per-step draw makes p itself random")
        if CONTRASTIVE.active(self.cfg):
            raise ValueError("speculative decoding samples or takes the argmax; contrastive search is its own loop")
        self.greedy = self.cfg.greedy
        self.draws: Draws = draws if draws is not None else SeededDraws(0)
        self.eos_id = eos_id
        self.P = 0

    # ---- the loop --------------------------------------------------------------------------------------------
    def run(self, prompt: Sequence[int], max_new_tokens: int) -> SpeculativeResult:
        """Generate ``max_new_tokens`` after ``prompt`` (fewer at ``eos_id``)."""
        self.P = check_inputs(self.runner, [prompt], max_new_tokens, "cached")
        N = int(max_new_tokens)
        # Room for every token a round could leave behind (a broken rollback's too); the model checks positions.
        capacity = self.P + (N + 1) * (self.k + 1) + 1
        self.target = CachedModel(self.runner, "target")
        self.target.start(capacity)
        self.draft.start(capacity)
        context, out = [int(t) for t in prompt], list[int]()
        stats, finished = SpeculativeStats(), "length"
        t0 = time.perf_counter()
        with torch.inference_mode():
            while len(out) < N:
                before = len(out)
                self.round(context, out, N - len(out), stats)
                new = out[before:]
                if self.eos_id is not None and self.eos_id in new:
                    del out[before + new.index(self.eos_id) + 1 :]
                    finished = "eos"
                    break
        del out[N:]
        stats.tokens, stats.draft_forwards = len(out), self.draft.forwards
        stats.seconds = time.perf_counter() - t0
        name = getattr(self.draft, "name", type(self.draft).__name__)
        return SpeculativeResult(out, list(map(int, prompt)), finished, name, self.k, self.cfg.to_dict(), stats)

    def round(self, context: list[int], out: list[int], remaining: int, stats: SpeculativeStats) -> None:
        """Propose, verify in one target forward, accept, append, roll the caches back."""
        k = min(self.k, remaining - 1)  # the round's last token is the target's own: never propose past the budget
        drafted, qs = self.draft.propose(context, k, self) if k > 0 else ([], None)
        drafted = drafted[:k]
        rows = self.verify_rows(context, drafted)
        n, token, bonus = self.accept(context, drafted, qs, rows)
        stats.rounds += 1
        stats.drafted += len(drafted)
        stats.accepted += n
        self.commit(context, out, drafted[:n], token, bonus)
        self.rollback(context)

    # ---- the rules (one method each) ------------------------------------------------------------------------
    def verify_rows(self, context: Sequence[int], drafted: Sequence[int]) -> torch.Tensor:
        """The target's logits for ``p_1 .. p_{k+1}``: the rows of the last context token and of each draft."""
        logits = self.target.catch_up(context, drafted)
        return logits[-(len(drafted) + 1) :]

    def accept(
        self, context: Sequence[int], drafted: Sequence[int], qs: list[torch.Tensor] | None, rows: torch.Tensor
    ) -> tuple[int, int, bool]:
        """(drafts kept, the token that ends the round, whether it is the bonus token after k acceptances)."""
        for j, x in enumerate(drafted):
            ctx = [*context, *drafted[:j]]
            if self.greedy:
                t = self.argmax(rows[j], ctx)
                if t != x:
                    return j, t, False
                continue
            p = self.probs(rows[j], ctx)
            q = qs[j] if qs is not None else torch.zeros_like(p).index_fill_(0, torch.tensor([x]), 1.0)  # a point mass
            if not self.draws.coin(self.accept_prob(p, q, x)):
                return j, self.draws.token(self.residual(p, q)), False
        ctx = [*context, *drafted]
        token = self.argmax(rows[-1], ctx) if self.greedy else self.draws.token(self.probs(rows[-1], ctx))
        return len(drafted), token, len(drafted) > 0

    def accept_prob(self, p: torch.Tensor, q: torch.Tensor, x: int) -> float:
        """min(1, p(x) / q(x)); ``q(x) > 0`` since ``x`` was drawn from ``q``."""
        return min(1.0, float(p[x]) / float(q[x]))

    def residual(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """norm(max(0, p − q)): what p still needs after what q proposed was kept."""
        r = (p - q).clamp(min=0)
        total = float(r.sum())
        return r / total if total > 0 else p  # total = 0 only when p = q, where no token is ever rejected

    def commit(self, context: list[int], out: list[int], kept: list[int], token: int, bonus: bool) -> None:
        """Append the kept drafts and the round's last token to the context and the output."""
        context.extend([*kept, token])
        out.extend([*kept, token])

    def rollback(self, context: Sequence[int]) -> None:
        """Both caches forget the tokens the context does not hold (the rejected drafts)."""
        self.target.rollback(context)
        self.draft.rollback(context)

    # ---- the sampler chain: the same distribution plain decoding draws from ----------------------------------
    def history(self, context: Sequence[int]) -> torch.Tensor | None:
        return torch.tensor([list(context)], dtype=torch.long) if self.cfg.uses_history else None

    def probs(self, logits: torch.Tensor, context: Sequence[int]) -> torch.Tensor:
        """The processed sampling distribution (V,) after ``context``."""
        return process_logits(logits[None].cpu(), self.history(context), self.cfg, prompt_len=self.P).softmax(-1)[0]

    def argmax(self, logits: torch.Tensor, context: Sequence[int]) -> int:
        """Greedy's token, as plain decoding's: the raw argmax (plain greedy), else that of the adjusted logits."""
        return int(sample_next(logits[None].cpu(), self.history(context), self.cfg, prompt_len=self.P)[0])

    def pick(self, logits: torch.Tensor, context: Sequence[int]) -> tuple[int, torch.Tensor | None]:
        """A draft model's token and the distribution q it came from (greedy: its argmax, no q)."""
        if self.greedy:
            return self.argmax(logits, context), None
        q = self.probs(logits, context)
        return self.draws.token(q), q


def speculative_generate(
    target: ModelLike,
    prompt: Sequence[int],
    max_new_tokens: int,
    draft: str | ModelLike | Draft = "lookup",
    k: int = 4,
    sampler: SamplerConfig | None = None,
    seed: int = 0,
    eos_id: int | None = None,
) -> SpeculativeResult:
    """Speculative decoding of one prompt: greedy (``sampler`` None or greedy) gives plain greedy's tokens; a
    sampling ``sampler`` gives plain sampling's distribution (other draws than plain sampling's, so other tokens).

    ``draft``: ``"lookup"`` (prompt lookup, 2-grams), ``"layers:N"`` (the target's first N layers), or a smaller
    model with the same vocabulary (anything :func:`~genprobe.engine.runner.runner_for` takes)."""
    decoder = SpeculativeDecoder(target, draft, k, sampler, SeededDraws(seed), eos_id)
    return decoder.run(prompt, max_new_tokens)
