"""What a doctor run is asked to do (:class:`DoctorOptions`) and its budget (:class:`Budget`: ``quick`` for a CI gate,
the full run for a release), its prompts (:func:`doctor_inputs`), the :class:`DoctorRun` every stage job takes and
the :class:`Finding` each returns. The worst severity found is the :class:`Verdict` and exit status (docs/doctor.md)."""

from __future__ import annotations

import shlex
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Sequence

from ..corpus.inputs import held_out
from ..engine.samplers.stages import SamplerConfig
from ..model.kinds import is_url
from ..model.load import Model

SEVERITIES = ("ok", "info", "warning", "bug")  # ordered: a verdict is the worst severity found


@dataclass
class Finding:
    """One check: ``stage`` (card, inference, attention, degeneration, fixes), ``check`` (a short id such as
    ``tokenizer.round_trip``), ``severity``, a one-line ``title``, the ``evidence`` behind it, the ``criterion``
    that turned the evidence into the severity and the ``command`` that reproduces the check alone."""

    stage: str
    check: str
    severity: str
    title: str
    evidence: dict[str, Any] = field(default_factory=dict)
    criterion: str | None = None
    command: str | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")


# the verdict and exit status of each worst severity (2, bad input, is the CLI's: no run, no verdict)
VERDICTS = {"ok": ("healthy", 0), "info": ("healthy", 0), "warning": ("warnings", 4), "bug": ("bug", 1)}


@dataclass
class Verdict:
    """The run's verdict (healthy, warnings, bug), its exit status and the findings that decided it."""

    verdict: str
    exit_status: int
    bugs: list[str]
    warnings: list[str]

    @classmethod
    def of(cls, findings: list[Finding]) -> Verdict:
        """The worst severity decides: a bug → 1, a warning → 4, else 0."""
        name, code = VERDICTS[max((f.severity for f in findings), key=SEVERITIES.index, default="ok")]
        bugs, warnings = ([f.title for f in findings if f.severity == s] for s in ("bug", "warning"))
        return cls(name, code, bugs, warnings)


TITLES = {  # each stage, in the order they run
    "audit": "static audit",
    "card": "model card",
    "quality": "quality on held-out text",
    "inference": "inference path",
    "attention": "attention health",
    "degeneration": "degeneration under your settings",
    "fixes": "which fix",
}
STAGES = tuple(TITLES)
SERVING = ("vllm",)


@dataclass(frozen=True)
class Budget:
    """How much each stage runs: verify-cache steps and phases, prompts and tokens of the loop scans, the
    which-fix comparison's size (0 prompts: skipped)."""

    verify_steps: int
    verify_prefix_reuse: bool
    verify_chunks: tuple[int, ...]
    all_cache_classes: bool
    scan_prompts: int
    scan_tokens: int
    eos_prompts: int
    fix_prompts: int
    attention_tokens: int


QUICK = Budget(8, False, (4,), False, 32, 32, 16, 0, 48)
FULL = Budget(24, True, (1, 4), True, 128, 48, 64, 48, 64)


@dataclass
class DoctorOptions:
    """A doctor run's settings, ``genprobe doctor``'s flags (docs/doctor.md)."""

    prompts: Sequence[str] | None = None  # None: held-out prompts of the model's language
    sampling: SamplerConfig | None = None  # None: the model's generation defaults when they sample, else greedy only
    chat: bool = False
    serving: str | None = None
    quick: bool = False
    max_loop_rate: float | None = None
    with_edit: bool = False
    impl: str | None = None  # the user's cache implementation, "module:factory"
    hf_position_ids: bool = True  # the user's code passes position_ids to a transformers model
    only: Sequence[str] = STAGES
    seed: int = 0
    sampling_flags: Sequence[str] = ()  # the sampler flags as typed, for the reproducing commands
    prompts_file: str | None = None  # where the prompts used are written, for the reproducing commands
    budget: Budget | None = None  # None: QUICK or FULL, as ``quick`` says
    reference: str | None = None  # the original model (FILE_OR_DIR) the quality stage compares with

    def __post_init__(self) -> None:
        unknown = [s for s in self.only if s not in STAGES]
        if unknown or not self.only:
            raise ValueError(f"stages must be among {', '.join(STAGES)}, got {list(self.only) or 'none'}")
        if self.serving is not None and self.serving not in SERVING and not is_url(self.serving):
            raise ValueError(f"serving must be one of {SERVING} or a live server's URL, got {self.serving!r}")
        if self.max_loop_rate is not None and not 0.0 <= self.max_loop_rate <= 1.0:
            raise ValueError(f"max_loop_rate (--max-loop-rate) must be in [0, 1], got {self.max_loop_rate}")
        if self.prompts is not None and (not self.prompts or any(not p for p in self.prompts)):
            raise ValueError("prompts: give at least one prompt, and no empty prompt")
        if self.with_edit and self.quick:
            raise ValueError("with_edit runs a repair search, which quick mode leaves out: drop one of them")
        self.budget = self.budget or (QUICK if self.quick else FULL)

    @property
    def plan(self) -> Budget:
        """The budget in force (set by ``quick`` unless given)."""
        return self.budget or FULL

    @property
    def engine(self) -> str | None:
        """The engine whose semantics the user's sampler reproduces (None: genprobe's own)."""
        return None if self.sampling is None else self.sampling.engine

    def prompts_arg(self) -> str:
        """``--prompts FILE`` for a reproducing command (a placeholder when the prompts were not written)."""
        return f"--prompts {shlex.quote(self.prompts_file) if self.prompts_file else 'PROMPTS'}"

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the prompts themselves are in the degeneration stage; the file they were written to is not)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("only", "prompts_file")}
        return d | {"prompts": "user" if self.prompts is not None else "built-in held-out", "stages": list(self.only)}


