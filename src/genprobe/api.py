"""The library's entry points, each taking a loaded :class:`~genprobe.model.load.Model` and returning a typed result.

Every result's JSON form is :func:`genprobe.json_safe` of it. The CLI commands are thin shells over the same jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ._io import json_safe

if TYPE_CHECKING:  # pragma: no cover
    from .attention.leak import LeakReport
    from .attention.metrics import AttentionReport
    from .doctor.run import DoctorReport
    from .engine.samplers.stages import SamplerConfig
    from .loops.patch import Patch
    from .loops.repair import RepairReport
    from .loops.scan import ScanResult
    from .loops.study import RepairConfig
    from .metrics.calibrate import LoopCalibration
    from .metrics.degeneracy import LoopSettings
    from .model.load import Model

DEFAULT_ATTENTION_TEXT = "白日依山盡黃河入海流欲窮千里目更上一層樓"


def scan_loops(
    model: "Model",
    prompts: Sequence[str] | None = None,
    *,
    sampling: "SamplerConfig | None" = None,
    calibration: "LoopCalibration | None" = None,
    compile: bool = False,
    **options: Any,
) -> "ScanResult":
    """Generate after every prompt and measure loops (exact, near, repetitive tail, degenerate) with CIs.

    The default decoding is the loop studies' setting: greedy with the unknown and end tokens banned, a
    fixed number of new tokens. ``prompts`` defaults to held-out Tang openings for the bundled char model.
    ``options`` are :class:`~genprobe.loops.scan.ScanOptions`' fields: ``max_new_tokens`` (57), ``batch_size`` (64),
    ``seed``, ``progress`` (:func:`genprobe.scan_loop_settings` runs several settings, other engines); ``calibration``
    (:func:`calibrate_loops` at ``max_new_tokens``) fixes the detector settings and puts its human false-positive
    rates beside the scan's, else ``loop`` (default: the raw defaults); ``compile=True`` decodes through the
    compiled fast path (our GPT, Llama-family models; ``loops scan --compile``).
    """
    from .loops.scan import ScanOptions, scan_loop_settings

    scans = scan_loop_settings(
        model, prompts, {"scan": sampling}, ScanOptions(**options), calibration=calibration, compile=compile
    )
    return scans.scans["scan"]


def calibrate_loops(
    model: "Model",
    length: int = 57,
    human_text: str | Path | None = None,
    *,
    prompts: Sequence[str] | None = None,
    target: float = 0.01,
    base: "LoopSettings | None" = None,
) -> "LoopCalibration":
    """Loop-detector settings under which at most ``target`` of human text is flagged degenerate.

    The human text has the model's tokenizer and ``length`` tokens (a scan's ``max_new_tokens``): the file
    ``human_text`` (one document per line), else the corpus matching the prompts' script — held-out Tang
    poems for Chinese prompts (the bundled char model's default), the English corpus otherwise (fetched
    once with ``genprobe fetch english``). The result's held-out human rates go beside a scan's rates
    (``genprobe.scan_loops(model, calibration=...)``).
    """
    from .corpus.inputs import default_prompts
    from .loops.scan import calibrate_for_scan

    if model.tokenizer is None:
        raise ValueError("calibration needs the model's tokenizer (human text is measured in its tokens)")
    if prompts is None and human_text is None:
        prompts = default_prompts(model, 8)  # the char model's own held-out prompts: their script picks Tang text
    human = None if human_text is None else str(human_text)
    return calibrate_for_scan(
        model.tokenizer, length, list(prompts or []), human_text=human, base=base, target=target, unk_id=model.unk_id
    )


@dataclass
class LoopRepair:
    """A loop repair's report, the patch it chose (None when no edit passed the limits) and the files written."""

    report: "RepairReport"
    patch: "Patch | None"
    files: dict[str, str]

    def to_dict(self) -> dict:
        """The ``repair.json`` layout plus the files written."""
        return json_safe(self.report) | {"files": self.files}


