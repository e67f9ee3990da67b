"""What llama.cpp's quantization types do to a model: logits, greedy text, loops and speed beside the F32 file.

From one float model (:mod:`.quantize`: an all-F32 GGUF, then each type), every type runs in llama.cpp and is
compared with **the F32 GGUF in llama.cpp**, so the engine is the same on both sides and the difference is the
quantization (of the weights, and of the activations that meet them in llama.cpp's dot products). One more row puts
the F32 file beside ``transformers`` float32 on the same weights: the engine itself. Per type, on human text the
model was not tuned on (:func:`study_inputs`): logits (KL(F32 ‖ type), top-1 agreement — first index on a tie, as
llama.cpp's greedy sampler — and perplexity), the first step where greedy text leaves F32's, calibrated loop rates
paired with F32's on the same prompts (sign test), and batch-1 decode speed (docs/quantization.md).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..._io import json_safe
from ...loops.scan import LoopRates, ScanOptions, ScanResult
from ...metrics.stats import sign_test_p
from ..verify import first_difference
from .engine import LlamaCppModel, llama_cpp_facts, log_softmax64
from .quantize import DEFAULT_TYPES, QuantizedFile, check_types

Log = Callable[[str], None]
SPEED_PROMPTS = 8  # prompts generated one at a time (batch 1) to time decoding
DIVERGENCE_BIN = 8


# ---- logits ------------------------------------------------------------------------------------------------
def kl_per_position(ref_logits: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """KL(ref ‖ other) in nats per row. A token impossible under ``ref`` (``-inf``) adds nothing; one impossible
    under ``other`` but not ``ref`` makes the row ``inf``."""
    lp, lq = log_softmax64(ref_logits), log_softmax64(logits)
    p = np.exp(lp)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (lp - lq), 0.0)
    return np.sum(terms, axis=-1)


@dataclass
class LogitAgreement:
    """A model's logits beside the reference's on the same text positions."""

    positions: int
    kl_mean: float  # KL(reference ‖ this), nats
    kl_p99: float
    kl_max: float
    top1_agreement: float  # share of positions whose argmax (first index on a tie) is the reference's
    perplexity: float  # this model's, on the text's next tokens
    reference_perplexity: float


@dataclass
class AgreementAccumulator:
    """Window by window (the reference's logits of one window are dropped after use): KL, top-1, perplexity."""

    kl: list[np.ndarray] = field(default_factory=list)
    same_top1: int = 0
    nll: float = 0.0
    ref_nll: float = 0.0
    positions: int = 0

    def add(self, ref_logits: np.ndarray, logits: np.ndarray, ids: Sequence[int]) -> None:
        """One window: ``ids`` (n tokens), both models' logits at its n positions; positions 0..n-2 predict ids
        1..n-1 and are the ones counted."""
        n = len(ids) - 1
        if n < 1 or ref_logits.shape[0] < n or logits.shape[0] < n:
            raise ValueError(f"a window needs >= 2 tokens and logits for each; got {len(ids)} tokens")
        if ref_logits.shape[1] != logits.shape[1]:
            raise ValueError(f"vocabularies differ: reference {ref_logits.shape[1]}, other {logits.shape[1]}")
        r, q = ref_logits[:n], logits[:n]
        self.kl.append(kl_per_position(r, q))
        self.same_top1 += int(np.sum(np.argmax(r, axis=-1) == np.argmax(q, axis=-1)))
        nxt = np.asarray(ids[1:], dtype=np.int64)
        rows = np.arange(n)
        self.nll -= float(np.sum(log_softmax64(q)[rows, nxt]))
        self.ref_nll -= float(np.sum(log_softmax64(r)[rows, nxt]))
        self.positions += n

    def result(self) -> LogitAgreement:
        """The aggregate over every window added."""
        if not self.positions:
            raise ValueError("no text positions were compared")
        kl = np.concatenate(self.kl)
        return LogitAgreement(
            positions=self.positions,
            kl_mean=float(np.mean(kl)),
            kl_p99=float(np.quantile(kl, 0.99)),
            kl_max=float(np.max(kl)),
            top1_agreement=self.same_top1 / self.positions,
            perplexity=math.exp(self.nll / self.positions),
            reference_perplexity=math.exp(self.ref_nll / self.positions),
        )


# ---- greedy text ---------------------------------------------------------------------------------------------
@dataclass
class Divergence:
    """Where each prompt's greedy continuation under a type first leaves F32's."""

    prompts: int
    diverged: int
    # the median over all prompts, a never-diverging one counted as beyond the budget (None: over half never do)
    median_step: float | None
    histogram: dict[str, int]  # "0-7", "8-15", ..., "never"
    steps: list[int | None]


def divergence_summary(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> Divergence:
    """Per-prompt first divergence steps of ``other`` from ``reference`` (same prompts, same order)."""
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference generations but {len(other)} to compare")
    steps = [first_difference(a, b) for a, b in zip(reference, other, strict=True)]
    ordered = sorted(steps, key=lambda s: math.inf if s is None else s)  # the histogram's bins come out in order
    low = [None if s is None else s - s % DIVERGENCE_BIN for s in ordered]
    hist = Counter("never" if b is None else f"{b}-{b + DIVERGENCE_BIN - 1}" for b in low)
    mid = ordered[(len(ordered) - 1) // 2] if ordered else None
    median = None if mid is None else float(mid)
    return Divergence(len(steps), sum(s is not None for s in steps), median, dict(hist), steps)


def intervals_overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two closed intervals share a point."""
    return a[0] <= b[1] and b[0] <= a[1]


@dataclass
class QuantStudyConfig:
    """How much of everything: sized so that SmolLM2 runs in minutes per type on two cores."""

    types: tuple[str, ...] = DEFAULT_TYPES
    prompts: int = 96
    max_new_tokens: int = 64
    text_windows: int = 16
    window_tokens: int = 128
    threads: int = 1
    seed: int = 0
    samples: int = 3  # sample texts per changed type
    kv_type: str = "f32"  # llama.cpp's KV cache type on every side: f32 keeps its f16 rounding out of the engine row


@dataclass
class TypeRow:
    """One GGUF type against the F32 GGUF, everything in llama.cpp."""

    type: str
    file: QuantizedFile
    logits: LogitAgreement
    divergence: Divergence
    loops: LoopRates  # the calibrated scan's summary (human false-positive rates beside the rates)
    decode_tokens_per_s: float  # batch 1, greedy, SPEED_PROMPTS prompts (their short prefill included), wall clock
    # the same tokens per CPU-second of this process: at one thread, the speed on an idle core (a shared machine's
    # wall clock is not)
    decode_tokens_per_cpu_s: float
    degenerate: list[bool]  # per prompt
    became_degenerate: int = 0  # prompts degenerate under this type but not under F32 (paired on the same prompts)
    stopped_degenerate: int = 0
    sign_test_p: float = 1.0


@dataclass
class SampleText:
    """A prompt whose greedy continuation under ``type`` leaves F32's: both texts, and each one's loop verdict."""

    type: str
    prompt: str
    step: int
    f32_text: str
    text: str
    f32_degenerate: bool
    degenerate: bool


@dataclass
class StudyInputs:
    """The real text, the prompts and the detector calibration a study runs on."""

    text_source: str
    windows: list[list[int]]
    prompt_source: str
    prompt_texts: list[str]
    prompt_ids: list[list[int]]
    calibration: Any  # LoopCalibration


@dataclass
class QuantStudy:
    """Every type of one float model beside its F32 GGUF in llama.cpp, and the engine beside transformers."""

    model: str
    model_note: str
    config: QuantStudyConfig
    text_source: str
    prompt_source: str
    calibration: dict
    engine_check: LogitAgreement  # F32 in llama.cpp vs float32 transformers (the reference there)
    rows: list[TypeRow]
    samples: list[SampleText]
    findings: list[str]
    llama_cpp: dict[str, Any]
    seconds: float


def study_inputs(model: Any, cfg: QuantStudyConfig) -> StudyInputs:
    """Real text and prompts the model was not tuned on: English (the English corpus's validation documents and
    their sentence openings) for an English model, else the Tang corpus (the char GPT's validation poems of
    ``reference_split()``, which the Llama reference never trains on, and openings of the last held-out poems);
    detectors calibrated on human text of the same tokenizer and generation length."""
    from ...loops.scan import calibrate_for_scan

    if _is_tang_model(model):
        from ...corpus.inputs import heldout_openings
        from ...corpus.tang import bundled_documents, reference_split, split_texts

        texts = split_texts(bundled_documents(), reference_split())
        streams = [model.encode("".join(texts.char_val_documents))]
        text_source = "tang: reference_split() char-GPT validation poems (outside the subword training set)"
        prompts = heldout_openings(model.tokenizer, cfg.prompts, from_end=True, exclude_text="".join(texts.train))
        prompt_source = "tang: 5-character openings of the last held-out poems (not in the training text)"
    else:
        from ...corpus.english import english_prompt_sets, english_split

        streams = [model.encode(doc) for doc in english_split().validation]
        text_source = "english: validation documents of genprobe.corpus.english (Lee news corpus)"
        prompts = english_prompt_sets({"validate": cfg.prompts})["validate"]
        prompt_source = "english: sentence openings of the validation documents"
    calibration = calibrate_for_scan(model.tokenizer, cfg.max_new_tokens, prompts, unk_id=model.unk_id)
    n, count = cfg.window_tokens, cfg.text_windows  # consecutive n-token windows, stream by stream, until count
    windows = [list(ids[start : start + n]) for ids in streams for start in range(0, len(ids) - n + 1, n)]
    if len(windows) < count:
        raise ValueError(f"the text gives only {len(windows)} windows of {n} tokens; {count} asked for")
    windows = windows[:count]
    ids = [model.encode(p) for p in prompts]
    return StudyInputs(text_source, windows, prompt_source, list(prompts), ids, calibration)


def _is_tang_model(model: Any) -> bool:
    """A model trained on the Tang corpus: a genprobe checkpoint (the char GPT) or a directory written by
    ``genprobe train --arch llama|qwen2`` (it holds ``genprobe_training.json``)."""
    from ...model.hf_train import SUMMARY_FILE

    return model.kind == "genprobe" or (model.source is not None and (Path(model.source) / SUMMARY_FILE).is_file())


def transformers_logits(model: Any, ids: Sequence[int]) -> np.ndarray:
    """float32 logits of every position from the ``transformers`` (or genprobe) module of ``model``."""
    import torch

    from ...loops.regress import forward_logits

    with torch.no_grad():
        out = forward_logits(model.module, torch.tensor([list(ids)], dtype=torch.long))
    return out[0].float().numpy()


# ---- running it ------------------------------------------------------------------------------------------------
def _pre_tokenizer(model: Any) -> str | None:
    """The converter's pre-tokenizer name for a BPE its hash table cannot know (used only then): our own BPE models,
    and a ``tokenizer.json`` whose whole pre-tokenization is ``ByteLevel`` with GPT-2's split regex and no prefix
    space — what llama.cpp calls ``gpt-2`` (``LLAMA_VOCAB_PRE_TYPE_GPT2``, src/llama-vocab.cpp: the same regex)."""
    if model.kind == "genprobe" or model.source is None:
        return None
    if _is_tang_model(model):
        return {"llama": "gpt-2", "qwen2": "qwen2"}.get(model.arch)
    tokenizer_json = Path(model.source) / "tokenizer.json"
    if not tokenizer_json.is_file():
        return None
    spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    pre = spec.get("pre_tokenizer") or {}
    byte_level = pre.get("type") == "ByteLevel" and pre.get("use_regex", True) is True
    return "gpt-2" if spec.get("normalizer") is None and byte_level and pre.get("add_prefix_space") is False else None


def _agreement(refs: Iterable[np.ndarray], others: Iterable[np.ndarray], windows: list[list[int]]) -> LogitAgreement:
    """How the logits ``others`` agree with the reference logits ``refs``, window by window (read lazily: a window's
    logits over a large vocabulary are megabytes)."""
    acc = AgreementAccumulator()
    for ref, other, ids in zip(refs, others, windows, strict=True):
        acc.add(ref, other, ids)
    return acc.result()


def run_quant_study(
    model_ref: str,
    out_dir: str | os.PathLike[str],
    cfg: QuantStudyConfig | None = None,
    *,
    log: Log | None = None,
) -> tuple[QuantStudy, str]:
    """Convert ``model_ref`` (a transformers directory or catalog name) to an F32 GGUF, write each type of
    ``cfg.types`` beside it in ``out_dir``, and measure every type against F32 in llama.cpp (module doc). Returns
    the study (findings empty: :func:`.quant_report.study_findings` fills them) and the stem of its files in
    ``out_dir``."""
    from ...model.catalog import CATALOG
    from ...model.load import load_model

    cfg, log = cfg or QuantStudyConfig(), log or (lambda _: None)
    types = [t for t in check_types(cfg.types) if t != "F32"]
    started = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(model_ref)
    stem, files = _gguf_files(model, out, types, cfg.threads, log)
    inputs = study_inputs(model, cfg)
    log(
        f"{len(inputs.windows)} text windows ({inputs.text_source}); {len(inputs.prompt_ids)} prompts; "
        f"detectors: {inputs.calibration.describe()}"
    )
    rows, samples, engine_check = _measure_types(model, files, inputs, cfg, log)
    note = f"{model_ref}: float32 weights ({model.num_parameters():,} parameters)"
    if model_ref in CATALOG:
        note = (
            f"{model_ref}: the package ships it as a Q4_1 GGUF, so its 'F32' is the Q4_1 weights dequantized: every "
            "type here re-quantizes weights that already lie on a 4-bit grid (16 levels per 32-value block)"
        )
    study = QuantStudy(
        model=str(model_ref),
        model_note=note,
        config=cfg,
        text_source=inputs.text_source,
        prompt_source=inputs.prompt_source,
        calibration=json_safe(inputs.calibration),
        engine_check=engine_check,
        rows=rows,
        samples=samples,
        findings=[],
        llama_cpp=llama_cpp_facts(),
        seconds=time.perf_counter() - started,
    )
    return study, stem


def _gguf_files(
    model: Any, out: Path, types: list[str], threads: int, log: Log
) -> tuple[str, dict[str, QuantizedFile]]:
    """The F32 GGUF of the model's transformers directory and each type quantized from it: (stem, files by type)."""
    from .quantize import convert_to_gguf, quantize_all

    if model.source is None or not (Path(model.source) / "config.json").is_file():
        raise ValueError("the quantization study converts a transformers directory; this model was not loaded from one")
    stem = Path(model.source).name
    newest = max(p.stat().st_mtime for p in Path(model.source).iterdir() if p.is_file())
    f32 = convert_to_gguf(  # reused when a file newer than the model's weights is there
        model.source,
        out / f"{stem}-F32.gguf",
        pre_tokenizer=_pre_tokenizer(model),
        log=log,
        current=lambda p: p.is_file() and p.stat().st_mtime >= newest,
    )
    return stem, quantize_all(f32, out, ["F32", *types], threads=threads, stem=stem, log=log)


def _measure_types(
    model: Any, files: dict[str, QuantizedFile], inputs: StudyInputs, cfg: QuantStudyConfig, log: Log
) -> tuple[list[TypeRow], list[SampleText], LogitAgreement]:
    """Each file in llama.cpp, F32 (the reference) first: the rows, the samples, and F32 beside transformers."""
    from ...loops.scan import annotate_scan, chanting_sampler, scan_batches
    from .scan import llamacpp_batches

    n_ctx = max(cfg.window_tokens, max(len(p) for p in inputs.prompt_ids) + cfg.max_new_tokens) + 8
    open_file = partial(LlamaCppModel, n_ctx=n_ctx, n_threads=cfg.threads, kv_type=cfg.kv_type)
    # the greedy loop scan with <unk> and the end token banned, fixed length (the scan's chanting setting)
    options = ScanOptions(
        cfg.max_new_tokens,
        chanting_sampler(model.unk_id, model.eos_id),
        seed=cfg.seed,
        eos_id=model.eos_id,
        unk_id=model.unk_id,
        loop=inputs.calibration.settings,
        decode=model.decode,
    )
    rows: list[TypeRow] = []
    samples: list[SampleText] = []
    for name, file in files.items():  # F32 first: quantize_all keeps the order asked for
        with open_file(file.path) as engine:
            logits: Iterable[np.ndarray] = (np.asarray(engine.logits(w), dtype=np.float32) for w in inputs.windows)
            if name == "F32":
                reference = list(logits)
                logits = iter(reference)
            agreement = _agreement(reference, logits, inputs.windows)
            scan = scan_batches(llamacpp_batches(engine), inputs.prompt_ids, options, inputs.prompt_texts)
            # then greedy decode at batch 1 of the first prompts: tokens per wall-clock second, per CPU-second
            wall, cpu, speed_prompts = time.perf_counter(), time.process_time(), inputs.prompt_ids[:SPEED_PROMPTS]
            made = sum(len(engine.greedy(list(p), cfg.max_new_tokens, stop_at_eos=False)) for p in speed_prompts)
            speed = made / max(time.perf_counter() - wall, 1e-9), made / max(time.process_time() - cpu, 1e-9)
        scan = annotate_scan(scan, inputs.calibration)
        if name == "F32":
            ref_scan = scan
        verdicts, ref = [r.measures.degenerate for r in scan.records], [r.measures.degenerate for r in ref_scan.records]
        became = sum(v and not r for v, r in zip(verdicts, ref, strict=True))
        stopped = sum(r and not v for v, r in zip(verdicts, ref, strict=True))
        div = divergence_summary([r.tokens for r in ref_scan.records], [r.tokens for r in scan.records])
        sign_p = sign_test_p(became, stopped)
        row = TypeRow(name, file, agreement, div, scan.summary, *speed, verdicts, became, stopped, sign_p)
        rows.append(row)
        if name == "F32":
            # transformers float32 as the reference, llama.cpp's F32 file as the other: the engine on the same weights
            tf = (transformers_logits(model, w) for w in inputs.windows)
            engine_check = _agreement(tf, reference, inputs.windows)
            log(
                f"F32 in llama.cpp vs transformers float32: KL mean {engine_check.kl_mean:.3g}, top-1 "
                f"{engine_check.top1_agreement:.4f}; F32 {speed[0]:.1f} tok/s ({speed[1]:.1f} per CPU-s)"
            )
            continue
        samples += _changed_samples(row, ref_scan, scan, cfg.samples)
        log(
            f"{name}: KL mean {agreement.kl_mean:.3g}, top-1 {agreement.top1_agreement:.4f}, "
            f"{row.divergence.diverged}/{len(inputs.prompt_ids)} greedy texts diverge, "
            f"degenerate {row.loops.degenerate_rate:.3f}, {row.decode_tokens_per_s:.1f} tok/s"
        )
    return rows, samples, engine_check


def _changed_samples(row: TypeRow, ref_scan: ScanResult, scan: ScanResult, limit: int) -> list[SampleText]:
    """Up to ``limit`` prompts where the type's greedy text leaves F32's: verdict changes first, then earliest."""
    steps, records = row.divergence.steps, list(zip(ref_scan.records, scan.records, strict=True))
    idx = sorted(
        (i for i, st in enumerate(steps) if st is not None),
        key=lambda i: (records[i][0].measures.degenerate == records[i][1].measures.degenerate, steps[i], i),
    )
    samples = []
    for i in idx[:limit]:
        r, q, step = *records[i], steps[i] or 0
        was, now = r.measures.degenerate, q.measures.degenerate
        samples.append(SampleText(row.type, r.prompt or "", step, r.text or "", q.text or "", was, now))
    return samples
