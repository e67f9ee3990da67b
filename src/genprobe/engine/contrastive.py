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
from typing import Any, Callable

import torch

from .cache import KVCache
from .runner import Run
from .samplers.chain import adjust_logits, check_logits


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


class ContrastiveRun(Run):
    """One contrastive search over a left-padded batch: :func:`~genprobe.engine.generate.generate`'s loop with the
    prompts prefilled once (B rows, then the cache repeated k times) and each step one batched forward of the k
    candidates per row. ``step_probs`` are the candidate distributions: softmax of the adjusted logits."""

    history: torch.Tensor  # what the penalties read, always kept: the candidates are ranked after the adjustments

    def __init__(self, *args: Any):
        super().__init__(*args)
        cfg, runner, self.mode = self.cfg, self.runner, "contrastive"
        assert cfg.top_k is not None  # SamplerConfig validation: contrastive search needs top_k >= 2
        self.k = int(cfg.top_k)
        if self.k > runner.vocab_size:
            raise ValueError(f"top_k={self.k} candidates exceed the vocabulary of {runner.vocab_size} tokens")
        self.history = torch.where(self.valid, self.buf, -1)  # what the penalties read; -1 = padding
        self.groups = torch.arange(self.buf.shape[0], device=self.buf.device) * self.k
        # Cached forward -> (logits (B, T, V), last hidden state after the final norm (B, T, d)): the runner's
        # optional hook (the eager runners of our GPT and of transformers models have it).
        forward = getattr(runner, "step_with_hidden", None)
        if forward is None:
            raise TypeError(f"contrastive search needs a runner with step_with_hidden, got {type(runner).__name__}")
        self.forward: Callable[..., tuple[torch.Tensor, torch.Tensor]] = forward

    def logits(self, i: int, state: Any) -> torch.Tensor:
        """The next logits: at step 0 the prompts' (run once, their hidden states kept, the cache then repeated k
        times), later the chosen candidate's, from the step that chose it."""
        if i == 0:
            P, padded = self.P, not bool(self.valid[:, : self.P].all())
            logits, hidden = self.forward(self.buf[:, :P], self.valid[:, :P] if padded else None, state)
            self.context = hidden.new_zeros(*self.buf.shape, hidden.shape[-1])
            self.context[:, :P] = hidden
            self.next_logits = logits[:, -1].float()
            self.state = expand_state(state, self.k)
            self.forwards, self.calls = P, 1
        return self.next_logits

    def choose(self, logits: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
        """Each row's best of its k most probable candidates, all run through the model in one batch of B·k rows."""
        cur = self.P + self.steps
        check_logits(logits, sampling=False)
        adjusted = adjust_logits(logits, self.history[:, :cur], self.cfg, prompt_len=self.P)
        probs = torch.softmax(adjusted, dim=-1)
        cand_probs, cand_ids = torch.topk(probs, dim=-1, k=self.k)
        out, cand_hidden = self.forward(cand_ids.reshape(-1, 1), None, self.state)
        alpha = self.cfg.penalty_alpha
        sel = rank_candidates(self.context[:, :cur], self.valid[:, :cur], cand_hidden, cand_probs, alpha)
        chosen = self.groups + sel
        keep_rows(self.state, chosen.repeat_interleave(self.k))
        self.context[:, cur] = cand_hidden[chosen, -1]
        self.next_logits = out[chosen, -1].float()
        self.forwards, self.calls = self.forwards + self.k, self.calls + 1
        if self.step_logits is not None:
            self.step_logits.append(logits.detach().clone())
        if self.step_probs is not None:
            self.step_probs.append(probs)
        return cand_ids[torch.arange(len(sel), device=sel.device), sel]

    def write(self, i: int, nxt: torch.Tensor) -> torch.Tensor:
        """Append ``nxt``: a finished row's token is padding, in the cache either way, and shown as -1."""
        cur, done = self.P + i, self.done
        shown = torch.where(done, torch.full_like(nxt, -1), nxt)  # finished rows emit nothing
        self.buf[:, cur], self.valid[:, cur] = torch.where(done, self.runner.pad_id, nxt), True
        self.history[:, cur] = shown
        self.steps = i + 1
        return shown
