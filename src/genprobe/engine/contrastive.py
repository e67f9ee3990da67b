"""Contrastive search (Su et al. 2022) with HF's semantics, over our KV cache or a transformers model's.

Each step keeps the ``top_k`` most probable next tokens (after the adjustments: bans, penalties,
no-repeat-n-gram, DRY — HF's logits processors), runs all of them through the model in one batch
of B·k rows, and picks per row the candidate maximising

    (1 − α) · p(candidate) − α · max_j cos(h_candidate, h_j)

where ``h`` is the model's last hidden state (after the final norm, what HF's
``hidden_states[-1]`` holds) and ``j`` runs over every earlier real position, prompt included
(transformers 4.x ``GenerationMixin._contrastive_search`` / ``_ranking_fast``; transformers 5
moved it to a Hub repository). The chosen candidate's forward already produced the next step's
logits and cache entry, so a step costs one batched forward of k tokens per row.

The cache holds B·k rows for the whole generation. HF copies the whole cache twice per step
(repeat, then select); for our :class:`~genprobe.engine.cache.KVCache` only the newest slot is
copied from the chosen row to the others of its group. A transformers cache is handled as HF does
(``batch_select_indices``).
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Sequence

import torch

from .._io import json_safe
from .cache import KVCache
from .runner import GenerationResult, ModelLike, RowEnds, Runner, check_inputs, device_of, left_padded, runner_for
from .samplers.chain import adjust_logits, check_logits
from .samplers.stages import SamplerConfig


def expand_state(state: Any, k: int) -> Any:
    """The per-generation cache state with every row repeated ``k`` times (row b → rows b·k … b·k+k−1)."""
    if isinstance(state, KVCache):
        if state.window is not None:
            raise ValueError("contrastive search does not support a sliding-window KVCache")
        big = copy.copy(state)  # the counters and flags as they are; the tensors repeated (fresh, written in place)
        big.batch_size = state.batch_size * k
        big.k, big.v = state.k.repeat_interleave(k, dim=1), state.v.repeat_interleave(k, dim=1)
        big.pos, big.valid = state.pos.repeat_interleave(k, dim=0), state.valid.repeat_interleave(k, dim=0)
        big.next_pos = state.next_pos.repeat_interleave(k)
        return big
    state.cache.batch_repeat_interleave(k)
    state.mask = state.mask.repeat_interleave(k, dim=0)
    state.next_pos = state.next_pos.repeat_interleave(k)
    return state


def keep_rows(state: Any, rows: torch.Tensor) -> None:
    """Make row i of the state hold row ``rows[i]``'s newest entry (our cache) or whole history (HF)."""
    if isinstance(state, KVCache):
        slot = state.seen - 1  # every row of a group differs only in the slot just written
        for buf in (state.k[:, :, :, slot], state.v[:, :, :, slot]):
            buf.copy_(buf.index_select(1, rows))
        return
    state.cache.batch_select_indices(rows.to(state.mask.device))


def rank_candidates(
    context: torch.Tensor, context_mask: torch.Tensor, cand_hidden: torch.Tensor, cand_probs: torch.Tensor, alpha: float
) -> torch.Tensor:
    """Index (B,) of the best of k candidates: (1 − α)·p − α·max cosine to the context (HF _ranking_fast)."""
    B, k = cand_probs.shape
    ctx = context.repeat_interleave(k, dim=0)
    norm_ctx = ctx / ctx.norm(dim=2, keepdim=True)
    norm_next = cand_hidden / cand_hidden.norm(dim=2, keepdim=True)
    cosine = torch.matmul(norm_ctx, norm_next.transpose(1, 2)).squeeze(-1)  # (B·k, S)
    mask = context_mask.repeat_interleave(k, dim=0).to(cosine.dtype)
    cosine = cosine + (1 - mask) * torch.finfo(cosine.dtype).min  # padding never counts
    penalty = cosine.max(dim=-1).values
    score = (1.0 - alpha) * cand_probs.reshape(-1) - alpha * penalty
    return torch.stack(torch.split(score, k)).max(dim=-1).indices


