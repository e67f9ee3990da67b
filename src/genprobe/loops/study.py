"""A loop study: :class:`RepairConfig` (sizes, grids, limits), :class:`RepairInputs` (three disjoint prompt sets and
the validation text) and :class:`LoopStudy` (a loaded model with its sampler, end token banned, scanned as it is
*now*, so edits applied in place are seen by the next scan).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ..corpus.inputs import heldout_openings, slices, split_prompts
from ..engine.samplers.stages import SamplerConfig
from ..metrics.degeneracy import LoopSettings
from ..model.arch import mlp_sites
from .patch import FORMS
from .scan import (
    EndToken,
    ScanOptions,
    ScanResult,
    chanting_sampler,
    encode_prompts,
    engine_batches,
    scan_batches,
    study_options,
    study_sampler,
)

SET_NAMES = ("direction", "search", "validate")
SEARCHES = ("auto", "exhaustive", "scaled")
EXHAUSTIVE_MAX = 100  # grid sizes up to this are searched exhaustively under search="auto" (the 4-layer models)


@dataclass
class RepairConfig:
    """Sizes, grids and limits of a repair run (defaults = the CLI's, budgeted for ≤ 10 CPU minutes)."""

    n_direction: int = 768
    n_search: int = 1024
    n_validate: int = 1024
    prefix_chars: int = 5
    max_new_tokens: int = 57
    search_prone: int = 48
    search_control: int = 96
    scan_inadmissible: bool = False  # also generate for candidates already over the regression limits
    ks: tuple[int, ...] = (8, 32)
    subtract_alphas: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)  # relative to the loop gap (see make_patch)
    project_alphas: tuple[float, ...] = (0.25, 0.5, 1.0, 1.5, 2.0)  # fraction of the projection removed
    forms: tuple[str, ...] = FORMS
    layer_sets: tuple[tuple[int, ...], ...] | None = None  # None: each layer alone and all together
    search: str = "auto"  # exhaustive | scaled | auto (exhaustive up to EXHAUSTIVE_MAX candidates)
    top_layers: int = 3  # scaled: best-ranked layers tried alone (and together)
    keep: int = 8  # scaled: screened candidates that go on to generation
    screen_sequences: int = 8  # scaled: looping generations the loop probe teacher-forces
    screen_windows: int = 8  # scaled: validation windows of the screening regression check
    screen_strengths: int = 2  # scaled: admissible strengths per chain whose loop pressure is read (strongest first)
    method: str = "mean_diff"
    max_kl: float = 0.1
    max_dloss: float = 0.02
    regression_windows: int = 96
    val_window: int | None = None  # tokens per regression window; None: the model's context, at most 64
    batch_size: int = 128
    seed: int = 0
    samples: int = 6
    loop: LoopSettings = field(default_factory=LoopSettings)  # exact + near loop detector settings
    plain_greedy_check: int = 256  # validate prompts also scanned under plain greedy before/after (0 = skip)
    transfer: int = 128  # validate prompts also scanned in the other setting (chat template or plain; 0 = skip)

    def __post_init__(self) -> None:
        if self.search not in SEARCHES:
            raise ValueError(f"search must be one of {SEARCHES}, got {self.search!r}")
        for name in ("top_layers", "keep", "screen_sequences", "screen_windows", "screen_strengths"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("ks", "subtract_alphas", "project_alphas"):
            if any(x <= 0 for x in getattr(self, name)):
                raise ValueError(f"{name} values must be > 0, got {list(getattr(self, name))}")

    def alphas(self) -> dict[str, tuple[float, ...]]:
        """Each edit form's strength grid."""
        return {"subtract": self.subtract_alphas, "project": self.project_alphas}

    def sizes(self) -> dict[str, int]:
        """Requested size of each prompt set."""
        return {"direction": self.n_direction, "search": self.n_search, "validate": self.n_validate}


# ---- inputs ---------------------------------------------------------------------------------
@dataclass
class RepairInputs:
    """Three disjoint prompt sets and the validation text, with where each came from."""

    direction: list[str]
    search: list[str]
    validate: list[str]
    val_text: str
    prompt_source: str
    val_source: str
    chat: bool = False  # the prompts are user turns, rendered by the model's chat template before encoding

    @classmethod
    def tang(cls, tokenizer: Any, cfg: RepairConfig, sets: Sequence[str] = SET_NAMES) -> "RepairInputs":
        """Held-out Tang openings and the bundled corpus's validation text (the bundled char model's defaults)."""
        from ..corpus.tang import load_corpus

        sizes = {k: cfg.sizes()[k] for k in sets}
        got = slices(heldout_openings(tokenizer, sum(sizes.values()), cfg.prefix_chars), sizes)
        direction, search, validate = (got.get(k, []) for k in SET_NAMES)
        return cls(direction, search, validate, load_corpus().val, "tang-heldout-openings", "tang-validation-split")

    @classmethod
    def from_prompts(
        cls,
        prompts: Sequence[str],
        val_text: str,
        cfg: RepairConfig,
        prompt_source: str = "prompts",
        val_source: str = "text",
        validate: Sequence[str] | None = None,
    ) -> "RepairInputs":
        """The user's prompts, split disjointly and deterministically (see :func:`split_prompts`), and their text;
        ``validate``: the user's own held-out prompts (the first ``cfg.n_validate`` distinct ones; none may be in
        ``prompts``, which then feed only the direction and search sets)."""
        held = None if validate is None else list(dict.fromkeys(validate))[: cfg.n_validate]
        shared = set(held or ()) & set(prompts)
        if shared:
            raise ValueError(
                f"{len(shared)} validation prompt(s) are also search/direction prompts (e.g. {sorted(shared)[0]!r}): "
                "held-out prompts must be unseen by the search"
            )
        got = split_prompts(prompts, {k: n for k, n in cfg.sizes().items() if held is None or k != "validate"})
        validation = got["validate"] if held is None else held
        return cls(got["direction"], got["search"], validation, val_text, prompt_source, val_source)

    def summary(self) -> dict:
        """Sources, sizes and the first prompts of each set (JSON)."""
        return {
            "prompt_source": self.prompt_source,
            "val_source": self.val_source,
            "val_chars": len(self.val_text),
            "chat": self.chat,
            **{k: {"n": len(getattr(self, k)), "first": getattr(self, k)[:3]} for k in SET_NAMES},
        }


# ---- how we generate and measure ------------------------------------------------------------
class LoopStudy:
    """One model under study: its engine, tokenizer and scan options (``options``: sampler with the end token
    banned, batch, seed, detector settings and decoder, so another engine's scan measures what ours would)."""

    def __init__(
        self,
        model: Any,
        cfg: RepairConfig,
        sampler: SamplerConfig | None = None,
        progress: bool = False,
        log: Callable[[str], None] = lambda msg: None,
    ):
        self.eos_id = model.eos_id
        self.sampler = study_sampler(sampler or chanting_sampler(model.unk_id), self.eos_id)
        scan = ScanOptions(cfg.max_new_tokens, self.sampler, cfg.batch_size, cfg.seed, loop=cfg.loop, progress=progress)
        self.options = study_options(model, scan)
        self.end_token: EndToken = self.options.end_token
        self.model, self.cfg, self.progress, self.log = model, cfg, progress, log
        self.module, self.tokenizer = model.module, model.tokenizer
        self.n_layers = len(mlp_sites(self.module))

    def encode(self, texts: Sequence[str], chat: bool = False) -> list[list[int]]:
        """Prompts → ids (:func:`encode_prompts`), each a user turn of the chat template when ``chat``."""
        return encode_prompts(self.model, [self.model.chat_prompt(t) for t in texts] if chat else texts)

    def scan(
        self,
        ids: Sequence[list[int]],
        texts: Sequence[str] | None = None,
        *,
        sampler: SamplerConfig | None = None,
        desc: str = "scan",
        decoded: bool = True,
    ) -> ScanResult:
        """Scan ``ids`` on the model as it is now; ``decoded=False``: token measures only, no progress bar."""
        quiet: dict[str, Any] = {} if decoded else {"decode": None, "progress": False}
        options = replace(self.options, sampler=sampler or self.sampler, desc=desc, **quiet)
        return scan_batches(engine_batches(self.model), ids, options, texts)


class Clock:
    """Wall-clock seconds per named stage."""

    def __init__(self) -> None:
        self.t0 = self.last = time.perf_counter()
        self.stages: dict[str, float] = {}

    def tick(self, name: str) -> None:
        """Record the time since the previous tick under ``name``."""
        now = time.perf_counter()
        self.stages[name] = round(now - self.last, 2)
        self.last = now

    def to_dict(self) -> dict[str, float]:
        """Stage times and the total."""
        return {**self.stages, "total": round(time.perf_counter() - self.t0, 2)}
