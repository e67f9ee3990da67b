"""Seed §3.2.2 and §3.7: teacher forcing on real text, confidence, and the shadow of one wrong token.

Protocols (matching the seed):
- teacher-forcing table: the model reads the snippet from its first character; row ``i`` predicts
  snippet token ``i+1`` from tokens ``0..i`` (loss, top-3 candidates).
- perturbation at ``k``: the true token ``k+1`` is replaced by the model's own argmax at row ``k``
  (``<unk>`` excluded; its runner-up when the argmax IS the truth), real text is fed again from ``k+2``; ``Δloss(s)`` = perturbed − clean loss
  of row ``k+s`` (s = 1 is the first prediction that sees the wrong token). ``peak`` = max Δ,
  ``tail_mean`` = mean Δ over steps ``TAIL_FROM..window``, ``half_life_steps`` = first step s with
  Δ ≤ peak/2 (the seed's "回落一半用了" column).
"""

from __future__ import annotations

import math

import torch

from ..corpus import CharTokenizer, Corpus, UNK_ID
from ..model.gpt import GPT
from ._common import quiet_encode, r

SNIPPET = "已驚飛。方從列子御"
PERTURB_POSITIONS = (4, 8, 16, 24)
SHADOW_WINDOW = 16
TAIL_FROM = 5


def find_snippet(corpus: Corpus, snippet: str = SNIPPET) -> tuple[str, int]:
    """(split name, offset) of ``snippet`` in the validation split (else anywhere in the text)."""
    i = corpus.val.find(snippet)
    if i >= 0:
        return "val", i
    i = corpus.text.find(snippet)
    if i >= 0:
        return "text", i
    raise ValueError(f"snippet {snippet!r} not found in the corpus ({corpus.source})")


