"""What llama.cpp's quantization types do to a model: logits, greedy text, loops and speed beside the F32 file.

From one float model (:mod:`.quantize`: llama.cpp's converter writes it as an all-F32 GGUF, its quantize API each
type), every type runs in llama.cpp itself (:mod:`.engine`), and is compared with **the F32 GGUF in llama.cpp**,
so the engine is the same on both sides and the difference is the weights' quantization (plus, for quantized
weights, llama.cpp's quantization of the activations that meet them in its dot products: ``ggml_vec_dot_q4_0_q8_0``
and friends in ``ggml/src/ggml-cpu/arch/x86/quants.c`` take each activation row quantized to Q8 blocks — part of
what a user of the type gets). One more row puts the F32 file in llama.cpp beside ``transformers`` float32 on the
same weights: the engine itself, which should agree to float noise.

Per type, on real human text the model was not tuned on (:func:`study_inputs`):

- **logits** on text windows, every position that predicts a next token: KL(F32 ‖ type) mean / p99 / max (nats),
  top-1 agreement (argmax, first index on a tie as llama.cpp's greedy sampler: ``llama_sampler_greedy_apply`` in
  ``src/llama-sampler.cpp`` keeps the first maximum, ``>`` not ``>=``), and the type's perplexity on the text;
- **greedy text**: the first step at which the type's greedy continuation of each prompt leaves F32's (end token
  banned, fixed length: the loop scan's generations, batched in llama.cpp), median and histogram;
- **loops**: calibrated exact-loop and degenerate rates with Wilson 95% intervals, the held-out human
  false-positive rate of the same detectors beside them, and the paired view (prompts that became degenerate /
  stopped being degenerate, with a two-sided sign test), since every type sees the same prompts;
- **speed**: greedy decode tokens per second at batch 1 (the first prompts, one at a time), same thread count, by
  the wall clock and per CPU-second of the process (at one thread: the speed of an idle core).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .quantize import DEFAULT_TYPES, QuantizedFile, check_types

Log = Callable[[str], None]
DIVERGENCE_BIN = 8
SPEED_PROMPTS = 8  # prompts generated one at a time (batch 1) to time decoding


def _quiet(msg: str) -> None:
    pass


# ---- logits ------------------------------------------------------------------------------------------------
def log_softmax64(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (``-inf`` logits stay ``-inf``; a row needs one finite logit)."""
    x = np.asarray(logits, dtype=np.float64)
    top = np.max(x, axis=-1, keepdims=True)
    shifted = x - top
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


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

    def to_dict(self) -> dict:
        """Plain JSON."""
        return asdict(self)


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
def first_divergence(reference: Sequence[int], tokens: Sequence[int]) -> int | None:
    """The first generation step (0-based) where ``tokens`` leaves ``reference``; None when they agree throughout
    (a shorter sequence diverges where it ends)."""
    for i, (a, b) in enumerate(zip(reference, tokens, strict=False)):
        if a != b:
            return i
    return None if len(reference) == len(tokens) else min(len(reference), len(tokens))


@dataclass
class Divergence:
    """Where each prompt's greedy continuation under a type first leaves F32's."""

    prompts: int
    diverged: int
    # the median over all prompts, a never-diverging one counted as beyond the budget (None: over half never do)
    median_step: float | None
    histogram: dict[str, int]  # "0-7", "8-15", ..., "never"
    steps: list[int | None]

    def to_dict(self) -> dict:
        """Plain JSON."""
        return asdict(self)


