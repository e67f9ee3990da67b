"""The engines the speed benchmark compares, all on the same float32 weights, all greedy.

Each factory takes a :class:`Bundle` (our GPT plus lazily built exports of it) and returns an
:class:`Engine`: a call that generates ``new_tokens`` greedy tokens for a batch of prompts and returns
the new token ids per row, plus a one-token call for the time to first token. A factory raises
:class:`EngineUnavailable` with a reason when its package is missing (CTranslate2 and vLLM are
optional); the benchmark then prints the reason and carries on without it.

- ``cached`` / ``compiled`` / ``naive``: :func:`genprobe.engine.generate` (eager KV cache, the same
  with ``compile=True``, recomputation without a cache);
- ``cached-bf16`` / ``compiled-bf16`` and ``cached-int8`` / ``compiled-int8``: the same two on the model with
  weight-only bfloat16 or int8 linear layers (:mod:`genprobe.model.weight_only`, the opt-in approximations:
  float32 arithmetic, a half or a quarter of the weight bytes). Each is a different model from the float32
  one: its rows are its own, its tokens are checked against its own eager engine, and how many of them match
  the float32 model's is reported beside;
- ``hf``: ``transformers`` ``GPT2LMHeadModel.generate`` (SDPA attention) on the exported weights;
- ``ct2``: CTranslate2's ``Generator`` on the same export converted by its ``TransformersConverter``
  (float32, ``intra_threads`` = torch's thread count); ``ct2-1t``: the same with one thread;
- ``vllm``: a slot for vLLM's offline ``LLM`` (skipped unless ``import vllm`` works).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

Tokens = list[list[int]]


class EngineUnavailable(RuntimeError):
    """An engine that cannot run here (optional package missing, unsupported model)."""


@dataclass
class Engine:
    """One engine bound to one batch of prompts: ``run()`` generates, ``first_token()`` times the first token."""

    name: str
    run: Callable[[], Tokens]
    first_token: Callable[[], Any]


@dataclass
class Bundle:
    """Our model and what the other engines need of it, built once per benchmark run."""

    model: Any  # genprobe GPT (eval)
    tokenizer: Any  # genprobe CharTokenizer of the model's vocabulary (CTranslate2 takes token strings)
    source: str
    _hf: Any = None
    _narrow: dict[str, Any] = field(default_factory=dict)  # weight-only copies by weight dtype name
    _tmp: Path | None = None
    _ct2: dict[int, Any] = field(default_factory=dict)  # CTranslate2 generators by intra_threads
    _ct2_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def hf(self):
        """``GPT2LMHeadModel`` holding exactly the model's weights (SDPA attention)."""
        if self._hf is None:
            from genprobe.model.hf import to_hf_gpt2

            self._hf = to_hf_gpt2(self.model, attn_implementation="sdpa")
            self._hf.generation_config.pad_token_id = 0
            self._hf.generation_config.eos_token_id = None
        return self._hf

    def narrow(self, weight_dtype: str):
        """The model with its linear layers' weights stored in ``weight_dtype`` ("bfloat16", "int8"; built once)."""
        if weight_dtype not in self._narrow:
            from genprobe.model.weight_only import weight_dtype_of, with_weight_dtype

            self._narrow[weight_dtype] = with_weight_dtype(self.model, weight_dtype_of(weight_dtype))
        return self._narrow[weight_dtype]

    def bf16(self):
        """The model with its linear layers' weights stored in bfloat16 (a converted copy, built once)."""
        return self.narrow("bfloat16")

    def tmpdir(self) -> Path:
        """A private temporary directory removed by :meth:`close`."""
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="genprobe-bench-"))
        return self._tmp

    def hf_dir(self) -> Path:
        """The model exported as a transformers directory (with a char tokenizer), in the temp dir."""
        from genprobe.model.hf_dir import export_hf_dir

        d = self.tmpdir() / "hf"
        if not d.exists():
            export_hf_dir(self.model, d, tokenizer=self.tokenizer)
        return d

    def close(self) -> None:
        """Remove the temporary exports."""
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


# ---- our engine -------------------------------------------------------------------------------------
def ours(mode: str, compile: bool = False, weight_dtype: str = "float32") -> Callable[[Bundle, Tokens, int], Engine]:
    """Factory for :func:`genprobe.engine.generate` in ``mode`` (``compile`` for the compiled decode;
    ``weight_dtype`` "bfloat16" or "int8" for the model with weight-only narrow linear layers)."""

    def make(b: Bundle, prompts: Tokens, n: int) -> Engine:
        from genprobe.engine.generate import generate

        model = b.model if weight_dtype == "float32" else b.narrow(weight_dtype)

        def run(k: int = n) -> Tokens:
            return generate(model, prompts, k, mode=mode, compile=compile).tokens

        return Engine("", run, lambda: run(1))

    return make


# ---- transformers -----------------------------------------------------------------------------------
def hf_engine(b: Bundle, prompts: Tokens, n: int) -> Engine:
    """``transformers`` greedy ``generate`` for exactly ``n`` tokens (no eos)."""
    hf = b.hf()
    ids = torch.tensor(prompts, dtype=torch.long)
    mask = torch.ones_like(ids)

    def run(k: int = n) -> Tokens:
        with torch.inference_mode():
            out = hf.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=k,
                min_new_tokens=k,
                pad_token_id=0,
                eos_token_id=None,
                num_beams=1,
            )
        return out[:, ids.shape[1] :].tolist()

    return Engine("", run, lambda: run(1))


