"""Deliberately broken cached-attention implementations: the tests of the test (chapter §3.4.9, §3.9).

:class:`TeachingCache` (the chapter's §3.10 list-and-cat cache, one line switched per mutant), :class:`PrefixCache`
(serving engines' block cache) and :class:`SlotCache` (llama.cpp's server slot), whose flaws the prefix-reuse phases
show, and :func:`row_swap`, which only the padded batch shows; all tabled in docs/verify-cache.md. The mutants live
here, not as flags in the engine: production code carries no bug switches.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import torch

from .._io import json_safe
from ..model.gpt import GPT
from ..model.llama_family import llama_family_of
from ..model.position_lm import PositionDrivenLM
from .adapters import EngineAdapter, FullRecompute, HFAdapter
from .harness import DEFAULTS, ReferenceRun, VerifyOptions, chunk_calls, verify_implementation
from .report import VerifyReport, max_abs_diff

TEACHING = ("correct", "pos_zero", "no_cat", "no_mask", "kv_mismatch", "cat_order")
BATCHED = ("batch_row_swap",)  # mutants of a batched cache: the padded-batch phase runs for them
PREFIX_BLOCK = 16  # the block size of the prefix-cache mutants (vLLM's default)

LLAMA_ARCHS = ("llama", "qwen2", "mistral")  # transformers architectures the teaching cache runs over
DEFAULT_PROMPT = "春江潮水连海平"  # the chapter's prompt (§3.9.1), 50 greedy steps


# ---- the teaching cache: the model's own forward, with the list-and-cat cache as its CacheLike ---------------
def teaching_view(model: Any) -> PositionDrivenLM:
    """The position-driven forward the teaching cache plugs into: a genprobe GPT, or
    :class:`~genprobe.model.llama_family.LlamaFamily` over a transformers Llama-family model's own weights."""
    if isinstance(model, GPT):
        if model.cfg.pos_encoding not in ("learned", "rope", "none"):
            raise ValueError(f"mutants support pos_encoding learned/rope/none, not {model.cfg.pos_encoding!r}")
        return model.eval()
    arch = getattr(getattr(model, "config", None), "model_type", None)
    if arch in LLAMA_ARCHS and hasattr(model, "model") and hasattr(model, "lm_head"):
        return llama_family_of(model.eval())
    raise ValueError(
        f"mutants run on a genprobe GPT, a transformers GPT-2 (converted) or {'/'.join(LLAMA_ARCHS)} model, "
        f"not {arch or type(model).__name__!r}"
    )


