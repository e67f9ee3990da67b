"""Deliberately broken cached-attention implementations: the tests of the test (chapter §3.4.9, §3.9).

:class:`TeachingCache` is the chapter's §3.10 teaching version — a list of per-layer K/V grown with
``torch.cat`` — run over a genprobe ``GPT``'s own weights, with one line switched per mutant:

=============  ==============================================  =========================
mutant         the one wrong line                              expected
=============  ==============================================  =========================
correct        —                                               pass
pos_zero       position embedding ``arange(T)`` every call     flagged (decode steps)
no_cat         ``K = k`` (overwrite instead of append)          flagged (decode steps)
no_mask        no causal mask inside the cached path           flagged (prefill/chunks only)
kv_mismatch    K prepended, V appended                         flagged
cat_order      K *and* V prepended (joint permutation)         pass (seed Eq. 3.26–3.29)
=============  ==============================================  =========================

The mask is built from the absolute positions stored next to the keys (in the keys' order), so
``cat_order`` is a true joint permutation even for multi-token chunks. The mutants live here, not
as flags in the engine: production code carries no bug switches.
"""

from __future__ import annotations

from typing import Any, Sequence, cast

import torch
import torch.nn.functional as F

from .._io import json_safe_dict
from ..model.gpt import GPT, Block, rope_rotate
from .adapters import EngineAdapter, FullRecompute
from .compare import Thresholds, max_abs_diff
from .harness import ReferenceRun, verify_implementation
from .report import VerifyReport

MUTANTS: dict[str, str] = {
    "correct": "pass",
    "pos_zero": "flagged",
    "no_cat": "flagged",
    "no_mask": "flagged",
    "kv_mismatch": "flagged",
    "cat_order": "pass",
}

DEFAULT_PROMPT = "春江潮水连海平"  # the chapter's prompt (§3.9.1), 50 greedy steps


