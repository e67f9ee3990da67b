"""Greedy decoding speed on a real Llama-family model across engines, each in its own process, plus memory bandwidth.

What it measures: tokens per second of ``--new-tokens`` greedy tokens after ``--prompt-tokens``-token prompts (the
same prompts for every engine: windows of one fixed English passage, tokenized by the model's tokenizer, a different
window per row), for each ``--batch`` size, with ``--threads`` threads. The default model is the catalog model
``smollm2`` (SmolLM2-135M-Instruct, ``transformers`` ``LlamaForCausalLM`` in float32, fetched by
``genprobe fetch smollm2``). A figure is ``batch x new tokens / wall seconds`` of one whole generation call (the
8-token prefill included), the median of ``--reps`` calls after one warm-up call; the warm-up (compilation,
allocation) is reported separately and never enters the tok/s. Engines:

- ``genprobe``: ``generate(m, prompts, N, compile=True)`` (genprobe's compiled fast path, float32;
  the first call per batch size compiles, minutes, cached on disk under ``~/.cache/genprobe/aot``);
- ``genprobe-int8`` / ``genprobe-bf16``: the same on ``genprobe.load(model, weight_dtype=torch.int8 / bfloat16)``
  (weight-only narrow linear layers: different models; their tokens are also checked against their own eager run);
  ``genprobe-int8-head``: int8 with the output layer (tied to the embedding) int8 too (``narrow_output=True``), the
  bytes a llama.cpp Q8_0 step reads; ``genprobe-q8_0``: the ``--gguf-dir``'s ``*-Q8_0.gguf`` loaded with
  ``weight_dtype=int8, narrow_output=True`` (its Q8_0 blocks as they are: the weights llama.cpp Q8_0 multiplies by);
  ``genprobe-q4_0`` / ``genprobe-q4_k_m``: the same on ``*-Q4_0.gguf`` / ``*-Q4_K_M.gguf`` (their 4/5/6-bit blocks as
  they are, genprobe.model.gguf_blocks; tokens checked against the eager run of the same file dequantized);
- ``genprobe-eager``: ``generate(m, prompts, N)`` (no compile): the reference for token equality;
- ``hf``: ``transformers``' ``generate`` on the same module (greedy, eos disabled, exactly N tokens);
- ``llamacpp-f32`` / ``llamacpp-q8_0`` / ``llamacpp-q4_0`` / ``llamacpp-q4_k_m``: llama.cpp through
  :class:`genprobe.serving.llamacpp.engine.LlamaCppModel` on ``--gguf-dir``'s ``*-F32.gguf`` / ``*-Q8_0.gguf`` / …
  (batch 1: ``greedy``; batch > 1: ``generate_batch``, every sequence in one context, which is created per call;
  KV cache ``--llamacpp-kv``, f32 by default);
- ``ct2``: CTranslate2 ``Generator`` on the model converted once (float32) under ``--cache-dir``;
- ``vllm``: vLLM's offline ``LLM`` (CPU build, float32, eager, engine core in-process, threads not bound).

Protocol: the driver runs one worker process per engine per round (``--rounds``, order reversed every other round)
and, at the start of each round, one process that times ``torch.sum`` over a float32 tensor of the model's weight
size (parameters counted once, the tied embedding once; median of 10) for the memory bandwidth. It prints per batch
the median tok/s of each engine in each round, the ratio ``--ours`` / engine per round and its median, the winner,
how many rows of greedy tokens equal ``genprobe-eager``'s, and at batch 1 each engine's achieved weight bytes per
second (weight bytes read per step x tok/s) as a fraction of the measured bandwidth::

    python benchmarks/llama_speed.py                                    # every engine, batch 1 16 64, 3 rounds
    python benchmarks/llama_speed.py --engines genprobe hf ct2 llamacpp-f32 --batch 1 --rounds 3 --out out/bench
    python benchmarks/llama_speed.py --worker hf --batch 1 --new-tokens 8   # one worker: JSON lines on stdout
    python benchmarks/llama_speed.py --prompt-tokens 512 --new-tokens 1 ...  # prefill: the ratios are the prompts'

Prefill rows: with ``--new-tokens 1`` a call is the prompt's forward and one argmax, so the per-round ratios are
the prefill ratios, and a row's prompt tokens per second are its tok/s times ``--prompt-tokens`` (prompts longer
than the passage repeat it). The warm-up call builds genprobe's programs in the foreground
(``GENPROBE_AOT_BACKGROUND=0``): ``benchmarks/first_call.py`` times a first call that does not wait for them.

A worker prints one JSON line per batch size on stdout (engine, batch, tok/s per repetition, median, warm-up
seconds, the tokens and their sha256, or ``unavailable``); anything else it (or a library) prints goes to stderr.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_stats beside this script

from bench_stats import Series, load_average, timed  # noqa: E402

from genprobe._io import json_safe

Tokens = list[list[int]]
HERE = Path(__file__).resolve()
ENGINES = (
    "genprobe",
    "genprobe-int8",
    "genprobe-int8-head",
    "genprobe-q8_0",
    "genprobe-q4_0",
    "genprobe-q4_k_m",
    "genprobe-bf16",
    "genprobe-eager",
    "hf",
    "llamacpp-f32",
    "llamacpp-q8_0",
    "llamacpp-q4_0",
    "llamacpp-q4_k_m",
    "ct2",
    "vllm",
)
REFERENCE = "genprobe-eager"
BANDWIDTH_REPS = 10
PROMPT_STRIDE = 7  # row i's prompt starts 7 tokens after row i-1's (modulo the passage): rows differ
PASSAGE = (
    "The old lighthouse keeper climbed the spiral stairs every evening to light the lamp before the ships came in. "
    "In the village below, the baker was already preparing the dough for the morning bread, while the children "
    "argued about whose turn it was to feed the goats. A storm had been forecast for the weekend, so the fishermen "
    "pulled their boats higher onto the beach and tied them to the iron rings set in the harbour wall. The teacher "
    "at the small school explained to her class how the tides follow the moon, and why the water rises twice a "
    "day. Nobody noticed the stranger who arrived on the last bus, carrying a leather suitcase and a map of the "
    "coast that was more than a hundred years old. He asked the innkeeper for a room facing the sea."
)


class Unavailable(RuntimeError):
    """An engine that cannot run here; the message says why."""


@dataclass
class Setup:
    """What every process of one benchmark run shares."""

    model: str
    model_dir: Path
    batches: list[int]
    new_tokens: int
    prompt_tokens: int
    threads: int
    reps: int
    gguf_dir: Path
    cache_dir: Path
    llamacpp_kv: str
    llamacpp_site: Path | None = None  # a llama.cpp build put first on the llama.cpp workers' sys.path

    def worker_args(self) -> list[str]:
        """The command-line options that recreate this setup in a worker."""
        named = {
            "--model": self.model,
            "--new-tokens": self.new_tokens,
            "--prompt-tokens": self.prompt_tokens,
            "--threads": self.threads,
            "--reps": self.reps,
            "--gguf-dir": self.gguf_dir,
            "--cache-dir": self.cache_dir,
            "--llamacpp-kv": self.llamacpp_kv,
        }
        if self.llamacpp_site is not None:
            named["--llamacpp-site"] = self.llamacpp_site
        return ["--batch", *map(str, self.batches), *(x for k, v in named.items() for x in (k, str(v)))]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON."""
        return {k: str(v) if isinstance(v, Path) else v for k, v in self.__dict__.items()}