# ---- CTranslate2 ------------------------------------------------------------------------------------
def ct2_generator(b: Bundle, threads: int):
    """CTranslate2 ``Generator`` for the model, converting the export on first use (float32)."""
    if threads in b._ct2:
        return b._ct2[threads]
    try:
        import ctranslate2
        from ctranslate2.converters import TransformersConverter
    except ImportError as exc:
        raise EngineUnavailable(f"ctranslate2 is not installed ({exc}); pip install 'genprobe[bench]'") from exc
    out = b.tmpdir() / "ct2"
    if not b._ct2:  # converted once; each thread count loads the same files
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            TransformersConverter(str(b.hf_dir())).convert(str(out), quantization="float32", force=True)
        # The converter leaves these null for our export: CTranslate2 then falls back to its own layer-norm
        # epsilon (not GPT-2's 1e-5) and has no start/end token. The end token is never generated here
        # (end_token=[] below); what matters is that the file names one.
        cfg_path = out / "config.json"
        cfg = json.loads(cfg_path.read_text())
        end = b.tokenizer.itos[0]
        cfg.update(bos_token=end, eos_token=end, layer_norm_epsilon=b.model.cfg.layer_norm_eps)
        cfg_path.write_text(json.dumps(cfg))
    b._ct2[threads] = ctranslate2.Generator(
        str(out), device="cpu", compute_type="float32", intra_threads=threads, inter_threads=1
    )
    return b._ct2[threads]


def ct2_engine(b: Bundle, prompts: Tokens, n: int, threads: int | None = None) -> Engine:
    """CTranslate2 greedy ``generate_batch`` for exactly ``n`` new tokens, prompt forwarded at once.

    ``threads`` (CTranslate2's ``intra_threads``) defaults to torch's thread count.
    """
    gen = ct2_generator(b, threads or torch.get_num_threads())
    start = [[b.tokenizer.itos[i] for i in p] for p in prompts]

    def run(k: int = n) -> Tokens:
        res = gen.generate_batch(
            start,
            max_length=k,
            min_length=0,
            beam_size=1,
            include_prompt_in_result=False,
            end_token=[],
            max_batch_size=0,
        )
        return [r.sequences_ids[0] for r in res]

    return Engine("", run, lambda: run(1))


# ---- vLLM (slot) ------------------------------------------------------------------------------------
def vllm_engine(b: Bundle, prompts: Tokens, n: int) -> Engine:
    """vLLM's offline ``LLM`` on the exported directory (float32, greedy, ``ignore_eos``), when installed.

    The slot is written against vLLM's documented offline API (``LLM``, ``SamplingParams``,
    ``TokensPrompt``); it is skipped wherever ``import vllm`` fails, which includes this project's
    default environment.
    """
    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except Exception as exc:  # ImportError, or a vLLM build that fails to initialise on this machine
        raise EngineUnavailable(f"vllm is not importable ({type(exc).__name__}: {exc})") from exc
    if getattr(b, "_vllm", None) is None:
        # A KV-cache reservation sized for these models (vLLM's CPU default takes GiBs), batches up to 128.
        try:
            b._vllm = LLM(
                model=str(b.hf_dir()),
                dtype="float32",
                skip_tokenizer_init=True,
                seed=0,
                max_num_seqs=128,
                kv_cache_memory_bytes=256 << 20,
            )
        except Exception as exc:  # e.g. vLLM's CPU attention has no kernel for this head size: skip the row, say why
            raise EngineUnavailable(f"vLLM could not start on this model ({type(exc).__name__}: {exc})") from exc
    llm = b._vllm
    reqs = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]

    def run(k: int = n) -> Tokens:
        sp = SamplingParams(temperature=0.0, max_tokens=k, min_tokens=k, ignore_eos=True, detokenize=False)
        outs = llm.generate(reqs, sp, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]

    return Engine("", run, lambda: run(1))


FACTORIES: dict[str, Callable[[Bundle, Tokens, int], Engine]] = {
    "cached": ours("cached"),
    "compiled": ours("cached", compile=True),
    "naive": ours("naive"),
    "cached-bf16": ours("cached", weight_dtype="bfloat16"),
    "compiled-bf16": ours("cached", compile=True, weight_dtype="bfloat16"),
    "cached-int8": ours("cached", weight_dtype="int8"),
    "compiled-int8": ours("cached", compile=True, weight_dtype="int8"),
    "hf": hf_engine,
    "ct2": ct2_engine,
    # One thread: a small model's step at low batch is faster without a fork/join per operator (our compiled
    # loop makes the same choice, genprobe.engine.fast.compiled.compile_config), so CTranslate2 gets it too.
    "ct2-1t": lambda b, prompts, n: ct2_engine(b, prompts, n, threads=1),
    "vllm": vllm_engine,
}


def make_engine(name: str, b: Bundle, prompts: Tokens, n: int) -> Engine:
    """Build engine ``name`` for these prompts (raises :class:`EngineUnavailable`)."""
    if name not in FACTORIES:
        raise ValueError(f"unknown engine {name!r}; known: {sorted(FACTORIES)}")
    e = FACTORIES[name](b, prompts, n)
    e.name = name
    return e