@torch.no_grad()
def _row_losses(model: GPT, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row next-token loss (T-1,) and log-probs (T-1, V) of ``ids`` under teacher forcing."""
    x = torch.tensor([ids], dtype=torch.long)
    logp = torch.log_softmax(model(x)[0, :-1].double(), -1)
    y = x[0, 1:]
    return -logp.gather(1, y[:, None])[:, 0], logp


def teacher_forcing_table(model: GPT, tok: CharTokenizer, text: str, lead_in: str = "") -> dict:
    """Per-position loss and top-3 of ``text`` (optionally preceded by ``lead_in`` as unscored context)."""
    pre = quiet_encode(tok, lead_in)
    ids = quiet_encode(tok, text)
    full = (pre + ids)[-model.cfg.block_size :]
    start = len(full) - len(ids)
    loss, logp = _row_losses(model, full)
    rows = []
    for i in range(len(ids) - 1):
        j = start + i
        top = torch.topk(logp[j].exp(), 3)
        rows.append({
            "pos": i,
            "context": tok.decode(ids[: i + 1], show_unk=True),
            "truth": tok.token_str(ids[i + 1]),
            "loss": r(float(loss[j]), 6),
            "top3": [{"token": tok.token_str(int(t)), "prob": r(float(p))} for p, t in zip(top.values, top.indices)],
        })
    scored = loss[start : start + len(ids) - 1]
    mean = float(scored.mean())
    return {"rows": rows, "mean_loss": r(mean), "perplexity": r(math.exp(mean), 2), "lead_in_chars": len(lead_in)}


@torch.no_grad()
def confidence_real_text(model: GPT, ids: list[int], windows: int = 32) -> dict:
    """Mean probability / NLL of the model's own argmax on real text (plus the NLL of the truth)."""
    T = model.cfg.block_size
    n = min(windows, (len(ids) - 1) // T)
    if n < 1:
        raise ValueError(f"need more than {T} tokens of real text, got {len(ids)}")
    x = torch.tensor(ids[: n * T + 1], dtype=torch.long)
    logp = torch.log_softmax(model(x[:-1].view(n, T)).double(), -1)
    best = logp.max(-1).values
    truth = logp.gather(-1, x[1:].view(n, T, 1))[..., 0]
    return {
        "positions": n * T,
        "mean_argmax_prob": r(float(best.exp().mean())),
        "mean_nll": r(float(-best.mean())),
        "mean_truth_nll": r(float(-truth.mean())),
    }


def confidence_free_generation(model: GPT, prompts: list[list[int]], new_tokens: int, sampler, seed: int = 0) -> dict:
    """Mean probability / NLL the model gives its own choices while generating freely."""
    from ..engine.generate import generate

    res = generate(model, prompts, new_tokens, sampler=sampler, seed=seed, return_logits=True)
    chosen = torch.tensor(res.tokens, dtype=torch.long)  # (B, N)
    logits = torch.stack(res.step_logits, 1).double()  # (B, N, V)
    lp = torch.log_softmax(logits, -1).gather(-1, chosen[..., None])[..., 0]
    return {"samples": len(prompts), "new_tokens": new_tokens, "mean_chosen_prob": r(float(lp.exp().mean())),
            "mean_nll": r(float(-lp.mean()))}


def perturbation(model: GPT, tok: CharTokenizer, ids: list[int], k: int, window: int = SHADOW_WINDOW) -> dict:
    """Replace token ``k+1`` by the model's argmax (not ``<unk>``) and measure Δloss on the next ``window`` rows."""
    if not 0 <= k or k + 2 + window > len(ids):
        raise ValueError(f"perturbation at k={k} with window {window} needs {k + 2 + window} tokens, got {len(ids)}")
    ids = ids[: k + 2 + window]
    clean, logp = _row_losses(model, ids)
    wanted_logp = logp[k].clone()
    wanted_logp[UNK_ID] = -math.inf
    wanted = int(wanted_logp.argmax())
    same = wanted == ids[k + 1]
    if same:  # the model would have written the truth: perturb with its runner-up instead
        wanted_logp[wanted] = -math.inf
        wanted = int(wanted_logp.argmax())
    bad = list(ids)
    bad[k + 1] = wanted
    pert, _ = _row_losses(model, bad)
    delta = (pert - clean)[k + 1 : k + 1 + window].tolist()
    peak = max(delta)
    peak_step = delta.index(peak) + 1
    half = next((s + 1 for s, d in enumerate(delta) if d <= peak / 2), None)
    tail = delta[TAIL_FROM - 1 :]
    return {
        "k": k,
        "truth": tok.token_str(ids[k + 1]),
        "model_wanted": tok.token_str(wanted),
        "argmax_was_truth": same,
        "next_dloss": r(delta[0]),
        "peak": r(peak),
        "tail_mean": r(sum(tail) / len(tail)),
        "peak_step": peak_step,
        "half_life_steps": half,
        "curve": [r(d) for d in delta],
    }


def run_exposure(model: GPT, tok: CharTokenizer, corpus: Corpus, quick: bool = False, seed: int = 0) -> dict:
    """The ``exposure`` key of ``ch3_case.json``."""
    from ..engine.sampling import SamplerConfig

    split, at = find_snippet(corpus)
    source = corpus.val if split == "val" else corpus.text
    T = model.cfg.block_size
    tf = teacher_forcing_table(model, tok, SNIPPET)
    tf_lead = teacher_forcing_table(model, tok, SNIPPET, lead_in=source[max(0, at - (T - len(SNIPPET))) : at])
    passage = quiet_encode(tok, source[at : at + T])
    val_ids = quiet_encode(tok, corpus.val)
    real = confidence_real_text(model, val_ids, windows=8 if quick else 32)
    n_prompts = 4 if quick else 16
    stride = max(1, (len(val_ids) - 16) // n_prompts)
    prompts = [val_ids[i * stride : i * stride + 8] for i in range(n_prompts)]
    gen_tokens = T - 8
    free = confidence_free_generation(model, prompts, gen_tokens, SamplerConfig(temperature=1.0), seed=seed)
    free["sampler"] = "temperature 1.0"
    greedy = confidence_free_generation(model, prompts, gen_tokens, SamplerConfig(greedy=True), seed=seed)
    greedy["sampler"] = "greedy"
    shadows = [perturbation(model, tok, passage, k) for k in PERTURB_POSITIONS if k + 2 + SHADOW_WINDOW <= len(passage)]
    return {
        "teacher_forcing_snippet": SNIPPET,
        "snippet_found_in": split,
        "snippet_offset": at,
        "teacher_forcing_rows": tf["rows"],
        "teacher_forcing_mean_loss": tf["mean_loss"],
        "teacher_forcing_perplexity": tf["perplexity"],
        "teacher_forcing_with_lead_in": {"lead_in_chars": tf_lead["lead_in_chars"], "mean_loss": tf_lead["mean_loss"],
                                         "perplexity": tf_lead["perplexity"]},
        "confidence_real_text": real,
        "confidence_free_generation": free,
        "confidence_free_generation_greedy": greedy,
        "perturbation_passage": tok.decode(passage, show_unk=True),
        "perturbation_window": SHADOW_WINDOW,
        "perturbation_tail_from": TAIL_FROM,
        "perturbation": shadows,
    }