EDIT_PROMPTS = 128  # prompts the weight edit searches on, disjoint from the scanned ones when built in
EDIT_MIN = 64  # your prompts beyond the comparison's that let the edit search on others (else on all of them)


@dataclass
class DoctorInputs:
    """Prompts to scan, prompts for the edit, held-out text, where they came from (None: no tokenizer)."""

    prompts: list[str] | None
    edit_prompts: list[str]
    val_text: str | None
    source: str
    error: str | None = None


def doctor_inputs(model: Model, opts: DoctorOptions) -> DoctorInputs:
    """The user's prompts, else the built-in held-out ones (the reason when there are none)."""
    b = opts.plan
    if model.tokenizer is None:
        return DoctorInputs(None, [], None, "none", "the model has no tokenizer")
    extra = EDIT_PROMPTS if opts.with_edit else 0
    try:
        d = held_out(model, count=b.scan_prompts + extra) if opts.prompts is None or extra else None
    except (ValueError, FileNotFoundError) as exc:
        if opts.prompts is None:
            return DoctorInputs(None, [], None, "none", f"{type(exc).__name__}: {exc}")
        d = None
    val = "\n".join(d.texts) if d is not None else None
    if opts.prompts is not None:
        user = list(opts.prompts)
        if {"degeneration", "fixes"} & set(opts.only) and model.max_positions is not None:  # they generate after
            with warnings.catch_warnings(action="ignore"):  # unknown characters are the model card's finding
                longest = max(len(model.encode(model.chat_prompt(p) if opts.chat else p)) for p in user)
            if longest + b.scan_tokens > model.max_positions:  # bad input: no room for the tokens a scan generates
                raise ValueError(
                    f"prompts: the longest has {longest} tokens, and with the {b.scan_tokens} new tokens a scan "
                    f"generates it exceeds the model's context length {model.max_positions}; give prompts of at most "
                    f"{max(0, model.max_positions - b.scan_tokens)} tokens"
                )
        rest = user[b.fix_prompts :]  # the edit searches on the prompts the comparison does not use, when enough
        return DoctorInputs(user, rest if len(rest) >= EDIT_MIN else user, val, "prompts (user)")
    assert d is not None
    source = str(d.sources.get("corpus", "held-out"))
    scan = d.prompts[: b.scan_prompts]
    return DoctorInputs(scan, d.prompts[b.scan_prompts :] or scan, val, f"{source} held-out prompts")


QUICK_SKIP = "quick mode"


class StageSkipped(Exception):
    """A stage that cannot run on this model or in this mode (the reason is reported)."""


@dataclass
class DoctorRun:
    """One run as every stage reads it: the model, the options, the inputs, the model as the reproducing commands name
    it (``arg``, shell-quoted), the log, and the report so far (a later stage reads an earlier one's result)."""

    model: Model
    opts: DoctorOptions
    inputs: DoctorInputs
    arg: str
    log: Callable[[str], None]
    report: Any  # the DoctorReport being filled

    def note(self, msg: str) -> None:
        """A progress line inside a stage, indented under the stage's own."""
        self.log("  " + msg)

    def prompts(self) -> list[str]:
        """The prompts to generate after (:class:`StageSkipped` when there are none)."""
        if self.inputs.prompts is None:
            raise StageSkipped(self.inputs.error or "no prompts")
        return self.inputs.prompts