def repair_loops(
    model: "Model",
    prompts: Sequence[str] | None = None,
    val_text: str | None = None,
    *,
    config: "RepairConfig | None" = None,
    out: str | Path | None = None,
    progress: bool = False,
    log: Callable[[str], None] = lambda msg: None,
    validate_prompts: Sequence[str] | None = None,
    chat: bool = False,
) -> LoopRepair:
    """Find a loop direction, search a small MLP edit under KL/Δloss limits, validate it on held-out prompts.

    ``prompts`` are split disjointly into direction / search / validation sets (only direction / search when
    ``validate_prompts``, your own held-out set, is given); ``val_text`` is held-out text for the regression limits.
    Both default to the Tang sets only for the bundled char model. ``chat``: every prompt is a user turn rendered by
    the model's chat template. With ``out``, writes repair.json, the patch, repair.html and repair.png there. The
    model is left unchanged.
    """
    from .corpus.inputs import default_prompts
    from .corpus.tang import load_corpus
    from .loops.pages import write_repair
    from .loops.repair import repair
    from .loops.study import RepairConfig, RepairInputs

    cfg = config or RepairConfig()
    if val_text is None:
        default_prompts(model, 1)  # the Tang validation text fits only the bundled char model
        val_text = load_corpus().val
    if prompts is None:
        if validate_prompts is not None:
            raise ValueError("validate_prompts needs prompts for the direction and search sets")
        inputs = RepairInputs.tang(model.tokenizer, cfg, ("direction", "search", "validate"))
        inputs.val_text = val_text
    else:
        inputs = RepairInputs.from_prompts(list(prompts), val_text, cfg, "prompts", "val_text", validate_prompts)
    if chat and model.chat_template is None:
        raise ValueError(f"chat=True: the model {model.source or ''} has no chat template")
    inputs.chat = chat
    report, patch = repair(model, inputs, cfg, progress=progress, log=log)
    files = write_repair(out, report, patch)["files"] if out is not None else {}
    return LoopRepair(report, patch, files)


def attention_heads(
    model: "Model", text: str | Sequence[int] = DEFAULT_ATTENTION_TEXT, *, distance: int = 8, local_window: int = 2
) -> "AttentionReport":
    """Per-head attention entropy, long-range (> ``distance``), sink, diagonal and local mass on one sequence."""
    from .attention.capture import capture_attention
    from .attention.metrics import attention_report

    ids = model.encode(text) if isinstance(text, str) else [int(t) for t in text]
    cap = capture_attention(model.module, ids)
    labels = [model.tokenizer.token_str(i) if model.tokenizer else str(i) for i in cap.tokens]
    return attention_report(cap, distance=distance, local_window=local_window, tokens_text=labels)


def padding_leak(
    model: "Model",
    texts: Sequence[str] = ("已驚飛。方從列子御", "白日依山盡黃河入海流"),
    *,
    position_ids: bool = True,
    threshold: float = 1e-4,
) -> "LeakReport":
    """Does padding change a sequence's logits? Each text alone vs inside left- and right-padded batches."""
    from .attention.leak import padding_leak as _padding_leak

    return _padding_leak(
        model.module, [model.encode(t) for t in texts], model.pad_id, position_ids=position_ids, threshold=threshold
    )


def diagnose(
    model: "Model", *, out: str | Path | None = None, log: Callable[[str], None] = lambda msg: None, **options: Any
) -> "DoctorReport":
    """Every check genprobe has, on ``model`` as the user runs it, in one :class:`~genprobe.doctor.run.DoctorReport`:
    the model card and tokenizer facts, the inference path (caches, padding, ``serving="vllm"``), attention health,
    degeneration under greedy and ``sampling`` on ``prompts``, which fix; ``report.exit_status`` is 0 healthy, 1 bug,
    4 warnings only. ``options`` are :class:`~genprobe.doctor.options.DoctorOptions`' fields (``prompts``, ``sampling``,
    ``serving``, ``with_edit``, ``impl``, ``reference`` …). With ``out``, writes prompts.txt, doctor.json and
    report.html there.
    """
    from .doctor.options import DoctorOptions
    from .doctor.run import run_doctor

    if options.get("only") is None:
        options.pop("only", None)  # every stage
    return run_doctor(model, DoctorOptions(**options), out=out, log=log)