class TeachingCache:
    """The §3.10 list-and-cat cache over ``model``'s weights, with an optional planted ``bug``."""

    def __init__(self, model: GPT, bug: str = "correct"):
        if bug not in MUTANTS:
            raise ValueError(f"unknown mutant {bug!r}; choose from {list(MUTANTS)}")
        if model.cfg.pos_encoding not in ("learned", "rope", "none"):
            raise ValueError(f"mutants support pos_encoding learned/rope/none, not {model.cfg.pos_encoding!r}")
        self.model = model.eval()
        self.bug = bug
        self.name = bug
        self.max_positions = model.cfg.block_size if model.cfg.pos_encoding == "learned" else None
        self.reset()

    def reset(self) -> None:
        """Empty per-layer K/V lists and the position counter."""
        n = self.model.cfg.n_layer
        self.k: list[torch.Tensor | None] = [None] * n
        self.v: list[torch.Tensor | None] = [None] * n
        self.kpos: torch.Tensor | None = None  # absolute position of every cached key, in K's order
        self.past = 0

    def prefill(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """First call of a sequence (the teaching version has no padding support)."""
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise NotImplementedError("the teaching cache has no left-padding support")
        self.reset()
        return self._forward(ids)

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Continue the sequence with T_new tokens."""
        return self._forward(ids)

    def _append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        K, V = self.k[layer], self.v[layer]
        if K is None or V is None or self.bug == "no_cat":  # K and V are set together
            K, V = k, v  # no_cat: the cache is overwritten, history is lost
        elif self.bug == "kv_mismatch":
            K, V = torch.cat([k, K], dim=-2), torch.cat([V, v], dim=-2)
        elif self.bug == "cat_order":
            K, V = torch.cat([k, K], dim=-2), torch.cat([v, V], dim=-2)
        else:
            K, V = torch.cat([K, k], dim=-2), torch.cat([V, v], dim=-2)
        self.k[layer], self.v[layer] = K, V
        return K, V

    def _key_positions(self, new: torch.Tensor) -> torch.Tensor:
        if self.kpos is None or self.bug == "no_cat":
            return new
        if self.bug in ("kv_mismatch", "cat_order"):  # positions travel with K
            return torch.cat([new, self.kpos])
        return torch.cat([self.kpos, new])

    @torch.no_grad()
    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        m, cfg = self.model, self.model.cfg
        B, T = ids.shape
        H, Dh, C = cfg.n_head, cfg.d_head, cfg.d_model
        true_pos = torch.arange(self.past, self.past + T)
        # pos_zero: the embedding (and RoPE) positions restart at 0; the mask still uses true positions.
        emb_pos = torch.arange(T) if self.bug == "pos_zero" else true_pos
        m.check_positions(true_pos)
        emb_pos_b = emb_pos.expand(B, T)
        self.kpos = self._key_positions(true_pos)
        allow = self.kpos[None, :] <= true_pos[:, None]  # (T, Tk) from absolute positions, not indices
        if self.bug == "no_mask":
            allow = torch.ones_like(allow)
        mask = allow[None, None].expand(B, 1, T, allow.shape[-1])

        x = m.wte(ids)
        if m.wpe is not None:
            x = x + m.wpe(emb_pos_b)
        for i, block in enumerate(cast(Sequence[Block], m.h)):  # GPT.h: a ModuleList of Blocks (untyped items)
            a = block.attn
            q, k, v = a.c_attn(block.ln_1(x)).split(C, dim=2)
            q = q.view(B, T, H, Dh).transpose(1, 2)
            k = k.view(B, T, H, Dh).transpose(1, 2)
            v = v.view(B, T, H, Dh).transpose(1, 2)
            if cfg.pos_encoding == "rope":
                q = rope_rotate(q, emb_pos_b, cfg.rope_base)
                k = rope_rotate(k, emb_pos_b, cfg.rope_base)
            K, V = self._append(i, k, v)
            y = F.scaled_dot_product_attention(q, K, V, attn_mask=mask)
            x = x + a.c_proj(y.transpose(1, 2).reshape(B, T, C))
            x = x + block.mlp(block.ln_2(x))
        self.past += T
        logits: torch.Tensor = m.lm_head(m.ln_f(x))
        return logits


def mutant(model: GPT, name: str) -> TeachingCache:
    """The named mutant adapter over ``model``'s weights."""
    return TeachingCache(model, name)


def as_expected(name: str, verdict: str) -> bool:
    """A known bug must be flagged (verdict above noise); correct/cat_order must pass."""
    return (verdict == "pass") == (MUTANTS[name] == "pass")


def run_mutant_reports(
    model: GPT,
    prompts: list[list[int]],
    steps: int = 50,
    names: Sequence[str] = tuple(MUTANTS),
    chunk_sizes: Sequence[int] = (1, 4),
    thresholds: Thresholds | None = None,
    run: ReferenceRun | None = None,
) -> list[VerifyReport]:
    """Full harness reports for each mutant (reference trajectories computed once).

    No padded batch (the teaching cache has no padding) and no isolation phase: every mutant shares
    the same correct ``reset()``, so isolation would only repeat the incremental phase's finding.
    """
    run = run or ReferenceRun(FullRecompute(model), steps)
    return [
        verify_implementation(
            mutant(model, n),
            run,
            prompts,
            steps=steps,
            chunk_sizes=chunk_sizes,
            padded_batch=False,
            thresholds=thresholds,
            name=n,
            isolation=False,
        )
        for n in names
    ]


def report_row(r: VerifyReport, expected: str | None = None) -> dict[str, Any]:
    """One row of the chapter's §3.9.8 table (its keys are what the case study's ch3_case.json records)."""
    row: dict[str, Any] = {
        "impl": r.impl,
        "prefill_bit_identical": r.prefill_bit_identical,
        "first_any_diff_step": r.first_any_diff_step,
        "first_diff_step": r.first_diff_step,
        "max_abs_dlogit": r.max_abs_dlogit,
        "worst_phase": r.worst_phase,
        "greedy_max_abs_dlogit": r.greedy_max_abs_dlogit,
        "max_abs_dlogit_by_phase": r.max_by_phase(),
        "text_divergences": r.text_divergences,
        "text_only_would_catch": r.text_only_would_catch,
        "verdict": r.verdict,
    }
    if expected is not None:
        row["expected"] = expected
        row["as_expected"] = (r.verdict == "pass") == (expected == "pass")  # see as_expected()
    return json_safe_dict(row)


def report_row_detailed(r: VerifyReport, expected: str | None = None) -> dict[str, Any]:
    """:func:`report_row` plus every phase's first differing step and verdict, the relative scale and errors."""
    judged = [p for p in r.phases if p.judged]
    return json_safe_dict(
        {
            **report_row(r, expected),
            "first_diff_step_by_phase": r.first_diff_by_phase(),
            "verdict_by_phase": {p.phase: p.verdict for p in r.phases},
            "max_rel_dlogit": max((p.rel_dlogit or 0.0 for p in judged), default=None),
            "errors": [e.to_dict() for e in r.errors],
        }
    )


def run_mutants(
    model: GPT, prompt_ids: list[int], steps: int = 50, thresholds: Thresholds | None = None
) -> list[dict[str, Any]]:
    """The chapter §3.9.1 table: one row per mutant (``cache_bugs`` in the case study)."""
    reports = run_mutant_reports(model, [list(prompt_ids)], steps, thresholds=thresholds)
    return [report_row(r, MUTANTS[r.impl]) for r in reports]


@torch.no_grad()
def _chunked(impl: TeachingCache, seq: list[int], chunk: int) -> torch.Tensor:
    impl.reset()
    outs = []
    for start in range(0, len(seq), chunk):
        piece = torch.tensor([seq[start : start + chunk]], dtype=torch.long)
        outs.append(impl.prefill(piece) if start == 0 else impl.step(piece))
    return torch.cat(outs, dim=1)


def mask_noop(
    model: GPT, prompt_ids: list[int], steps: int = 50, chunk: int = 4, run: ReferenceRun | None = None
) -> dict[str, Any]:
    """no_mask vs correct on the same cached path: exactly 0 at T_new = 1, non-zero with chunks (§3.9.4)."""
    run = run or ReferenceRun(FullRecompute(model), steps)
    tr = run.trajectory(prompt_ids)
    seq = tr.prompt + tr.tokens[:-1]
    good, bad = TeachingCache(model, "correct"), TeachingCache(model, "no_mask")
    return {
        "no_mask_t_new_1": max_abs_diff(_chunked(bad, seq, 1), _chunked(good, seq, 1)),
        f"no_mask_chunk_{chunk}": max_abs_diff(_chunked(bad, seq, chunk), _chunked(good, seq, chunk)),
    }


def cache_exact(model: GPT, prompt_ids: list[int], steps: int = 50) -> dict[str, Any]:
    """The engine vs full recomputation (chapter §3.4.3: prefill 0.0, incremental ~1.9e-6)."""
    r = verify_implementation(
        EngineAdapter(model),
        FullRecompute(model),
        [list(prompt_ids)],
        steps=steps,
        chunk_sizes=(4,),
        padded_batch=False,
        isolation=False,
    )
    return {
        "prefill_max_abs_dlogit": r.phase("prefill").max_abs_dlogit,
        "incremental_max_abs_dlogit": r.phase("incremental").max_abs_dlogit,
        "chunk4_max_abs_dlogit": r.phase("chunk_4").max_abs_dlogit,
        "prefill_bit_identical": r.prefill_bit_identical,
        "verdict": r.verdict,
    }
