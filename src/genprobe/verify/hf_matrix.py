"""``transformers``' cache classes × architectures: the verifier's verdict for each pair, on tiny random models.

No download; Mistral / Gemma 2 / Gemma 3 have a sliding window shorter than the sequences, so their sliding layers must
evict. ``python -m genprobe.verify.hf_matrix [--init 0.02] [--max-new-tokens 8]`` prints the markdown table.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from ..model.load import Model
from .api import verify_caches
from .hf_caches import CACHE_KINDS, describe
from .report import VerifyReport

if TYPE_CHECKING:  # transformers is imported lazily at run time
    from transformers import PretrainedConfig, PreTrainedModel

ARCHS = ("gpt2", "llama", "qwen2", "mistral", "gemma2", "gemma3", "phi3", "gpt_neox")
PROMPTS = [[5, 17, 42, 8, 91, 23, 64, 30], [12, 77, 3, 56, 9], [40, 2, 88]]


def tiny_config(arch: str, init: float = 0.02, window: int = 6) -> PretrainedConfig:
    """A 2-layer config of ``arch`` (vocab 100; grouped-query attention and a sliding window where it has them)."""
    import transformers as T

    ids: dict[str, Any] = dict(bos_token_id=None, eos_token_id=None, pad_token_id=0, initializer_range=init)
    mha: dict[str, Any] = dict(  # every head its own keys (GPT-NeoX); the others group two queries per key
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, **ids
    )
    common: dict[str, Any] = dict(**mha, num_key_value_heads=2, max_position_embeddings=64)
    builders: dict[str, Callable[[], PretrainedConfig]] = {
        "gpt2": lambda: T.GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=2, **ids),
        "llama": lambda: T.LlamaConfig(**common),
        "qwen2": lambda: T.Qwen2Config(**common),
        "mistral": lambda: T.MistralConfig(**common, sliding_window=window),
        "gemma2": lambda: T.Gemma2Config(**common, head_dim=8, sliding_window=window),
        "gemma3": lambda: T.Gemma3TextConfig(**common, head_dim=8, sliding_window=window),
        "phi3": lambda: T.Phi3Config(**common),
        "gpt_neox": lambda: T.GPTNeoXConfig(**mha, max_position_embeddings=64),
    }
    if arch not in builders:
        raise ValueError(f"unknown architecture {arch!r}; choose from {list(ARCHS)}")
    return builders[arch]()


def tiny_model(arch: str, init: float = 0.02, window: int = 6) -> PreTrainedModel:
    """A seeded random causal LM of ``arch`` in eval mode, eager attention."""
    import transformers

    cfg = tiny_config(arch, init, window)
    torch.manual_seed(0)
    # from_config and transformers' eval() override are unannotated: stub gaps
    model: PreTrainedModel = transformers.AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        cfg, attn_implementation="eager"
    )
    model.eval()  # type: ignore[no-untyped-call]
    return model


def cell_text(r: VerifyReport) -> str:
    """One report as a short markdown cell."""
    if r.verdict == "error":
        return "error (" + "; ".join(f"{e.phase}: {e.type}: {e.message}" for e in r.errors) + ")"
    return r.verdict if r.unavailable else f"{r.verdict} ({r.max_abs_dlogit:.2g}; {r.max_rel_dlogit:.2g} σ)"


@dataclass
class CacheMatrix:
    """The report of every (architecture, cache class) pair, plus the environment they were measured in."""

    cells: dict[tuple[str, str], VerifyReport]  # (architecture, cache class) -> report
    transformers: str
    torch: str
    init: float
    steps: int
    notes: dict[str, list[str]] = field(default_factory=dict)  # why unavailable → the "kind on arch" pairs

    def markdown(self) -> str:
        """Rows: cache classes; columns: architectures."""
        archs, kinds = (list(dict.fromkeys(key[i] for key in self.cells)) for i in (0, 1))
        lines = ["| cache class | " + " | ".join(archs) + " |", "|---|" + "---|" * len(archs)]
        for k in kinds:
            lines.append(f"| `{k}` {describe(k)} | " + " | ".join(cell_text(self.cells[a, k]) for a in archs) + " |")
        return "\n".join(lines)


def cache_matrix(
    archs: Sequence[str] = ARCHS, kinds: Sequence[str] = CACHE_KINDS, init: float = 0.02, steps: int = 8
) -> CacheMatrix:
    """Verify every cache class on every architecture (full harness: prefill, decode, chunks, padding, isolation,
    prefix reuse)."""
    import transformers

    cells: dict[tuple[str, str], VerifyReport] = {}
    notes: dict[str, list[str]] = {}
    for arch in archs:
        model = Model.from_module(tiny_model(arch, init))
        result = verify_caches(model, hf_caches=kinds, prompts=PROMPTS, max_new_tokens=steps)
        for kind, r in zip(kinds, result.reports, strict=True):  # a kind unavailable here: a report that says why
            if r.unavailable is not None:
                notes.setdefault(r.unavailable, []).append(f"{kind} on {arch}")
            cells[arch, kind] = r
    return CacheMatrix(cells, transformers.__version__, torch.__version__, init, steps, notes)


def main(argv: list[str] | None = None) -> int:
    """Print the markdown matrix (and the reasons for unavailable classes)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", type=float, default=0.02, help="initializer_range of the random models (default 0.02)")
    ap.add_argument("--max-new-tokens", type=int, default=8, help="greedy steps per prompt (default 8)")
    args = ap.parse_args(argv)
    m = cache_matrix(init=args.init, steps=args.max_new_tokens)
    print(
        f"transformers {m.transformers}, torch {m.torch}; random tiny models, initializer_range {m.init}, "
        f"{m.steps} greedy steps; cell: verdict (max |Δlogit|; in σ of the reference logits)\n"
    )
    print(m.markdown())
    print()
    for why, where in m.notes.items():
        print(f"- unavailable ({', '.join(where)}): {why}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