@dataclass
class Engine:
    """One engine, built once per worker: ``generate(prompts)`` returns the new token ids per row."""

    generate: Callable[[Tokens], Tokens]
    tokenizer: Any
    weight_bytes: int | None = None  # read per decode step at batch 1; None: the float32 parameters' bytes
    info: dict[str, Any] = field(default_factory=dict)
    own_check: Callable[[Tokens, Tokens], int] | None = None  # rows equal to the engine's own eager run


# ---- prompts and model facts ----------------------------------------------------------------------------------------
def model_dir_of(model: str) -> Path:
    """The transformers directory of ``model``: a path as given, else a fetched catalog model's directory."""
    if Path(model).exists():
        return Path(model)
    from genprobe.model.catalog import resolve_name

    return resolve_name(model)


def make_prompts(tokenizer: Any, batch: int, length: int) -> Tokens:
    """``batch`` prompts of ``length`` tokens: windows of :data:`PASSAGE`, :data:`PROMPT_STRIDE` tokens apart."""
    ids = [int(t) for t in tokenizer.encode(PASSAGE)]
    ids = ids * (1 + (length + PROMPT_STRIDE * batch) // len(ids))  # long prompts (prefill rows): the passage again
    span = len(ids) - length + 1
    starts = [(i * PROMPT_STRIDE) % span for i in range(batch)]
    return [ids[s : s + length] for s in starts]


def module_bytes(module: Any) -> int:
    """Bytes a decode step reads: the parameters, each counted once (a tied embedding once), less an input embedding
    that is not also the output layer (a step looks up one row of it: ``narrow_output``'s float32 lookup table)."""
    total = sum(p.numel() * p.element_size() for p in module.parameters())
    emb, head = module.get_input_embeddings(), module.get_output_embeddings()
    if head is not None and head.weight is not emb.weight:
        total -= emb.weight.numel() * emb.weight.element_size()
    return total


def tokens_sha(tokens: Tokens) -> str:
    """sha256 of the tokens' JSON (equal tokens, equal sha)."""
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()


def rows_equal(a: Tokens, b: Tokens) -> int:
    """How many rows of ``a`` equal the same row of ``b``."""
    return sum(x == y for x, y in zip(a, b, strict=False))


# ---- engines --------------------------------------------------------------------------------------------------------
def load_genprobe(
    setup: Setup, weight_dtype: str = "float32", narrow_output: bool = False, source: str | Path | None = None
) -> Any:
    """``genprobe.load(model, weight_dtype=..., narrow_output=...)``; Unavailable with load's reason when it refuses."""
    import torch

    import genprobe

    source = setup.model if source is None else source
    try:
        return genprobe.load(source, weight_dtype=getattr(torch, weight_dtype), narrow_output=narrow_output)
    except (ValueError, TypeError, NotImplementedError, OSError) as exc:
        raise Unavailable(f"genprobe.load({str(source)!r}, weight_dtype=torch.{weight_dtype}): {exc}") from exc


def genprobe_engine(
    setup: Setup, compile: bool, weight_dtype: str = "float32", narrow_output: bool = False, gguf: str | None = None
) -> Engine:
    """genprobe's ``generate`` on the loaded model (``compile=True``: the compiled fast path); ``gguf``: on the
    ``--gguf-dir`` file of that type instead (int8: its Q8_0 blocks as they are)."""
    from genprobe.engine.generate import generate
    from genprobe.engine.runner import runner_for

    m = load_genprobe(setup, weight_dtype, narrow_output, None if gguf is None else gguf_file(setup, gguf))
    runner = runner_for(m)
    n = setup.new_tokens

    def gen(prompts: Tokens) -> Tokens:
        return generate(runner, prompts, max_new_tokens=n, compile=compile).tokens

    def own_check(prompts: Tokens, tokens: Tokens) -> int:
        if gguf is not None:  # the file's blocks against the dequantized float model of the same file (eager)
            dense = runner_for(load_genprobe(setup, source=gguf_file(setup, gguf)))
            return rows_equal(tokens, generate(dense, prompts, max_new_tokens=n).tokens)
        return rows_equal(tokens, generate(runner, prompts, max_new_tokens=n).tokens)

    narrow = weight_dtype != "float32"
    info = {"source": str(m.source), "weight_dtype": weight_dtype, "narrow_output": narrow_output, "compile": compile}
    return Engine(gen, m.tokenizer, module_bytes(m.module), info, own_check if narrow else None)


def hf_engine(setup: Setup) -> Engine:
    """``transformers``' own greedy ``generate`` on the loaded module, eos disabled: exactly N tokens per row."""
    import torch

    m = load_genprobe(setup)
    hf, n = m.module, setup.new_tokens
    # On the model's own generation config: transformers 5 fills unset fields of a config passed to generate()
    # from the model's, so an eos_token_id=None there would come back as the model's eos.
    hf.generation_config = copy.deepcopy(hf.generation_config)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = m.tokenizer.pad_id

    def gen(prompts: Tokens) -> Tokens:
        ids = torch.tensor(prompts, dtype=torch.long)
        with torch.inference_mode():
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                num_beams=1,
                max_new_tokens=n,
                min_new_tokens=n,
                eos_token_id=None,
            )
        return out[:, ids.shape[1] :].tolist()

    info = {"source": str(m.source), "attn_implementation": getattr(hf.config, "_attn_implementation", None)}
    return Engine(gen, m.tokenizer, module_bytes(hf), info)