class _Search:
    """One contrastive search over a left-padded batch: cache state, context hidden states, next logits."""

    def __init__(self, runner: Runner, cfg: SamplerConfig, buf: torch.Tensor, valid: torch.Tensor, P: int):
        self.runner, self.cfg, self.buf, self.valid, self.P = runner, cfg, buf, valid, P
        assert cfg.top_k is not None  # SamplerConfig validation: contrastive search needs top_k >= 2
        self.k = int(cfg.top_k)
        self.history = torch.where(valid, buf, -1)  # what the penalties read; -1 = padding
        self.groups = torch.arange(buf.shape[0], device=buf.device) * self.k
        # Cached forward -> (logits (B, T, V), last hidden state after the final norm (B, T, d)): the runner's
        # optional hook (the eager runners of our GPT and of transformers models have it).
        forward = getattr(runner, "step_with_hidden", None)
        if forward is None:
            raise TypeError(f"contrastive search needs a runner with step_with_hidden, got {type(runner).__name__}")
        self.forward: Callable[..., tuple[torch.Tensor, torch.Tensor]] = forward

    def prefill(self) -> None:
        """Run the prompts once (B rows), keep their hidden states, then repeat the cache k times."""
        B, P = self.buf.shape[0], self.P
        state = self.runner.new_state(B, self.buf.shape[1])
        padded = not bool(self.valid[:, :P].all())
        logits, hidden = self.forward(self.buf[:, :P], self.valid[:, :P] if padded else None, state)
        self.context = hidden.new_zeros(B, self.buf.shape[1], hidden.shape[-1])
        self.context[:, :P] = hidden
        self.next_logits = logits[:, -1].float()
        self.state = expand_state(state, self.k)

    def step(self, cur: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Choose the token at position ``cur`` per row → (token ids (B,), candidate distribution (B, V))."""
        check_logits(self.next_logits, sampling=False)
        adjusted = adjust_logits(self.next_logits, self.history[:, :cur], self.cfg, prompt_len=self.P)
        probs = torch.softmax(adjusted, dim=-1)
        cand_probs, cand_ids = torch.topk(probs, dim=-1, k=self.k)
        out, cand_hidden = self.forward(cand_ids.reshape(-1, 1), None, self.state)
        alpha = self.cfg.penalty_alpha
        sel = rank_candidates(self.context[:, :cur], self.valid[:, :cur], cand_hidden, cand_probs, alpha)
        chosen = self.groups + sel
        keep_rows(self.state, chosen.repeat_interleave(self.k))
        self.context[:, cur] = cand_hidden[chosen, -1]
        self.next_logits = out[chosen, -1].float()
        return cand_ids[torch.arange(len(sel), device=sel.device), sel], probs


def contrastive_generate(
    model: ModelLike,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampler: SamplerConfig,
    eos_id: int | None = None,
    on_token: Callable[[int, list[int]], None] | None = None,
    return_logits: bool = False,
    return_probs: bool = False,
) -> GenerationResult:
    """Contrastive search for a left-padded batch; a :class:`~genprobe.engine.runner.GenerationResult`.

    ``step_probs`` (``return_probs``) are the candidate distributions: softmax of the adjusted logits.
    """
    runner = runner_for(model)
    P = check_inputs(runner, prompts, max_new_tokens, "cached")
    N, B = int(max_new_tokens), len(prompts)
    assert sampler.top_k is not None  # SamplerConfig validation: contrastive search needs top_k >= 2
    if sampler.top_k > runner.vocab_size:
        raise ValueError(f"top_k={sampler.top_k} candidates exceed the vocabulary of {runner.vocab_size} tokens")
    buf, valid = left_padded(prompts, P, N, runner.pad_id, device_of(runner))
    search = _Search(runner, sampler, buf, valid, P)
    ends, steps = RowEnds(B, N, eos_id, buf.device), 0
    step_logits: list[torch.Tensor] | None = [] if return_logits else None
    step_probs: list[torch.Tensor] | None = [] if return_probs else None
    t0 = time.perf_counter()
    with torch.inference_mode():
        search.prefill()
        for i in range(N):
            if step_logits is not None:
                step_logits.append(search.next_logits.detach().clone())
            nxt, probs = search.step(P + i)
            if step_probs is not None:
                step_probs.append(probs)
            shown = torch.where(ends.done, torch.full_like(nxt, -1), nxt)  # finished rows emit nothing
            buf[:, P + i], valid[:, P + i] = torch.where(ends.done, runner.pad_id, nxt), True  # in the cache either way
            search.history[:, P + i] = shown
            steps = i + 1
            if on_token is not None:
                on_token(i, shown.tolist())
            if ends.update(i, nxt):
                break
    tokens = ends.tokens(buf, P, steps)
    prompt_tokens = [list(map(int, p)) for p in prompts]
    counts = (P + steps * search.k, 1 + steps, "contrastive", json_safe(sampler), time.perf_counter() - t0)
    return GenerationResult(tokens, prompt_tokens, ends.finished, *counts, step_logits, step_probs)
