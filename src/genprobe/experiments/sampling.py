"""How temperature, top-k/top-p and their order reshape ONE real next-token distribution, the one after the case
prompt: the chapter's tables (entropy vs τ, nucleus curve, order trap), and the distribution the report's lab reads."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..corpus.tokenizer import CharTokenizer
from ..engine.samplers.chain import kept_set_size
from ..engine.samplers.stages import SamplerConfig
from ..model.gpt import GPT
from ._common import CASE_PROMPT, Rounded, r

TEMPERATURES = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0)
NUCLEUS_PS = (0.5, 0.8, 0.9, 0.95, 0.99, 0.999)
ORDER_TAUS = (0.5, 1.0, 1.5, 2.0)
ORDERS = ("trunc_then_temp", "temp_then_trunc", "hf", "vllm", "llama.cpp")


@dataclass(frozen=True)
class TemperatureRow(Rounded):
    """Entropy (nats), perplexity and max probability of softmax(logits / τ)."""

    JSON_KEYS = "tau entropy perplexity max_prob"
    DIGITS_OF = {"perplexity": 2}

    tau: float
    entropy: float
    max_prob: float

    @property
    def perplexity(self) -> float:
        """exp(entropy)."""
        return math.exp(self.entropy)


@dataclass(frozen=True)
class NucleusRow(Rounded):
    """Tokens kept by top-p ``p`` at τ = 1, of ``vocab_size``."""

    JSON_KEYS = "p kept share_of_vocab"

    p: float
    kept: int
    vocab_size: int

    @property
    def share_of_vocab(self) -> float:
        """kept / vocab_size."""
        return self.kept / self.vocab_size


def entropy_table(logits: torch.Tensor, temperatures=TEMPERATURES) -> list[TemperatureRow]:
    """Entropy, perplexity and max probability of softmax(logits/τ) for each τ (in float64)."""
    probs = [torch.softmax(logits.double() / tau, -1) for tau in temperatures]
    return [
        TemperatureRow(tau, float(torch.special.entr(p).sum()), float(p.max()))
        for tau, p in zip(temperatures, probs, strict=True)
    ]


def nucleus_curve(logits: torch.Tensor, ps=NUCLEUS_PS) -> list[NucleusRow]:
    """Tokens kept by top-p at τ = 1 for each p."""
    V = logits.numel()
    return [NucleusRow(p, kept_set_size(logits, SamplerConfig(top_p=p)), V) for p in ps]


def order_trap(logits: torch.Tensor, top_p: float = 0.9, taus=ORDER_TAUS, orders=ORDERS) -> list[dict]:
    """Kept-set size at top-p ``top_p`` under each order / engine preset per τ: ``{"tau": τ, order: kept, ...}``."""
    return [
        {"tau": tau} | {o: kept_set_size(logits, SamplerConfig(temperature=tau, top_p=top_p, order=o)) for o in orders}
        for tau in taus
    ]


@dataclass
class SamplingResult:
    """The ``sampling`` key: how τ, top-p and their order reshape one real next-token distribution."""

    prompt: str
    prompt_unknown_chars: list[str]
    logits: torch.Tensor  # (V,) float32, the raw next-token logits after the prompt
    token_strs: list[str]  # the vocabulary as text, for the report's sampling lab
    entropy_vs_temperature: list[TemperatureRow]
    nucleus_curve_tau_1: list[NucleusRow]
    order_trap_top_p_0_9: list[dict]

    def to_dict(self) -> dict:
        """JSON form (the ``sampling`` key of ``ch3_case.json``), with the 10 most likely next tokens."""
        V, probs = int(self.logits.numel()), torch.softmax(self.logits.double(), -1)
        top10 = torch.argsort(probs, descending=True)[:10]
        return {
            "prompt": self.prompt,
            "prompt_unknown_chars": self.prompt_unknown_chars,
            "vocab_size": V,
            "log_vocab": r(math.log(V)),
            "entropy_vs_temperature": self.entropy_vs_temperature,
            "nucleus_curve_tau_1": self.nucleus_curve_tau_1,
            "order_trap_top_p_0_9": self.order_trap_top_p_0_9,
            "top10": [{"token": self.token_strs[int(t)], "id": int(t), "prob": r(float(probs[t]))} for t in top10],
            # The whole distribution, so the report's sampling lab re-computes everything in the browser.
            # float32 logits as exact decimal strings would be wasteful; 6 decimals is far below any
            # kept-set boundary effect the lab can show (the browser test compares on these same values).
            "distribution": {"tokens": list(self.token_strs), "logits": [round(float(x), 6) for x in self.logits]},
        }


@torch.no_grad()
def run_sampling(model: GPT, tok: CharTokenizer) -> SamplingResult:
    """Entropy, nucleus and order-trap tables of the raw next-token logits (V,) after the case prompt, and those."""
    prompt = tok.encode_with_report(CASE_PROMPT)
    logits = model(torch.tensor([prompt.ids[-model.cfg.block_size :]], dtype=torch.long))[0, -1].float()
    return SamplingResult(
        CASE_PROMPT,
        prompt.unknown_chars,
        logits,
        [tok.token_str(i) for i in range(logits.numel())],
        entropy_table(logits),
        nucleus_curve(logits),
        order_trap(logits),
    )