def gguf_file(setup: Setup, quant: str) -> Path:
    """The one ``*-{quant}.gguf`` file of ``--gguf-dir`` (Unavailable when there is none or several)."""
    found = sorted(setup.gguf_dir.glob(f"*-{quant}.gguf"))
    if len(found) != 1:
        what = "no" if not found else f"{len(found)}"
        raise Unavailable(f"{what} *-{quant}.gguf file in {setup.gguf_dir} (make them with `genprobe quant-compare`)")
    return found[0]


def llamacpp_engine(setup: Setup, quant: str) -> Engine:
    """llama.cpp (genprobe's wrapper): ``greedy`` at batch 1, ``generate_batch`` (one context) above."""
    from genprobe.model.load import load_tokenizer

    path = gguf_file(setup, quant)
    try:
        from genprobe.serving.llamacpp.engine import LlamaCppModel, greedy_picker

        lm = LlamaCppModel(
            path, n_ctx=setup.prompt_tokens + setup.new_tokens, n_threads=setup.threads, kv_type=setup.llamacpp_kv
        )
    except ImportError as exc:
        raise Unavailable(f"llama-cpp-python is not importable ({exc})") from exc
    n = setup.new_tokens
    prefill = last_position_prefill(setup, path) if n == 1 else None

    def gen(prompts: Tokens) -> Tokens:
        if len(prompts) == 1:
            return [prefill(prompts[0]) if prefill else lm.greedy(prompts[0], n, stop_at_eos=False)]
        return [g.tokens for g in lm.generate_batch(prompts, n, greedy_picker())]

    lib = lm._lib
    info = {"file": str(path), "kv_type": setup.llamacpp_kv, "n_threads": setup.threads, "library": lib.__file__}
    info["system_info"] = lib.llama_print_system_info().decode()  # the build's instruction sets (AVX512 = 1 ...)
    return Engine(gen, load_tokenizer(setup.model_dir), path.stat().st_size, info)


