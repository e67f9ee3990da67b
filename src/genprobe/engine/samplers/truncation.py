"""Truncation and temperature stages on (B, V) logits for the ``genprobe``, ``hf`` and ``vllm`` engines.

A removed token gets ``-inf``, never 0 (a 0 is a legal logit whose probability is not 0). The
``hf`` and ``vllm`` functions repeat their engine's tensor operations in the same order and dtype,
so ties and exactly-hit thresholds fall the same way:

* top-p, ``hf`` (TopPLogitsWarper) and ``vllm`` (apply_top_k_top_p_pytorch): sort *ascending*
  with the same ``torch.sort`` call, drop the prefix whose float32 cumulative mass is ``<= 1 - p``
  — among tied tokens at the cut the ones sorted first go (on CPU the lower ids, for short rows).
  HF compares with ``float32(1 - p)``, vLLM with ``1 - float32(p)``.
* top-p, ``genprobe``: the smallest prefix by descending probability (ties: lower id first) whose
  mass reaches ``p``, accumulated in float64 (a mass within 1e-12 of ``p`` reaches it) — the
  report's sampling lab computes the same, without the tolerance.
* top-k keeps every token tied with the k-th value in all three (llama.cpp keeps exactly k).
* vLLM raises 0 < τ < 0.01 to 0.01 (SamplingParams.__post_init__) and divides in float32.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")
VLLM_MIN_TEMPERATURE = 0.01  # vllm/sampling_params.py: _MAX_TEMP
# A float64 mass within this of p counts as reaching it: rounding must not add a token when the
# mass hits p exactly (ten equal logits, p = 0.8: 0.1 summed eight times is 0.7999999999999999).
TOP_P_TOLERANCE = 1e-12


def temperature(logits: torch.Tensor, t: float, engine: str) -> torch.Tensor:
    """Divide by τ (vLLM: τ raised to 0.01 and held in a float32 tensor, as its sampler does)."""
    if engine == "vllm":
        t = max(t, VLLM_MIN_TEMPERATURE) if t > 0 else t
        return logits / torch.tensor([t], dtype=torch.float32, device=logits.device)
    return logits if t == 1.0 else logits / t


def top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits per row; ties at the k-th value are all kept (HF, vLLM)."""
    V = logits.shape[-1]
    if not k or k >= V:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_genprobe(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Smallest descending-probability prefix whose float64 mass reaches ``p`` (crossing token kept)."""
    if p is None or p >= 1.0:
        return logits
    srt, idx = torch.sort(logits.double(), dim=-1, descending=True, stable=True)
    probs = torch.softmax(srt, dim=-1)
    cum = probs.cumsum(-1)
    before = torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1]], dim=-1)  # float64 mass before each token
    remove_sorted = before >= p - TOP_P_TOLERANCE
    remove_sorted[..., 0] = False  # the top token is always kept
    remove = torch.zeros_like(remove_sorted).scatter_(-1, idx, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)


def top_p_ascending(logits: torch.Tensor, p: float, engine: str) -> torch.Tensor:
    """HF/vLLM top-p: ascending stable sort, remove where float32 cumsum <= 1 - p, keep the last."""
    if p is None or p >= 1.0:
        return logits
    srt, idx = torch.sort(logits, dim=-1, descending=False)  # the engines' own call: ties fall as theirs do
    cum = srt.softmax(dim=-1).cumsum(dim=-1)
    if engine == "vllm":
        threshold = 1 - torch.tensor([p], dtype=torch.float32, device=logits.device)  # float32 arithmetic
        remove_sorted = cum <= threshold
    else:
        remove_sorted = cum <= (1 - p)  # Python float 1 - p, rounded to float32 by the comparison
    remove_sorted[..., -1] = False
    remove = remove_sorted.scatter(-1, idx, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)


def min_p(logits: torch.Tensor, mp: float) -> torch.Tensor:
    """Keep tokens whose probability is at least ``mp`` × the top probability (HF, vLLM, genprobe)."""
    if not mp:
        return logits
    probs = torch.softmax(logits, dim=-1)
    thresh = probs.amax(dim=-1, keepdim=True) * mp
    return logits.masked_fill(probs < thresh, NEG_INF)


def typical(logits: torch.Tensor, mass: float) -> torch.Tensor:
    """Locally typical sampling as transformers' TypicalLogitsWarper computes it (min_tokens_to_keep 1)."""
    if mass is None or mass >= 1.0:
        return logits
    normalized = torch.nn.functional.log_softmax(logits, dim=-1)
    p = torch.exp(normalized)
    ent = -(normalized * p).nansum(-1, keepdim=True)
    shifted = torch.abs((-normalized) - ent)
    sorted_scores, sorted_indices = torch.sort(shifted, descending=False)
    sorted_logits = logits.gather(-1, sorted_indices)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    last_ind = (cumulative < mass).sum(dim=1).clamp_(max=sorted_scores.shape[-1] - 1)
    remove_sorted = sorted_scores > sorted_scores.gather(1, last_ind.view(-1, 1))
    remove_sorted[..., :1] = False
    remove = remove_sorted.scatter(1, sorted_indices, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)


def top_n_sigma(logits: torch.Tensor, n: float) -> torch.Tensor:
    """Keep logits >= max − n·σ over the finite logits (population σ; llama.cpp's definition)."""
    if not n:
        return logits
    finite = torch.isfinite(logits)
    count = finite.sum(-1, keepdim=True).clamp(min=1)
    x = torch.where(finite, logits, torch.zeros_like(logits))
    mean = x.sum(-1, keepdim=True) / count
    var = torch.where(finite, (logits - mean) ** 2, torch.zeros_like(logits)).sum(-1, keepdim=True) / count
    top = torch.where(finite, logits, torch.full_like(logits, NEG_INF)).amax(-1, keepdim=True)
    return logits.masked_fill(logits < top - n * var.sqrt(), NEG_INF)