class TeachingCache:
    """The §3.10 list-and-cat cache over ``model``'s weights, with a planted bug ``flaw`` (one of :data:`TEACHING`).

    It is the cache (:class:`~genprobe.model.cache_protocol.CacheLike`) of the model's own forward, which calls
    :meth:`reserve` (the key positions its mask is built from) and :meth:`write` per layer: the bugs live there.
    """

    FLAWS: tuple[str, ...] = TEACHING
    prefill_starts_sequence = True  # prefill() resets
    decode_mask_free = False  # every call's mask is built from reserve()'s key positions (no_mask's bug)

    def __init__(self, model: Any, flaw: str = "correct"):
        if flaw not in self.FLAWS:
            raise ValueError(f"unknown mutant {flaw!r} of {type(self).__name__}; choose from {list(self.FLAWS)}")
        self.lm, self.model, self.name, self.flaw = teaching_view(model), model, flaw, flaw
        self.bug = flaw if flaw in TEACHING else "correct"  # a prefix/slot cache's flaw lies in its reuse, not here
        self.max_positions = self.lm.cfg.max_positions
        self.reset()

    def reset(self) -> None:
        n = self.lm.cfg.n_layer
        self.k: list[torch.Tensor | None] = [None] * n
        self.v: list[torch.Tensor | None] = [None] * n
        self.kpos: torch.Tensor | None = None  # absolute position of every cached key, in K's order
        self.past = 0

    @staticmethod
    def refuse_padding(attention_mask: torch.Tensor | None) -> None:
        """The teaching caches hold unpadded rows: NotImplementedError (the padded-batch phase is skipped)."""
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise NotImplementedError("the teaching cache has no left-padding support")

    def prefill(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """First call of a sequence (the teaching version has no padding support)."""
        self.refuse_padding(attention_mask)
        self.reset()
        return self._forward(ids)

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        return self._forward(ids)

    def _cat(self, old: torch.Tensor | None, new: torch.Tensor, prepend: bool) -> torch.Tensor:
        """``new`` appended to ``old`` along the sequence (prepended with ``prepend``); no_cat: ``new`` replaces it."""
        if old is None or self.bug == "no_cat":  # no_cat: the cache is overwritten, history is lost
            return new
        return torch.cat([new, old] if prepend else [old, new], dim=-2 if new.dim() > 1 else 0)

    @torch.no_grad()
    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        # pos_zero: the embedding (and RoPE) positions restart at 0; reserve() keeps the mask on true positions.
        pos = torch.arange(T) if self.bug == "pos_zero" else torch.arange(self.past, self.past + T)
        out: torch.Tensor = self.lm(ids, pos.expand(B, T), cache=self)
        self.past += T
        return out.float()

    # ---- CacheLike: what the model's forward calls ----
    def default_positions(self, T: int, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Positions continuing the sequence (unused: :meth:`_forward` always passes them)."""
        return torch.arange(self.past, self.past + T)[None]

    def reserve(
        self, positions: torch.Tensor, valid: torch.Tensor | None, explicit_positions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Record the new keys' true positions (K prepended for kv_mismatch / cat_order: they travel with K) and
        return every key's position as the queries' ``positions`` count them, so the mask is causal on true
        positions (no_mask: every key at 0, visible to all)."""
        B, T = positions.shape
        k_first = self.bug in ("kv_mismatch", "cat_order")
        self.kpos = self._cat(self.kpos, torch.arange(self.past, self.past + T), k_first)
        k_pos = torch.zeros_like(self.kpos) if self.bug == "no_mask" else self.kpos - (self.past - positions[0, 0])
        return k_pos.expand(B, -1), None

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (or, per bug, prepend / overwrite) ``layer``'s new keys and values; return all of them."""
        K = self.k[layer] = self._cat(self.k[layer], k, self.bug in ("kv_mismatch", "cat_order"))
        V = self.v[layer] = self._cat(self.v[layer], v, self.bug == "cat_order")
        return K, V

    def commit(self) -> None:
        """Nothing to advance: :meth:`_forward` counts the positions."""


class PrefixCache(TeachingCache):
    """A prefix cache over the teaching cache: full blocks of ``block`` tokens kept across sequences.

    Like vLLM's prefix caching, a block is stored with the keys/values of every layer (and, since the
    protocol returns every prompt position's logits, their logits) under a key of the tokens it depends
    on: all tokens up to its end. A prefill reuses the longest chain of stored blocks that leaves at
    least one token to compute. ``reset()`` ends the sequence and keeps the blocks. The flaws (the key
    covers too little: :meth:`_key`) are tabled in docs/verify-cache.md.
    """

    FLAWS = ("prefix_correct", "prefix_half_key", "prefix_stale_tail", "prefix_no_parent")

    def __init__(self, model: Any, flaw: str = "prefix_correct", block: int | None = None):
        super().__init__(model, flaw)
        if block is None:  # 16, or 8 where the context holds fewer than 3 blocks of 16 (a later block must exist)
            short = self.max_positions is not None and self.max_positions < 3 * PREFIX_BLOCK
            block = PREFIX_BLOCK // 2 if short else PREFIX_BLOCK
        self.block = block
        self.reused = 0  # blocks taken from the store, over all sequences
        self.store: dict[tuple[Any, ...], tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]] = {}

    def _key(self, ids: list[int], j: int) -> tuple[Any, ...]:
        """The lookup key of block ``j`` of ``ids``."""
        b = self.block
        if self.flaw == "prefix_half_key":
            return tuple(ids[: j * b + b // 2])
        if self.flaw == "prefix_stale_tail":
            return tuple(ids[: (j + 1) * b - 1])
        if self.flaw == "prefix_no_parent":
            return (j, *ids[j * b : (j + 1) * b])
        return tuple(ids[: (j + 1) * b])

    def prefill(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Reuse stored blocks (one row, no padding), compute the rest, store the new full blocks."""
        if ids.shape[0] != 1:
            return super().prefill(ids, attention_mask)
        self.refuse_padding(attention_mask)
        self.reset()
        toks, b = [int(t) for t in ids[0]], self.block
        hit = 0
        while (hit + 1) * b < len(toks) and self._key(toks, hit) in self.store:
            hit += 1
        blocks = [self.store[self._key(toks, j)] for j in range(hit)]
        self.reused += hit
        if blocks:
            self.k = [torch.cat([blk[0][i] for blk in blocks], dim=-2) for i in range(self.lm.cfg.n_layer)]
            self.v = [torch.cat([blk[1][i] for blk in blocks], dim=-2) for i in range(self.lm.cfg.n_layer)]
            self.kpos, self.past = torch.arange(hit * b), hit * b
        out = self._forward(ids[:, hit * b :])
        if blocks:
            out = torch.cat([torch.cat([blk[2] for blk in blocks], dim=1), out], dim=1)
        for j in range(len(toks) // b):
            key = self._key(toks, j)
            if key not in self.store:  # the first writer wins, as in a block table
                sl = slice(j * b, (j + 1) * b)
                k_, v_ = [K[..., sl, :] for K in self.k], [V[..., sl, :] for V in self.v]  # type: ignore[index]
                self.store[key] = (k_, v_, out[:, sl])
        return out


class SlotCache(TeachingCache):
    """One slot that keeps its last sequence across sequences, as llama.cpp's server does with ``cache_prompt``.

    A new prompt reuses the keys/values (and logits) of its longest common prefix with the slot's tokens, at
    most all but its last token (llama.cpp recomputes the last one to have its logits: ``server.cpp``, "we have
    to evaluate at least 1 token"), and the slot's later entries are dropped. The flaw, ``slot_no_truncate``: a
    prompt the slot holds whole is answered from the slot and the slot's later entries stay in the attention —
    only a prompt *shorter* than the cached sequence shows it (docs/verify-cache.md).
    """

    FLAWS = ("slot_correct", "slot_no_truncate")

    def __init__(self, model: Any, flaw: str = "slot_correct"):
        self.slot: tuple[list[int], list[Any], list[Any], torch.Tensor] | None = None
        self.tokens: list[int] = []
        self.logits: list[torch.Tensor] = []
        super().__init__(model, flaw)
        self.reused = 0  # prompt tokens answered from the slot, over all sequences

    def reset(self) -> None:
        """End the sequence; the slot keeps it (its bookkeeping right: a stale tail is dropped now)."""
        if self.tokens:
            a, b = getattr(self, "stale", (0, 0))
            k, v = (
                [torch.cat([t[..., :a, :], t[..., b:, :]], dim=-2) for t in kv if t is not None]
                for kv in (self.k, self.v)
            )
            self.slot = (self.tokens, k, v, torch.cat(self.logits, dim=1))
        super().reset()
        self.tokens, self.logits, self.stale = [], [], (0, 0)

    def prefill(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Reuse the common prefix with the slot (one row, no padding), compute the rest."""
        if ids.shape[0] != 1:
            raise NotImplementedError("the slot cache holds one sequence")
        self.refuse_padding(attention_mask)
        self.reset()
        toks = [int(t) for t in ids[0]]
        slot_toks, K, V, logits = self.slot if self.slot is not None else ([], [], [], torch.empty(0))
        pairs = zip(toks, slot_toks, strict=False)
        common = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(toks), len(slot_toks)))
        if self.flaw == "slot_no_truncate" and common == len(toks) < len(slot_toks):
            n = len(toks)  # the slot's tail stays in the cache, its positions marked as past: visible to what follows
            self.k, self.v = list(K), list(V)
            self.kpos, self.past = torch.cat([torch.arange(n), torch.zeros(len(slot_toks) - n, dtype=torch.long)]), n
            self.stale = (n, len(slot_toks))
            self.reused += n
            return self._keep(toks, logits[:, :n])
        keep = min(common, len(toks) - 1)
        if keep:
            self.k, self.v = [k[..., :keep, :] for k in K], [v[..., :keep, :] for v in V]
            self.kpos, self.past = torch.arange(keep), keep
            self.reused += keep
        out = self._forward(ids[:, keep:])
        return self._keep(toks, torch.cat([logits[:, :keep], out], dim=1) if keep else out)

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        return self._keep([int(t) for t in ids[0]], self._forward(ids))

    def _keep(self, toks: list[int], out: torch.Tensor) -> torch.Tensor:
        self.tokens += toks
        self.logits.append(out)
        return out


PASSING = ("correct", "cat_order", "prefix_correct", "slot_correct")  # correct variants: every other must be flagged
MUTANTS = {
    n: "pass" if n in PASSING else "flagged" for n in (*TEACHING, *PrefixCache.FLAWS, *SlotCache.FLAWS, *BATCHED)
}


def row_swap(model: Any) -> Any:
    """``batch_row_swap``: the model's own cache (our engine's ``KVCache``, or the transformers model's default cache)
    whose every batched write after the prefill stores rows 0 and 1's new keys/values in each other's row (a batch
    reordered without reordering its cache, as a forgotten ``reorder_cache`` in beam search); a single sequence is
    untouched."""
    ours = isinstance(model, GPT)
    impl, write = (EngineAdapter(model), "write") if ours else (HFAdapter(model), "update")
    prefill = impl.prefill

    def swap(a: Any) -> Any:  # a batched write's (write(layer, k, v), update(k, v, layer)) rows 0 and 1 exchanged
        if not (isinstance(a, torch.Tensor) and a.dim() == 4 and a.shape[0] > 1):
            return a
        return a[torch.tensor([1, 0, *range(2, a.shape[0])])]

    def swapping_prefill(ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        out, original = prefill(ids, attention_mask), getattr(impl.cache, write)
        setattr(impl.cache, write, lambda *args, **kw: original(*map(swap, args), **kw))
        return out

    impl.prefill = swapping_prefill  # type: ignore[method-assign]
    impl.name = "batch_row_swap"
    return impl


def mutant(model: Any, name: str) -> Any:
    """The named mutant adapter over ``model``'s weights (a genprobe GPT or a transformers Llama-family model)."""
    if name == "batch_row_swap":
        return row_swap(model)
    return next((c for c in (PrefixCache, SlotCache) if name in c.FLAWS), TeachingCache)(model, name)


def run_mutant_reports(
    model: Any,
    prompts: list[list[int]],
    opts: VerifyOptions = DEFAULTS,
    names: Sequence[str] = tuple(MUTANTS),
    run: ReferenceRun | None = None,
) -> list[VerifyReport]:
    """Full harness reports for each mutant (reference trajectories computed once) under ``opts``.

    No padded batch for the teaching-cache mutants (the teaching cache has no padding; the batched ones,
    :data:`BATCHED`, get it) and no isolation phase: every mutant shares the same correct ``reset()``, so
    isolation would only repeat the incremental phase's finding. The prefix-reuse phases run (they are
    where the prefix-cache mutants show).
    """
    run = run or ReferenceRun(FullRecompute(model), opts.max_new_tokens)
    one = [replace(opts, padded_batch=n in BATCHED, isolation=False) for n in names]
    return [verify_implementation(mutant(model, n), run, prompts, o, n) for n, o in zip(names, one, strict=True)]


ROW = tuple(  # the chapter's §3.9.8 table: the keys the case study's ch3_case.json records
    "impl prefill_bit_identical first_any_diff_step first_diff_step max_abs_dlogit worst_phase greedy_max_abs_dlogit "
    "max_abs_dlogit_by_phase text_divergences text_only_would_catch verdict bug_margin".split()
)
DETAILED = ("first_diff_step_by_phase", "max_rel_dlogit", "errors")  # what --mutants adds to a row


def report_row(r: VerifyReport, expected: str | None = None, detailed: bool = False) -> dict[str, Any]:
    """One row of the chapter's §3.9.8 table (its keys of the report), with the expected verdict when given;
    ``detailed`` (``--mutants``) adds every phase's first differing step and verdict, the relative scale and errors."""
    row: dict[str, Any] = {k: getattr(r, k) for k in ROW + (DETAILED if detailed else ())}
    if expected is not None:
        row["expected"] = expected
        row["as_expected"] = (r.verdict == "pass") == (expected == "pass")
    if detailed:
        row["verdict_by_phase"] = {p.phase: p.verdict for p in r.phases}
    return {k: json_safe(v) for k, v in row.items()}


def run_mutants(model: GPT, prompt_ids: list[int], steps: int = 50) -> list[dict[str, Any]]:
    """The chapter §3.9.1 table: one row per teaching mutant (``cache_bugs`` in the case study), on the chapter's
    experiment (no prefix-reuse phases, no prefix-cache mutants: the figures stay comparable with the chapter's)."""
    opts = VerifyOptions(steps, prefix_reuse=False)
    reports = run_mutant_reports(model, [list(prompt_ids)], opts, names=TEACHING)
    return [report_row(r, MUTANTS[r.impl]) for r in reports]


def mask_noop(
    model: Any, prompt_ids: list[int], steps: int = 50, chunk: int = 4, run: ReferenceRun | None = None
) -> dict[str, Any]:
    """no_mask vs correct on the same cached path: exactly 0 at T_new = 1, non-zero with chunks (§3.9.4)."""
    run = run or ReferenceRun(FullRecompute(model), steps)
    tr = run.trajectory(prompt_ids)
    seq = tr.prompt + tr.tokens[:-1]
    good, bad = TeachingCache(model, "correct"), TeachingCache(model, "no_mask")

    def delta(c: int) -> float:
        with torch.no_grad():
            outs = [torch.cat([o for *_, o in chunk_calls(impl, seq, c, tr.vocab)]) for impl in (bad, good)]
        return max_abs_diff(*outs)

    return {"no_mask_t_new_1": delta(1), f"no_mask_chunk_{chunk}": delta(chunk)}


def cache_exact(model: GPT, prompt_ids: list[int], steps: int = 50) -> dict[str, Any]:
    """The engine vs full recomputation (chapter §3.4.3: prefill 0.0, incremental ~1.9e-6)."""
    opts = VerifyOptions(steps, chunk_sizes=(4,), padded_batch=False, isolation=False, prefix_reuse=False)
    r = verify_implementation(EngineAdapter(model), FullRecompute(model), [list(prompt_ids)], opts)
    return {
        "prefill_max_abs_dlogit": r.phase("prefill").max_abs_dlogit,
        "incremental_max_abs_dlogit": r.phase("incremental").max_abs_dlogit,
        "chunk4_max_abs_dlogit": r.phase("chunk_4").max_abs_dlogit,
        "prefill_bit_identical": r.prefill_bit_identical,
        "verdict": r.verdict,
    }