def last_position_prefill(setup: Setup, path: Path) -> Callable[[list[int]], list[int]]:
    """llama.cpp's own prompt processing for a prefill row: a plain ``Llama`` with ``logits_all=False`` (the
    head on the last position only, as genprobe's prompt program does; genprobe's ``LlamaCppModel`` keeps every
    position's logits for the verifier), one ``eval`` of the prompt in one batch, the argmax of the last logits."""
    import llama_cpp
    import numpy as np

    n_ctx = setup.prompt_tokens + 1
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=setup.threads,
        n_threads_batch=setup.threads, logits_all=False, flash_attn=False, verbose=False,
    )  # fmt: skip
    vocab = int(llm.n_vocab())

    def first_token(prompt: list[int]) -> list[int]:
        llm.reset()
        llm.eval(prompt)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
        return [int(np.argmax(logits))]

    return first_token


def ct2_model(setup: Setup) -> Path:
    """The model converted by CTranslate2's ``TransformersConverter`` (float32), once per model file; one process
    converts while another wanting it waits (genprobe's cache lock), a killed conversion's temporary is removed."""
    from genprobe._io import temp_beside, write_once

    weights = setup.model_dir / "model.safetensors"
    stamp = {"source": str(setup.model_dir.resolve()), "size": weights.stat().st_size, "mtime": weights.stat().st_mtime}
    out = setup.cache_dir / f"ct2-{setup.model_dir.name}-float32"

    def current(d: Path) -> bool:
        return (d / "model.bin").is_file() and (d / "source.json").is_file() and _json(d / "source.json") == stamp

    def convert() -> None:
        from ctranslate2.converters import TransformersConverter

        tmp = temp_beside(out, directory=True)
        try:
            print(f"converting {setup.model_dir} for CTranslate2 into {out}", file=sys.stderr, flush=True)
            TransformersConverter(str(setup.model_dir)).convert(str(tmp), quantization="float32", force=True)
            (tmp / "source.json").write_text(json.dumps(stamp))
            if out.exists():  # a conversion of an older model file
                shutil.rmtree(out)
            os.replace(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    write_once(out, current, convert, f"the CTranslate2 conversion of {setup.model_dir.name}")
    return out


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def ct2_engine(setup: Setup) -> Engine:
    """CTranslate2 greedy ``generate_batch`` on token strings, exactly N new tokens (no end token)."""
    try:
        import ctranslate2
    except ImportError as exc:
        raise Unavailable(f"ctranslate2 is not installed ({exc})") from exc
    from genprobe.model.load import load_tokenizer

    t0 = time.perf_counter()
    path = ct2_model(setup)
    convert_s = time.perf_counter() - t0
    gen_ = ctranslate2.Generator(
        str(path), device="cpu", compute_type="float32", intra_threads=setup.threads, inter_threads=1
    )
    tok = load_tokenizer(setup.model_dir)
    n = setup.new_tokens

    def gen(prompts: Tokens) -> Tokens:
        start = [tok.hf.convert_ids_to_tokens(p) for p in prompts]
        # end_token=[]: no token ends a row, so min_length has nothing to suppress (min_length=N would mask the
        # eos logit where the model's config names one, changing greedy tokens): every row runs max_length steps.
        res = gen_.generate_batch(
            start,
            max_length=n,
            min_length=0,
            beam_size=1,
            sampling_topk=1,
            end_token=[],
            include_prompt_in_result=False,
            max_batch_size=0,
        )
        return [list(r.sequences_ids[0]) for r in res]

    return Engine(
        gen, tok, None, {"ct2_dir": str(path), "convert_or_check_s": convert_s, "version": ctranslate2.__version__}
    )


def vllm_engine(setup: Setup) -> Engine:
    """vLLM's offline engine (CPU build): float32, greedy, ``ignore_eos``, prompts as token ids."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # no pinning: like every other engine here
    from genprobe.model.load import load_tokenizer
    from genprobe.serving.engine import vllm_import_problem

    problem = vllm_import_problem()
    if problem is not None:
        raise Unavailable(problem)
    from vllm import SamplingParams

    from genprobe.serving.engine import EngineOptions, EngineStartError, ServingEngine, size_for_workload

    seqs = max(setup.batches)
    opts = EngineOptions(
        dtype="float32", enable_prefix_caching=False, max_num_seqs=seqs, multiprocessing=False, loop_monitor=False
    )
    opts = size_for_workload(
        setup.model_dir, opts, longest_prompt=setup.prompt_tokens, new_tokens=setup.new_tokens, sequences=seqs
    )
    try:
        eng = ServingEngine(setup.model_dir, opts)
    except EngineStartError as exc:
        raise Unavailable(f"vLLM could not start: {exc}") from exc
    # ignore_eos alone gives exactly max_tokens tokens; min_tokens would also mask the stop tokens' logits.
    sp = SamplingParams(temperature=0.0, max_tokens=setup.new_tokens, ignore_eos=True, detokenize=False)

    def gen(prompts: Tokens) -> Tokens:
        return [list(o.outputs[0].token_ids) for o in eng.generate(prompts, sp)]

    return Engine(gen, load_tokenizer(setup.model_dir), None, {"options": json_safe(opts), **eng.describe()})


FACTORIES: dict[str, Callable[[Setup], Engine]] = {
    "genprobe": lambda s: genprobe_engine(s, compile=True),
    "genprobe-int8": lambda s: genprobe_engine(s, compile=True, weight_dtype="int8"),
    "genprobe-int8-head": lambda s: genprobe_engine(s, compile=True, weight_dtype="int8", narrow_output=True),
    "genprobe-q8_0": lambda s: genprobe_engine(s, compile=True, weight_dtype="int8", narrow_output=True, gguf="Q8_0"),
    "genprobe-q4_0": lambda s: genprobe_engine(s, compile=True, weight_dtype="int8", narrow_output=True, gguf="Q4_0"),
    "genprobe-q4_k_m": lambda s: genprobe_engine(
        s, compile=True, weight_dtype="int8", narrow_output=True, gguf="Q4_K_M"
    ),
    "genprobe-bf16": lambda s: genprobe_engine(s, compile=True, weight_dtype="bfloat16"),
    "genprobe-eager": lambda s: genprobe_engine(s, compile=False),
    "hf": hf_engine,
    "llamacpp-f32": lambda s: llamacpp_engine(s, "F32"),
    "llamacpp-q8_0": lambda s: llamacpp_engine(s, "Q8_0"),
    "llamacpp-q4_0": lambda s: llamacpp_engine(s, "Q4_0"),
    "llamacpp-q4_k_m": lambda s: llamacpp_engine(s, "Q4_K_M"),
    "ct2": ct2_engine,
    "vllm": vllm_engine,
}


# ---- worker ---------------------------------------------------------------------------------------------------------
def claim_stdout() -> int:
    """A private copy of stdout for the JSON lines; fd 1 (Python's and C libraries' prints) goes to stderr."""
    sys.stdout.flush()
    out = os.dup(1)
    os.dup2(2, 1)
    return out


def measure(engine: Engine, name: str, setup: Setup, batch: int, tokens_only: bool) -> dict[str, Any]:
    """One warm-up call, then ``setup.reps`` timed calls of ``batch`` rows: the worker's JSON row."""
    row: dict[str, Any] = {"engine": name, "batch": batch, "new_tokens": setup.new_tokens, "unavailable": None}
    row.update(prompt_tokens=setup.prompt_tokens, threads=setup.threads, load_average=load_average())
    prompts = make_prompts(engine.tokenizer, batch, setup.prompt_tokens)
    try:
        warm, _, tokens = timed(lambda: engine.generate(prompts))
        row.update(warmup_s=warm, tokens=tokens, tokens_sha=tokens_sha(tokens), produced=sum(map(len, tokens)))
        row["short_rows"] = sum(len(t) != setup.new_tokens for t in tokens)
        series, agree = Series(), True
        for _ in range(0 if tokens_only else setup.reps):
            wall, cpu, again = timed(lambda: engine.generate(prompts))
            series.wall.append(wall)
            series.cpu.append(cpu)
            agree = agree and again == tokens
        if series.wall:
            row["tok_s"] = [row["produced"] / w for w in series.wall]
            row.update(median_tok_s=statistics.median(row["tok_s"]), reps_agree=agree, timing=json_safe(series))
        if engine.own_check is not None:
            row["own_eager_rows_equal"] = engine.own_check(prompts, tokens)
    except Exception as exc:  # noqa: BLE001 - an engine that fails at this batch is reported, the run goes on
        row["unavailable"] = f"{type(exc).__name__}: {exc}"
    row.update(weight_bytes=engine.weight_bytes, info=engine.info)
    return row


def worker_main(args: argparse.Namespace, setup: Setup) -> int:
    """Build the engine once, then print one JSON line per batch size (``unavailable`` rows when it cannot run)."""
    out = claim_stdout()

    def emit(row: dict[str, Any]) -> None:
        os.write(out, (json.dumps(row) + "\n").encode())

    import torch

    torch.set_num_threads(setup.threads)
    # the warm-up call builds genprobe's compiled programs and waits for them (benchmarks/first_call.py times a first
    # call that does not wait): the timed calls are the steady state
    os.environ["GENPROBE_AOT_BACKGROUND"] = "0"
    if args.worker == "bandwidth":
        emit(measure_bandwidth(setup, args.params))
        return 0
    t0 = time.perf_counter()
    try:
        engine = FACTORIES[args.worker](setup)
    except Exception as exc:  # noqa: BLE001 - Unavailable, or anything an optional engine raises while starting
        reason = str(exc) if isinstance(exc, Unavailable) else f"{type(exc).__name__}: {exc}"
        for b in setup.batches:
            emit({"engine": args.worker, "batch": b, "unavailable": reason})
        return 0
    setup_s = time.perf_counter() - t0
    for b in setup.batches:
        emit({**measure(engine, args.worker, setup, b, args.tokens_only), "setup_s": setup_s})
    return 0


def count_parameters(setup: Setup) -> int:
    """Parameters of the loaded float32 model, each counted once (the tied embedding once)."""
    m = load_genprobe(setup)
    return sum(p.numel() for p in m.module.parameters())


def measure_bandwidth(setup: Setup, params: int | None) -> dict[str, Any]:
    """Seconds of ``torch.sum`` over a float32 tensor of the model's weight bytes (median of 10): bytes/s read."""
    import gc

    import torch

    if params is None:
        params = count_parameters(setup)
        gc.collect()
    x = torch.ones(params, dtype=torch.float32)
    torch.sum(x)  # warm: pages touched, threads started
    seconds = []
    for _ in range(BANDWIDTH_REPS):
        t0 = time.perf_counter()
        torch.sum(x)
        seconds.append(time.perf_counter() - t0)
    median = statistics.median(seconds)
    return {
        "params": params,
        "bytes": params * 4,
        "seconds": seconds,
        "median_s": median,
        "gb_s": params * 4 / median / 1e9,
        "threads": setup.threads,
        "load_average": load_average(),
    }


# ---- driver ---------------------------------------------------------------------------------------------------------
def run_worker(name: str, setup: Setup, timeout: float, extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """One worker process: its JSON rows (an ``unavailable`` row per batch it did not report)."""
    cmd = [sys.executable, str(HERE), "--worker", name, *setup.worker_args(), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(setup.threads)}
    if setup.llamacpp_site is not None and name.startswith("llamacpp"):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(setup.llamacpp_site), env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
        stdout, why = proc.stdout, f"worker exited with {proc.returncode}: {last_line(proc.stderr)}"
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        why = f"worker timed out after {timeout:.0f} s"
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if name == "bandwidth":
        return rows or [{"unavailable": why}]
    seen = {r["batch"] for r in rows}
    rows += [{"engine": name, "batch": b, "unavailable": why} for b in setup.batches if b not in seen]
    return rows


def last_line(text: str) -> str:
    """The last non-empty line of a process's stderr (its error, usually)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no stderr)"


def run_rounds(setup: Setup, engines: list[str], rounds: int, timeout: float) -> dict[str, Any]:
    """Every round: the bandwidth process, then one process per engine (order reversed every other round)."""
    doc: dict[str, Any] = {"bandwidth": [], "rounds": []}
    params: int | None = None
    for r in range(rounds):
        extra = () if params is None else ("--params", str(params))
        bw = run_worker("bandwidth", setup, timeout, extra)[0]
        params = bw.get("params", params)
        doc["bandwidth"].append(bw)
        results: dict[str, dict[int, dict[str, Any]]] = {}
        for name in engines if r % 2 == 0 else engines[::-1]:
            results[name] = {row["batch"]: row for row in run_worker(name, setup, timeout)}
            for row in results[name].values():
                print(f"round {r + 1} {name} b{row['batch']}: {summary_word(row)}", file=sys.stderr, flush=True)
        doc["rounds"].append(results)
    doc["params"] = params
    return doc


def summary_word(row: dict[str, Any]) -> str:
    """One progress word for a worker row."""
    if row.get("unavailable"):
        return f"unavailable: {row['unavailable']}"
    if "median_tok_s" in row:
        return f"{row['median_tok_s']:.1f} tok/s (warm-up {row['warmup_s']:.1f} s)"
    return "tokens only"


def reference_tokens(setup: Setup, doc: dict[str, Any], engines: list[str], timeout: float) -> dict[int, Tokens]:
    """``genprobe-eager``'s tokens per batch: from the rounds when it ran there, else one tokens-only process."""
    if REFERENCE in engines:
        rows = [rnd[REFERENCE].get(b) for rnd in doc["rounds"] for b in setup.batches]
    else:
        rows = run_worker(REFERENCE, setup, timeout, ("--tokens-only",))
        doc["reference"] = rows
    out: dict[int, Tokens] = {}
    for row in rows:
        if row and not row.get("unavailable") and row["batch"] not in out:
            out[row["batch"]] = row["tokens"]
    return out


def main_worker_or_driver(argv: list[str] | None = None) -> int:
    """Parse the options; a worker when ``--worker`` is given, else the driver."""
    args = parse_args(argv)
    if args.worker:  # before torch, CTranslate2 or llama.cpp start an OpenMP runtime in this process
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    try:
        model_dir = model_dir_of(args.model)
    except (FileNotFoundError, ValueError) as exc:  # ModelLoadError: not fetched yet (it names the command)
        raise SystemExit(f"unavailable: model {args.model!r}: {exc}") from None
    setup = Setup(
        model=args.model,
        model_dir=model_dir,
        batches=args.batch,
        new_tokens=args.new_tokens,
        prompt_tokens=args.prompt_tokens,
        threads=args.threads,
        reps=args.reps,
        gguf_dir=args.gguf_dir,
        cache_dir=args.cache_dir,
        llamacpp_kv=args.llamacpp_kv,
        llamacpp_site=args.llamacpp_site,
    )
    if args.worker:
        return worker_main(args, setup)
    return driver_main(args, setup)


def driver_main(args: argparse.Namespace, setup: Setup) -> int:
    """Run the rounds, print the tables, write ``--out``/llama-speed.json."""
    unknown = [e for e in args.engines if e not in ENGINES]
    if unknown:
        raise SystemExit(f"unknown engine(s) {unknown}; known: {', '.join(ENGINES)}")
    doc = run_rounds(setup, args.engines, args.rounds, args.timeout)
    ref = {} if args.no_reference else reference_tokens(setup, doc, args.engines, args.timeout)
    summary = summarize(doc, setup, args.engines, args.ours, ref)
    print_tables(summary, setup, args.ours)
    print_builds(doc)
    print_bandwidth(summary, doc)
    if args.out:
        raw = {"setup": json_safe(setup), "engines": args.engines, "ours": args.ours, **doc, "summary": summary}
        write_json(args.out / "llama-speed.json", raw)
    return 0


# ---- summary and tables ---------------------------------------------------------------------------------------------
def engine_speeds(doc: dict[str, Any], engine: str, batch: int) -> list[float | None]:
    """The engine's median tok/s in each round at ``batch`` (None where it did not run)."""
    rows = [rnd.get(engine, {}).get(batch) or {} for rnd in doc["rounds"]]
    return [row.get("median_tok_s") for row in rows]


def first_row(doc: dict[str, Any], engine: str, batch: int) -> dict[str, Any]:
    """The engine's first round row with tokens at ``batch`` (else its first row, else {})."""
    rows = [rnd.get(engine, {}).get(batch) or {} for rnd in doc["rounds"]]
    good = [r for r in rows if r.get("tokens") is not None]
    return good[0] if good else (rows[0] if rows else {})


def summarize_engine(
    doc: dict[str, Any], engine: str, batch: int, ours: list[float | None], ref: Tokens | None
) -> dict[str, Any]:
    """One engine's figures at one batch: speeds per round, ratios ours/engine, token checks."""
    speeds = engine_speeds(doc, engine, batch)
    ratios = [o / s if o and s else None for o, s in zip(ours, speeds, strict=True)]
    row = first_row(doc, engine, batch)
    shas = {r[engine][batch].get("tokens_sha") for r in doc["rounds"] if batch in r.get(engine, {})}
    valid = [s for s in speeds if s]
    good_ratios = [q for q in ratios if q]
    return {
        "tok_s_per_round": speeds,
        "median_tok_s": statistics.median(valid) if valid else None,
        "ratio_ours_per_round": ratios,
        "median_ratio": statistics.median(good_ratios) if good_ratios else None,
        "warmup_s": [r[engine][batch].get("warmup_s") for r in doc["rounds"] if batch in r.get(engine, {})],
        "rows_equal_reference": None if ref is None or row.get("tokens") is None else rows_equal(row["tokens"], ref),
        "own_eager_rows_equal": row.get("own_eager_rows_equal"),
        "tokens_same_every_round": len(shas - {None}) <= 1,
        "short_rows": row.get("short_rows"),
        "weight_bytes": row.get("weight_bytes"),
        "unavailable": row.get("unavailable") if not valid else None,
    }


def summarize(
    doc: dict[str, Any], setup: Setup, engines: list[str], ours: str, ref: dict[int, Tokens]
) -> dict[str, Any]:
    """Per batch, per engine: :func:`summarize_engine`, plus the winner."""
    out: dict[str, Any] = {}
    for b in setup.batches:
        ours_speeds = engine_speeds(doc, ours, b)
        per = {e: summarize_engine(doc, e, b, ours_speeds, ref.get(b)) for e in engines}
        ranked = sorted((v["median_tok_s"], e) for e, v in per.items() if v["median_tok_s"])
        out[str(b)] = {"engines": per, "winner": ranked[-1][1] if ranked else None}
    return out


def fmt(x: float | None, spec: str = ".1f", suffix: str = "") -> str:
    """A number, or an em dash for none."""
    return "—" if x is None else f"{x:{spec}}{suffix}"


def print_tables(summary: dict[str, Any], setup: Setup, ours: str) -> None:
    """Per batch: one row per engine."""
    for b, s in summary.items():
        print(
            f"\n### batch {b}: {setup.new_tokens} greedy tokens after {setup.prompt_tokens}-token prompts, "
            f"{setup.threads} threads"
        )
        print(
            f"| engine | tok/s per round | median tok/s | {ours}/engine per round | median ratio | warm-up s "
            f"| rows = {REFERENCE} |\n|---|---|---|---|---|---|---|"
        )
        for e, v in s["engines"].items():
            if v["unavailable"]:
                print(f"| {e} | unavailable: {v['unavailable']} | | | | | |")
                continue
            per_round = " / ".join(fmt(x) for x in v["tok_s_per_round"])
            ratios = " / ".join(fmt(x, ".2f", "x") for x in v["ratio_ours_per_round"])
            warm = fmt(statistics.median(v["warmup_s"]) if v["warmup_s"] else None)
            eq = "—" if v["rows_equal_reference"] is None else f"{v['rows_equal_reference']}/{b}"
            if v["own_eager_rows_equal"] is not None:
                eq += f" (own eager: {v['own_eager_rows_equal']}/{b})"
            if not v["tokens_same_every_round"]:
                eq += " (tokens vary between rounds)"
            print(
                f"| {e} | {per_round} | {fmt(v['median_tok_s'])} | {ratios} | {fmt(v['median_ratio'], '.2f', 'x')}"
                f" | {warm} | {eq} |"
            )
        w = s["winner"]
        print(f"winner at batch {b}: {w} ({fmt(s['engines'][w]['median_tok_s'])} tok/s)" if w else "no winner")


def print_builds(doc: dict[str, Any]) -> None:
    """Which llama.cpp library each llama.cpp engine ran and the instruction sets it was built with (its system
    info's ``= 1`` entries): whether the peer is the portable AVX2 wheel or a build for this CPU."""
    seen = set()
    rows = [row for rnd in doc["rounds"] for name, by_batch in rnd.items() if name.startswith("llamacpp")
            for row in by_batch.values()]  # fmt: skip
    for row in rows:
        info = row.get("info") or {}
        if "system_info" not in info or info["library"] in seen:
            continue
        seen.add(info["library"])
        flags = [f.split("=")[0].strip() for f in info["system_info"].split("|") if f.strip().endswith("= 1")]
        print(f"\nllama.cpp library {info['library']}: {' '.join(flags)}")


def print_bandwidth(summary: dict[str, Any], doc: dict[str, Any]) -> None:
    """The bandwidth per round, the float32 bound, and each engine's achieved weight bytes/s at batch 1 (also
    recorded in ``summary``'s batch-1 entries: step_bytes, achieved_gb_s, fraction_of_bandwidth)."""
    bws = [bw["gb_s"] for bw in doc["bandwidth"] if "gb_s" in bw]
    if not bws or doc.get("params") is None:
        reasons = [bw.get("unavailable") for bw in doc["bandwidth"]]
        print(f"\nbandwidth: unavailable: {reasons}")
        return
    gb_s, f32_bytes = statistics.median(bws), doc["params"] * 4
    print(
        f"\n### memory bandwidth: torch.sum over {f32_bytes / 1e6:.1f} MB float32 ({doc['params']:,} parameters), "
        f"median of {BANDWIDTH_REPS}"
    )
    print(
        f"per round: {' / '.join(f'{x:.2f}' for x in bws)} GB/s, median {gb_s:.2f} GB/s; float32 bound at batch 1: "
        f"{gb_s * 1e9 / f32_bytes:.1f} tok/s"
    )
    if "1" not in summary:
        return
    print("| engine (batch 1) | weight bytes/step | median tok/s | achieved GB/s | fraction of bandwidth |")
    print("|---|---|---|---|---|")
    for e, v in summary["1"]["engines"].items():
        if v["median_tok_s"] is None:
            continue
        wb = v["weight_bytes"] or f32_bytes
        achieved = wb * v["median_tok_s"] / 1e9
        v.update(step_bytes=wb, achieved_gb_s=achieved, fraction_of_bandwidth=achieved / gb_s)
        print(f"| {e} | {wb / 1e6:.1f} MB | {v['median_tok_s']:.1f} | {achieved:.2f} | {achieved / gb_s:.2f} |")


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` atomically: a temp file in the same directory, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
    print(f"\nwrote {path}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line of both modes."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="catalog name or transformers directory (default smollm2)")
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), help=f"of {', '.join(ENGINES)}")
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="timed calls per worker after the warm-up call")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ours", default="genprobe", help="the engine the ratios are about")
    ap.add_argument("--gguf-dir", type=Path, default=Path("out/quant/smollm2"))
    ap.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "genprobe" / "bench")
    ap.add_argument("--llamacpp-kv", default="f32", choices=["f32", "f16"], help="llama.cpp's KV-cache type")
    ap.add_argument(
        "--llamacpp-site",
        type=Path,
        default=None,
        help="a llama.cpp build for this CPU (bash scripts/install_llamacpp.sh --for-this-cpu DIR): first on the "
        "llama.cpp workers' PYTHONPATH (default: the .venv's portable AVX2 build)",
    )
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per worker process")
    ap.add_argument("--no-reference", action="store_true", help=f"skip the {REFERENCE} token check")
    ap.add_argument("--out", type=Path, default=None, help="directory: every raw result in llama-speed.json (atomic)")
    ap.add_argument("--worker", choices=[*ENGINES, "bandwidth"], default=None, help="run one engine (JSON lines out)")
    ap.add_argument("--tokens-only", action="store_true", help="worker: one untimed call, its tokens")
    ap.add_argument("--params", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if min(args.batch) < 1 or args.new_tokens < 1 or args.prompt_tokens < 1 or args.threads < 1 or args.reps < 1:
        raise SystemExit("--batch, --new-tokens, --prompt-tokens, --threads and --reps must be >= 1")
    if args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    return args


if __name__ == "__main__":
    sys.exit(main_worker_or_driver())