def divergence_summary(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> Divergence:
    """Per-prompt first divergence steps of ``other`` from ``reference`` (same prompts, same order)."""
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference generations but {len(other)} to compare")
    steps = [first_divergence(a, b) for a, b in zip(reference, other, strict=True)]
    hist: dict[str, int] = {}
    for s in steps:
        low = None if s is None else s // DIVERGENCE_BIN * DIVERGENCE_BIN
        key = "never" if low is None else f"{low}-{low + DIVERGENCE_BIN - 1}"
        hist[key] = hist.get(key, 0) + 1
    ordered = sorted(steps, key=lambda s: math.inf if s is None else s)
    mid = ordered[(len(ordered) - 1) // 2] if ordered else None
    order = sorted(hist, key=lambda k: math.inf if k == "never" else int(k.split("-")[0]))
    return Divergence(
        prompts=len(steps),
        diverged=sum(s is not None for s in steps),
        median_step=None if mid is None else float(mid),
        histogram={k: hist[k] for k in order},
        steps=steps,
    )


# ---- loops ---------------------------------------------------------------------------------------------------
def sign_test_p(up: int, down: int) -> float:
    """Two-sided exact sign test of ``up`` vs ``down`` discordant pairs (1.0 when there are none)."""
    n = up + down
    if n == 0:
        return 1.0
    k = min(up, down)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


@dataclass
class LoopOutcome:
    """Calibrated loop verdicts of one type's greedy generations, paired with F32's on the same prompts."""

    n: int
    loop_rate: float
    loop_rate_ci95: list[float]
    degenerate_rate: float
    degenerate_rate_ci95: list[float]
    human_fpr: dict[str, dict] | None  # the detectors' held-out human false-positive rates
    became_degenerate: int = 0  # prompts degenerate under this type but not under F32
    stopped_degenerate: int = 0
    sign_test_p: float = 1.0
    degenerate: list[bool] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Plain JSON."""
        return asdict(self)


def loop_outcome(scan: Any, reference: Any | None = None) -> LoopOutcome:
    """:class:`LoopOutcome` of a :class:`~genprobe.loops.scan.ScanResult`, paired with the F32 scan ``reference``."""
    s = scan.summary
    verdicts = [bool(r.degenerate) for r in scan.records]
    out = LoopOutcome(
        n=s.n,
        loop_rate=s.loop_rate,
        loop_rate_ci95=list(s.loop_rate_ci95),
        degenerate_rate=s.degenerate_rate,
        degenerate_rate_ci95=list(s.degenerate_rate_ci95),
        human_fpr=s.human_fpr,
        degenerate=verdicts,
    )
    if reference is not None:
        ref = [bool(r.degenerate) for r in reference.records]
        out.became_degenerate = sum(v and not r for v, r in zip(verdicts, ref, strict=True))
        out.stopped_degenerate = sum(r and not v for v, r in zip(verdicts, ref, strict=True))
        out.sign_test_p = sign_test_p(out.became_degenerate, out.stopped_degenerate)
    return out


def intervals_overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two closed intervals share a point."""
    return a[0] <= b[1] and b[0] <= a[1]


# ---- the study -------------------------------------------------------------------------------------------------
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

    def to_dict(self) -> dict:
        """Plain JSON."""
        return asdict(self)


@dataclass
class TypeRow:
    """One GGUF type against the F32 GGUF, everything in llama.cpp."""

    type: str
    file: QuantizedFile
    logits: LogitAgreement
    divergence: Divergence
    loops: LoopOutcome
    decode_tokens_per_s: float  # batch 1, greedy, SPEED_PROMPTS prompts (their short prefill included), wall clock
    # the same tokens per CPU-second of this process: at one thread, the speed on an idle core (a shared machine's
    # wall clock is not)
    decode_tokens_per_cpu_s: float | None = None

    def to_dict(self) -> dict:
        """Plain JSON."""
        d = asdict(self)
        d["file"] = self.file.to_dict()
        return d


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

    def to_dict(self) -> dict:
        """Plain JSON."""
        return asdict(self)


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

    def to_dict(self) -> dict:
        """Plain JSON (per-prompt steps and verdicts included)."""
        d = asdict(self)
        d["config"] = self.config.to_dict()
        d["engine_check"] = self.engine_check.to_dict()
        d["rows"] = [r.to_dict() for r in self.rows]
        d["samples"] = [s.to_dict() for s in self.samples]
        return d


def _windows(streams: Sequence[Sequence[int]], count: int, length: int) -> list[list[int]]:
    """Consecutive ``length``-token windows, stream by stream, until ``count``."""
    out: list[list[int]] = []
    for ids in streams:
        for start in range(0, len(ids) - length + 1, length):
            out.append(list(ids[start : start + length]))
            if len(out) == count:
                return out
    if len(out) < count:
        raise ValueError(f"the text gives only {len(out)} windows of {length} tokens; {count} asked for")
    return out


def study_inputs(model: Any, cfg: QuantStudyConfig) -> StudyInputs:
    """Real text and prompts the model was not tuned on: English (the English corpus's validation documents and
    their sentence openings) for an English model, else the Tang corpus (the char GPT's validation poems of
    ``reference_split()``, which the Llama reference never trains on, and openings of the last held-out poems);
    detectors calibrated on human text of the same tokenizer and generation length."""
    from ...loops.scan import calibrate_for_scan

    if _is_tang_model(model):
        from ...corpus.tang import bundled_documents, reference_split, split_texts
        from ...loops.prompts import heldout_openings

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
    return StudyInputs(
        text_source=text_source,
        windows=_windows(streams, cfg.text_windows, cfg.window_tokens),
        prompt_source=prompt_source,
        prompt_texts=list(prompts),
        prompt_ids=[model.encode(p) for p in prompts],
        calibration=calibration,
    )


def _is_tang_model(model: Any) -> bool:
    """A model trained on the Tang corpus: a genprobe checkpoint (the char GPT) or a directory written by
    ``genprobe train --arch llama|qwen2`` (it holds ``genprobe_training.json``)."""
    from ...model.subword_dir import SUMMARY_FILE

    return model.kind == "genprobe" or (model.source is not None and (Path(model.source) / SUMMARY_FILE).is_file())


def transformers_logits(model: Any, ids: Sequence[int]) -> np.ndarray:
    """float32 logits of every position from the ``transformers`` (or genprobe) module of ``model``."""
    import torch

    from ...loops.arch import forward_logits

    with torch.no_grad():
        out = forward_logits(model.module, torch.tensor([list(ids)], dtype=torch.long))
    return out[0].float().numpy()


# ---- running it ------------------------------------------------------------------------------------------------
def _open_llama_cpp(path: str, n_ctx: int, cfg: QuantStudyConfig) -> Any:
    from .engine import LlamaCppModel

    return LlamaCppModel(path, n_ctx=n_ctx, n_threads=cfg.threads, kv_type=cfg.kv_type)


def _scan_llama_cpp(engine: Any, model: Any, inputs: StudyInputs, cfg: QuantStudyConfig) -> Any:
    """Greedy loop scan through llama.cpp (:func:`~genprobe.serving.llamacpp.scan.scan_loops_llamacpp`: ``<unk>``
    and the end token banned, fixed length — the loop scan's chanting setting) with the calibrated detectors."""
    from ...loops.scan import annotate_scan, chanting_sampler
    from .scan import scan_loops_llamacpp

    res = scan_loops_llamacpp(
        engine,
        inputs.prompt_ids,
        cfg.max_new_tokens,
        chanting_sampler(model.unk_id, model.eos_id),
        seed=cfg.seed,
        eos_id=model.eos_id,
        unk_id=model.unk_id,
        loop=inputs.calibration.settings,
        decode=model.decode,
        prompt_texts=inputs.prompt_texts,
    )
    return annotate_scan(res, inputs.calibration)


@dataclass
class StudyBackend:
    """How a GGUF file is opened and scanned (llama.cpp by default; a test may pass its own)."""

    # (path, n_ctx, cfg) -> an engine with .logits(ids)
    open: Callable[[str, int, QuantStudyConfig], Any] = _open_llama_cpp
    scan: Callable[[Any, Any, StudyInputs, QuantStudyConfig], Any] = _scan_llama_cpp  # -> ScanResult


def _pre_tokenizer(model: Any) -> str | None:
    """The converter's pre-tokenizer name for our own BPE models (its hash table cannot know them)."""
    if not _is_tang_model(model) or model.kind == "genprobe":
        return None
    return {"llama": "gpt-2", "qwen2": "qwen2"}.get(model.arch)


def _f32_gguf(model: Any, out: Path, stem: str, log: Log) -> Path:
    """The model's F32 GGUF in ``out``, converted unless a file newer than the model's weights is there."""
    from .quantize import convert_to_gguf

    if model.source is None or not (Path(model.source) / "config.json").is_file():
        raise ValueError("the quantization study converts a transformers directory; this model was not loaded from one")
    path = out / f"{stem}-F32.gguf"
    newest = max(p.stat().st_mtime for p in Path(model.source).iterdir() if p.is_file())
    if path.is_file() and path.stat().st_mtime >= newest:
        log(f"reusing {path}")
        return path
    return convert_to_gguf(model.source, path, pre_tokenizer=_pre_tokenizer(model), log=log)


def _agreement(engine: Any, reference: list[np.ndarray], windows: list[list[int]]) -> LogitAgreement:
    acc = AgreementAccumulator()
    for ref, ids in zip(reference, windows, strict=True):
        acc.add(ref, np.asarray(engine.logits(ids), dtype=np.float32), ids)
    return acc.result()


def decode_speed(engine: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> tuple[float, float]:
    """Greedy decode at batch 1, one prompt after another: (tokens per wall-clock second, per CPU-second)."""
    wall, cpu = time.perf_counter(), time.process_time()
    made = sum(len(engine.greedy(list(p), max_new_tokens, stop_at_eos=False)) for p in prompts)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return made / max(wall, 1e-9), made / max(cpu, 1e-9)


def _timed_scan(backend: StudyBackend, engine: Any, model: Any, inputs: StudyInputs, cfg: QuantStudyConfig):
    """The scan and the batch-1 decode speed of the first ``SPEED_PROMPTS`` prompts."""
    res = backend.scan(engine, model, inputs, cfg)
    return res, decode_speed(engine, inputs.prompt_ids[:SPEED_PROMPTS], cfg.max_new_tokens)


def _row(
    name: str, file: QuantizedFile, logits: LogitAgreement, scan: Any, ref_scan: Any, speed: tuple[float, float]
) -> TypeRow:
    return TypeRow(
        type=name,
        file=file,
        logits=logits,
        divergence=divergence_summary([r.tokens for r in ref_scan.records], [r.tokens for r in scan.records]),
        loops=loop_outcome(scan, None if scan is ref_scan else ref_scan),
        decode_tokens_per_s=speed[0],
        decode_tokens_per_cpu_s=speed[1],
    )


def _samples(name: str, scan: Any, ref_scan: Any, div: Divergence, k: int) -> list[SampleText]:
    """Up to ``k`` prompts where the type's greedy text leaves F32's: verdict changes first, then earliest."""
    idx = [i for i, s in enumerate(div.steps) if s is not None]
    idx.sort(key=lambda i: (ref_scan.records[i].degenerate == scan.records[i].degenerate, div.steps[i], i))
    out = []
    for i in idx[:k]:
        r, q = ref_scan.records[i], scan.records[i]
        step = div.steps[i]
        assert step is not None
        out.append(SampleText(name, r.prompt or "", step, r.text or "", q.text or "", r.degenerate, q.degenerate))
    return out


def run_quant_study(
    model_ref: str,
    out_dir: str | os.PathLike[str],
    cfg: QuantStudyConfig | None = None,
    *,
    log: Log = _quiet,
    backend: StudyBackend | None = None,
) -> QuantStudy:
    """Convert ``model_ref`` (a transformers directory or catalog name) to an F32 GGUF, write each type of
    ``cfg.types`` beside it in ``out_dir``, and measure every type against F32 in llama.cpp (module doc); the
    study's JSON and markdown table are written to ``out_dir`` too (:func:`write_study`)."""
    from ...model.load import load_model
    from .quantize import quantize_all

    cfg = cfg or QuantStudyConfig()
    types = [t for t in check_types(cfg.types) if t != "F32"]
    started = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(model_ref)
    stem = Path(str(model.source)).name if model.source is not None else "model"
    f32 = _f32_gguf(model, out, stem, log)
    files = quantize_all(f32, out, ["F32", *types], threads=cfg.threads, stem=stem, log=log)
    inputs = study_inputs(model, cfg)
    log(
        f"{len(inputs.windows)} text windows ({inputs.text_source}); {len(inputs.prompt_ids)} prompts; "
        f"detectors: {inputs.calibration.describe()}"
    )
    engine_check, rows, samples = _measure(model, files, types, inputs, cfg, backend or StudyBackend(), log)
    study = QuantStudy(
        model=str(model_ref),
        model_note=_model_note(model_ref, model),
        config=cfg,
        text_source=inputs.text_source,
        prompt_source=inputs.prompt_source,
        calibration=inputs.calibration.to_dict(),
        engine_check=engine_check,
        rows=rows,
        samples=samples,
        findings=[],
        llama_cpp=_llama_cpp_facts(),
        seconds=time.perf_counter() - started,
    )
    study.findings = study_findings(study)
    write_study(study, out, stem)
    return study


def _measure(
    model: Any,
    files: dict[str, QuantizedFile],
    types: list[str],
    inputs: StudyInputs,
    cfg: QuantStudyConfig,
    backend: StudyBackend,
    log: Log,
) -> tuple[LogitAgreement, list[TypeRow], list[SampleText]]:
    """F32 first (the reference logits and scan, and the engine check against transformers), then each type."""
    n_ctx = max(cfg.window_tokens, max(len(p) for p in inputs.prompt_ids) + cfg.max_new_tokens) + 8
    ref_engine = backend.open(files["F32"].path, n_ctx, cfg)
    try:
        reference = [np.asarray(ref_engine.logits(w), dtype=np.float32) for w in inputs.windows]
        ref_scan, speed = _timed_scan(backend, ref_engine, model, inputs, cfg)
    finally:
        _close(ref_engine)
    engine_check = _engine_check(model, reference, inputs.windows)
    log(
        f"F32 in llama.cpp vs transformers float32: KL mean {engine_check.kl_mean:.3g}, top-1 "
        f"{engine_check.top1_agreement:.4f}; F32 {speed[0]:.1f} tok/s ({speed[1]:.1f} per CPU-s)"
    )
    rows = [_row("F32", files["F32"], _self_agreement(reference, inputs.windows), ref_scan, ref_scan, speed)]
    samples: list[SampleText] = []
    for name in types:
        engine = backend.open(files[name].path, n_ctx, cfg)
        try:
            agreement = _agreement(engine, reference, inputs.windows)
            scan, speed = _timed_scan(backend, engine, model, inputs, cfg)
        finally:
            _close(engine)
        row = _row(name, files[name], agreement, scan, ref_scan, speed)
        rows.append(row)
        samples += _samples(name, scan, ref_scan, row.divergence, cfg.samples)
        log(
            f"{name}: KL mean {agreement.kl_mean:.3g}, top-1 {agreement.top1_agreement:.4f}, "
            f"{row.divergence.diverged}/{len(inputs.prompt_ids)} greedy texts diverge, "
            f"degenerate {row.loops.degenerate_rate:.3f}, {row.decode_tokens_per_s:.1f} tok/s"
        )
    return engine_check, rows, samples


def _close(engine: Any) -> None:
    close = getattr(engine, "close", None)
    if close is not None:
        close()


def _self_agreement(reference: list[np.ndarray], windows: list[list[int]]) -> LogitAgreement:
    acc = AgreementAccumulator()
    for ref, ids in zip(reference, windows, strict=True):
        acc.add(ref, ref, ids)
    return acc.result()


def _engine_check(model: Any, reference: list[np.ndarray], windows: list[list[int]]) -> LogitAgreement:
    """transformers float32 as the reference, llama.cpp's F32 file as the other: the engine on the same weights."""
    acc = AgreementAccumulator()
    for ref, ids in zip(reference, windows, strict=True):
        acc.add(transformers_logits(model, ids), ref, ids)
    return acc.result()


def _model_note(model_ref: str, model: Any) -> str:
    from ...model.catalog import CATALOG

    if model_ref in CATALOG:
        return (
            f"{model_ref}: the package ships it as a Q4_1 GGUF, so its 'F32' is the Q4_1 weights dequantized: every "
            "type here re-quantizes weights that already lie on a 4-bit grid (16 levels per 32-value block)"
        )
    return f"{model_ref}: float32 weights ({model.num_parameters():,} parameters)"


def _llama_cpp_facts() -> dict[str, Any]:
    from ._bindings import require_llama_cpp

    lib = require_llama_cpp()
    info = lib.llama_print_system_info()
    return {"llama_cpp_python": lib.__version__, "system_info": info.decode() if isinstance(info, bytes) else str(info)}


# ---- what the numbers show -------------------------------------------------------------------------------------
def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _rate_ci(rate: float, ci: Sequence[float]) -> str:
    return f"{_pct(rate)} [{100 * ci[0]:.1f}–{100 * ci[1]:.1f}]"


def _median(div: Divergence, budget: int) -> str:
    return f"> {budget}" if div.median_step is None else f"{div.median_step:g}"


SIGNIFICANCE = 0.05  # two-sided, on the paired sign test


def loop_change(row: TypeRow, ref: TypeRow) -> int:
    """+1 / -1 when the type degenerates more / less often than F32 — the paired sign test on the same prompts
    below :data:`SIGNIFICANCE`, or the unpaired 95% intervals apart — else 0 (the data does not show a change)."""
    a, b = row.loops, ref.loops
    apart = not intervals_overlap(a.degenerate_rate_ci95, b.degenerate_rate_ci95)
    if a.sign_test_p >= SIGNIFICANCE and not apart:
        return 0
    return 1 if a.degenerate_rate > b.degenerate_rate else -1


def _loop_verdict(row: TypeRow, ref: TypeRow) -> str:
    a, b = row.loops, ref.loops
    paired = (
        f"paired on the same prompts: {a.became_degenerate} became degenerate, {a.stopped_degenerate} stopped, "
        f"sign test p = {a.sign_test_p:.2g}"
    )
    overlap = intervals_overlap(a.degenerate_rate_ci95, b.degenerate_rate_ci95)
    intervals = "the unpaired 95% intervals overlap" if overlap else "the unpaired 95% intervals are apart"
    change = loop_change(row, ref)
    if change == 0:
        return (
            f"{intervals} and the paired test is not significant: the data does not show a change in looping ({paired})"
        )
    way = "more" if change > 0 else "less"
    delta = 100 * (a.degenerate_rate - b.degenerate_rate)
    return f"this type degenerates {way} often than F32 ({delta:+.1f} points; {intervals}; {paired})"


def study_findings(study: QuantStudy) -> list[str]:
    """Sentences that say what the table shows: the engine, each type, and whether low bits loop more."""
    ec, ref = study.engine_check, study.rows[0]
    budget = study.config.max_new_tokens
    out = [
        f"Engine: the F32 GGUF in llama.cpp against transformers float32 on the same weights: KL mean "
        f"{ec.kl_mean:.2g} nats (max {ec.kl_max:.2g}), top-1 agreement {_pct(ec.top1_agreement)}, perplexity "
        f"{ec.perplexity:.3f} vs {ec.reference_perplexity:.3f} — "
        + (
            "float noise: the engine computes the model."
            if ec.kl_max < 1e-3 and ec.top1_agreement > 0.99
            else "more than float noise: look at the engine before reading the types."
        )
    ]
    for row in study.rows[1:]:
        lg, div = row.logits, row.divergence
        kind = "keeps every greedy text" if div.diverged == 0 else "changes greedy text"
        out.append(
            f"{row.type} ({row.file.bits_per_weight:.2f} bits/weight, {row.file.size_bytes / 2**20:.1f} MiB) {kind}: "
            f"KL mean {lg.kl_mean:.3g} nats (p99 {lg.kl_p99:.3g}), top-1 {_pct(lg.top1_agreement)}, perplexity "
            f"{lg.perplexity:.3f} vs F32 {lg.reference_perplexity:.3f}; {div.diverged}/{div.prompts} greedy "
            f"continuations leave F32's (median step {_median(div, budget)}); degenerate "
            f"{_rate_ci(row.loops.degenerate_rate, row.loops.degenerate_rate_ci95)} vs F32 "
            f"{_rate_ci(ref.loops.degenerate_rate, ref.loops.degenerate_rate_ci95)}: {_loop_verdict(row, ref)}."
        )
    out += [_fallback_note(row) for row in study.rows[1:] if row.file.shape_fallbacks]
    if len(study.rows) > 1:
        low = min(study.rows[1:], key=lambda r: r.file.bits_per_weight)
        change = loop_change(low, ref)
        delta = 100 * (low.loops.degenerate_rate - ref.loops.degenerate_rate)
        answer = {
            1: f"yes at {low.type}, the lowest-bit type here: {delta:+.1f} points of degenerate generations",
            0: f"not shown at {low.type}, the lowest-bit type here ({delta:+.1f} points, not significant)",
            -1: f"no: at {low.type}, the lowest-bit type here, it degenerates less ({delta:+.1f} points)",
        }[change]
        n = len(ref.loops.degenerate)
        out.append(f"Does low-bit quantization make the model loop more? {answer} ({n} prompts).")
    return out


def _fallback_note(row: TypeRow) -> str:
    """What a K-quant recipe became where the rows are not a multiple of 256 (llama.cpp's shape fallback)."""
    f = row.file
    quantized = {k: v for k, v in f.type_counts.items() if k not in ("F32", "F16", "BF16")}
    most = max(quantized, key=lambda k: quantized[k]) if quantized else f.main_type
    return (
        f"{row.type} is mostly {most}, not {f.main_type}: {len(f.shape_fallbacks)} 2-D tensors have rows that are "
        f"not a multiple of {f.main_type}'s 256-value block, and llama.cpp's tensor_type_fallback "
        f"(src/llama-quant.cpp) wrote them in another type ({', '.join(f'{k} ×{v}' for k, v in quantized.items())})."
    )


def study_markdown(study: QuantStudy) -> str:
    """The results table, the file recipes, sample texts and findings as markdown."""
    budget = study.config.max_new_tokens
    ec = study.engine_check
    lines = [
        f"### {study.model}",
        "",
        study.model_note + ".",
        f"Text: {study.text_source}, {ec.positions} positions. Prompts: {study.prompt_source}, "
        f"{study.config.prompts} × {budget} greedy tokens (end token banned). Threads: {study.config.threads}.",
        "",
        "| type | MiB | bits/weight | KL mean | KL p99 | top-1 | perplexity | greedy diverged | median step | "
        "exact loop [95% CI] | degenerate [95% CI] | +/− vs F32 (p) | tok/s (per CPU-s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| transformers fp32 → llama.cpp F32 | | | {ec.kl_mean:.2g} | {ec.kl_p99:.2g} | "
        f"{_pct(ec.top1_agreement)} | {ec.perplexity:.3f} (tf {ec.reference_perplexity:.3f}) | | | | | | |",
    ]
    for row in study.rows:
        lg, lo, div = row.logits, row.loops, row.divergence
        paired = f"+{lo.became_degenerate}/−{lo.stopped_degenerate} ({lo.sign_test_p:.2g})"
        paired = "—" if row.type == "F32" else paired
        lines.append(
            f"| {row.type} | {row.file.size_bytes / 2**20:.1f} | {row.file.bits_per_weight:.2f} | {lg.kl_mean:.3g} | "
            f"{lg.kl_p99:.3g} | {_pct(lg.top1_agreement)} | {lg.perplexity:.3f} | {div.diverged}/{div.prompts} | "
            f"{_median(div, budget)} | {_rate_ci(lo.loop_rate, lo.loop_rate_ci95)} | "
            f"{_rate_ci(lo.degenerate_rate, lo.degenerate_rate_ci95)} | {paired} | {_speed(row)} |"
        )
    lines += ["", _human_line(study), "", "What llama.cpp wrote (2-D tensors not at the recipe's main type):", ""]
    for row in study.rows:
        lines.append(f"- {row.file.describe()}")
    lines += ["", "Findings:", ""] + [f"- {f}" for f in study.findings]
    if study.samples:
        lines += ["", "Sample texts (greedy; the type's continuation leaves F32's at the step shown):", ""]
        for s in study.samples:
            lines += [
                f"- **{s.type}**, prompt `{s.prompt}`, diverges at step {s.step} "
                f"(degenerate: F32 {s.f32_degenerate}, {s.type} {s.degenerate})",
                f"  - F32: `{_one_line(s.f32_text)}`",
                f"  - {s.type}: `{_one_line(s.text)}`",
            ]
    return "\n".join(lines) + "\n"


def _speed(row: TypeRow) -> str:
    cpu = row.decode_tokens_per_cpu_s
    return f"{row.decode_tokens_per_s:.1f}" + ("" if cpu is None else f" ({cpu:.1f})")


def _one_line(text: str) -> str:
    return text.replace("\n", "⏎").replace("`", "'")


def _human_line(study: QuantStudy) -> str:
    fpr = study.rows[0].loops.human_fpr or {}
    parts = [f"{k} {_rate_ci(v['rate'], v['ci95'])}" for k, v in fpr.items() if k in ("exact", "degenerate")]
    src = study.calibration.get("source", "human text")
    return f"Detectors calibrated on {src}; held-out human false-positive rate: {', '.join(parts) or 'n/a'}."


def read_study(path: str | os.PathLike[str]) -> QuantStudy:
    """A study back from its ``quant-<model>.json`` (to re-render the table; findings recomputed from the numbers)."""
    import json

    d = json.loads(Path(path).read_text(encoding="utf-8"))
    rows = [
        TypeRow(
            type=r["type"],
            file=QuantizedFile(**r["file"]),
            logits=LogitAgreement(**r["logits"]),
            divergence=Divergence(**r["divergence"]),
            loops=LoopOutcome(**r["loops"]),
            decode_tokens_per_s=r["decode_tokens_per_s"],
            decode_tokens_per_cpu_s=r.get("decode_tokens_per_cpu_s"),
        )
        for r in d["rows"]
    ]
    cfg = d["config"]
    study = QuantStudy(
        **{k: d[k] for k in ("model", "model_note", "text_source", "prompt_source", "calibration", "llama_cpp")},
        config=QuantStudyConfig(**{**cfg, "types": tuple(cfg["types"])}),
        engine_check=LogitAgreement(**d["engine_check"]),
        rows=rows,
        samples=[SampleText(**x) for x in d["samples"]],
        findings=[],
        seconds=d["seconds"],
    )
    study.findings = study_findings(study)
    return study


def write_study(study: QuantStudy, out_dir: str | os.PathLike[str], stem: str) -> tuple[Path, Path]:
    """``quant-<stem>.json`` (everything) and ``quant-<stem>.md`` (the table) in ``out_dir``, atomically."""
    from ..._io import atomic_write_json, atomic_write_text

    out = Path(out_dir)
    js, md = out / f"quant-{stem}.json", out / f"quant-{stem}.md"
    atomic_write_json(js, study.to_dict())
    atomic_write_text(md, study_markdown(study))
    return js, md


def merge_studies(studies: Sequence[QuantStudy]) -> QuantStudy:
    """Studies of one model with the same settings, run in parallel on disjoint types, as one study: rows in
    bits-per-weight order after F32. Refused when the settings differ or the F32 references do not agree exactly
    (each run measured its own; llama.cpp is deterministic, so they must)."""
    from dataclasses import replace

    if not studies:
        raise ValueError("no studies to merge")
    first = studies[0]
    for s in studies[1:]:
        if s.model != first.model or replace(s.config, types=()) != replace(first.config, types=()):
            raise ValueError(f"cannot merge studies of different models or settings: {first.model} / {s.model}")
        same = s.rows[0].logits == first.rows[0].logits and s.rows[0].loops.degenerate == first.rows[0].loops.degenerate
        if not same or s.engine_check != first.engine_check:
            raise ValueError("the studies' F32 references differ: they did not run on the same file and inputs")
    others = [r for s in studies for r in s.rows[1:]]
    if len({r.type for r in others}) != len(others):
        raise ValueError("the studies overlap: a type was measured twice")
    rows = [first.rows[0], *sorted(others, key=lambda r: -r.file.bits_per_weight)]
    merged = replace(
        first,
        config=replace(first.config, types=tuple(r.type for r in rows[1:])),
        rows=rows,
        samples=[x for r in rows[1:] for s in studies for x in s.samples if x.type == r.type],
        seconds=max(s.seconds for s in studies),
    )
    merged.findings = study_findings(merged)
    return merged
