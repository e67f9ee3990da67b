"""``SamplerConfig``: every sampler parameter, validated, plus the engine presets.

Two independent choices shape the chain:

* ``order`` — where each stage sits (:data:`ORDERS`);
* ``engine`` — whose arithmetic each stage uses: ``genprobe`` (exact, float64 nucleus, the report
  lab's rules), ``hf`` (transformers' processors/warpers), ``vllm`` (vLLM's PyTorch sampler) or
  ``llama.cpp`` (its candidate-array samplers, float32). ``engine`` defaults to the order's name
  when the order is an engine's, else to ``genprobe``.

:meth:`SamplerConfig.preset` fills an engine's *defaults* (llama.cpp: top-k 40, top-p 0.95,
min-p 0.05, τ 0.8, penalty window 64; HF ``generate``: top-k 50) and keeps ``order`` selectable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

ENGINES = ("genprobe", "hf", "vllm", "llama.cpp")

# Truncation/temperature stages per order (penalties and DRY always come first; they are adjustments).
# Stages an engine does not have sit where they do least harm: after its own truncations.
ORDERS: dict[str, tuple[str, ...]] = {
    "trunc_then_temp": ("top_n_sigma", "top_k", "typical", "top_p", "min_p", "xtc", "temp"),
    "temp_then_trunc": ("temp", "top_n_sigma", "top_k", "typical", "top_p", "min_p", "xtc"),
    "hf": ("temp", "top_k", "top_p", "min_p", "typical", "top_n_sigma", "xtc"),
    "vllm": ("temp", "min_p", "top_k", "top_p", "typical", "top_n_sigma", "xtc"),
    "llama.cpp": ("top_n_sigma", "top_k", "typical", "top_p", "min_p", "xtc", "temp"),
}

#: Engine defaults filled by :meth:`SamplerConfig.preset` (sources cited in the module docstring of
#: :mod:`genprobe.engine.samplers`).
PRESETS: dict[str, dict[str, Any]] = {
    "genprobe": {},
    "hf": {"top_k": 50},  # GenerationConfig default: generate(do_sample=True) adds top_k=50
    "vllm": {},
    # common/common.h (common_params_sampling): penalty_last_n and dry_penalty_last_n are both 64
    "llama.cpp": {
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "penalty_last_n": 64,
        "dry_last_n": 64,
    },
}

LLAMA_CPP_PENALTY_LAST_N = 64


@dataclass(frozen=True)
class SamplerConfig:
    """Validated sampler parameters; every "off" value is the engines' own (0, None or 1.0)."""

    greedy: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    top_n_sigma: float | None = None
    ban_ids: tuple[int, ...] = field(default=())
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int | None = None
    no_repeat_ngram: int = 0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_last_n: int = -1
    dry_sequence_breakers: tuple[tuple[int, ...], ...] = field(default=())
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    penalty_alpha: float = 0.0
    order: str = "trunc_then_temp"
    engine: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ban_ids", tuple(int(i) for i in self.ban_ids))
        breakers = tuple(tuple(int(t) for t in s) for s in self.dry_sequence_breakers)
        object.__setattr__(self, "dry_sequence_breakers", breakers)
        if self.engine is None:
            object.__setattr__(self, "engine", self.order if self.order in ENGINES else "genprobe")
        _check_choices(self)
        _check_temperature(self)
        _check_truncations(self)
        _check_penalties(self)
        _check_dry_xtc(self)
        _check_contrastive(self)

    @classmethod
    def preset(cls, engine: str, **overrides: Any) -> "SamplerConfig":
        """An engine's defaults (its order and arithmetic too); ``overrides`` win, ``order`` included."""
        if engine not in PRESETS:
            raise ValueError(f"unknown sampler preset {engine!r}; choose one of {sorted(PRESETS)}")
        base: dict[str, Any] = {"order": engine if engine in ORDERS else "trunc_then_temp", "engine": engine}
        return cls(**{**base, **PRESETS[engine], **overrides})

    def replace(self, **changes: Any) -> "SamplerConfig":
        """A copy with ``changes`` (validated again)."""
        return replace(self, **changes)

    # ---- what is active ------------------------------------------------------------------
    @property
    def is_contrastive(self) -> bool:
        """True for contrastive search (``penalty_alpha`` > 0 with ``top_k`` candidates)."""
        return self.penalty_alpha > 0

    @property
    def dry_active(self) -> bool:
        """True when DRY can change a logit (llama.cpp: multiplier ≠ 0, base ≥ 1, last_n ≠ 0)."""
        return self.dry_multiplier != 0.0 and self.dry_last_n != 0

    @property
    def xtc_active(self) -> bool:
        """True when XTC may remove tokens (llama.cpp: probability > 0 and threshold ≤ 0.5)."""
        return not self.greedy and self.xtc_probability > 0 and self.xtc_threshold <= 0.5

    @property
    def uses_history(self) -> bool:
        """True when some stage reads the token history (penalties, no-repeat-n-gram, DRY)."""
        penalties = self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        return (penalties and self.penalty_last_n != 0) or self.no_repeat_ngram > 0 or self.dry_active

    @property
    def is_identity(self) -> bool:
        """True when processing cannot change the outcome (plain greedy / plain τ=1 sampling)."""
        if self.uses_history or self.ban_ids:
            return False
        return self.greedy or (self.temperature == 1.0 and not self._truncates)

    @property
    def _truncates(self) -> bool:
        return (
            bool(self.top_k)
            or (self.top_p is not None and self.top_p < 1.0)
            or bool(self.min_p)
            or (self.typical_p is not None and self.typical_p < 1.0)
            or bool(self.top_n_sigma)
            or self.xtc_active
        )

    # A SamplingParams and a SamplerConfig with the same parameters are the same sampler (dataclass equality
    # would compare the classes too).
    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SamplerConfig):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (every parameter, the resolved engine included)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}  # asdict() deep-copies: slow per call
        d["ban_ids"] = list(self.ban_ids)
        d["dry_sequence_breakers"] = [list(s) for s in self.dry_sequence_breakers]
        return d


@dataclass(frozen=True, eq=False)
class SamplingParams(SamplerConfig):
    """The sampler configuration under its public name (``genprobe.SamplingParams``): a :class:`SamplerConfig`
    whose repr, presets, copies and argument errors say ``SamplingParams``; equal to a ``SamplerConfig`` with the
    same parameters and accepted wherever one is."""


# ---- validation (one concern per helper; messages name the parameter and its limit) ---------
def _finite(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    return float(v)


def _integer(name: str, v: Any, lo: int, note: str) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo} ({note}), got {v!r}")


def _check_choices(c: SamplerConfig) -> None:
    if c.order not in ORDERS:
        raise ValueError(f"unknown sampler order {c.order!r}; choose one of {sorted(ORDERS)}")
    if c.engine not in ENGINES:
        raise ValueError(f"unknown sampler engine {c.engine!r}; choose one of {list(ENGINES)}")


def _check_temperature(c: SamplerConfig) -> None:
    t = _finite("temperature", c.temperature)
    if not c.greedy and not c.is_contrastive and t <= 0:
        raise ValueError(
            f"temperature must be > 0 when sampling, got {t}; for deterministic decoding use greedy=True "
            "(an explicit argmax), not temperature≈0"
        )


def _check_truncations(c: SamplerConfig) -> None:
    if c.top_k is not None:
        _integer("top_k", c.top_k, 0, "0 or None = off")
    if c.top_p is not None and not (0.0 < _finite("top_p", c.top_p) <= 1.0):
        raise ValueError(f"top_p must be in (0, 1] (1 or None = off), got {c.top_p!r}")
    if c.min_p is not None and not (0.0 <= _finite("min_p", c.min_p) <= 1.0):
        raise ValueError(f"min_p must be in [0, 1] (0 or None = off), got {c.min_p!r}")
    if c.typical_p is not None and not (0.0 < _finite("typical_p", c.typical_p) <= 1.0):
        raise ValueError(f"typical_p must be in (0, 1] (1 or None = off), got {c.typical_p!r}")
    if c.top_n_sigma is not None and _finite("top_n_sigma", c.top_n_sigma) < 0:
        raise ValueError(f"top_n_sigma must be >= 0 (0 or None = off), got {c.top_n_sigma!r}")


def _check_penalties(c: SamplerConfig) -> None:
    if any(i < 0 for i in c.ban_ids):
        raise ValueError(f"ban_ids must be token ids >= 0, got {list(c.ban_ids)}")
    if _finite("repetition_penalty", c.repetition_penalty) <= 0:
        raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {c.repetition_penalty!r}")
    _finite("presence_penalty", c.presence_penalty)
    _finite("frequency_penalty", c.frequency_penalty)
    _integer("no_repeat_ngram", c.no_repeat_ngram, 0, "0 = off")
    if c.penalty_last_n is not None:
        _integer("penalty_last_n", c.penalty_last_n, -1, "-1 = the whole history, 0 = penalties off")
        if c.engine in ("hf", "vllm") and c.penalty_last_n != -1:
            raise ValueError(
                f"penalty_last_n={c.penalty_last_n}: the {c.engine} engine has no penalty window (its penalties "
                "see the whole prompt and output); use engine='llama.cpp' or 'genprobe' for a window"
            )


def _check_dry_xtc(c: SamplerConfig) -> None:
    if _finite("dry_multiplier", c.dry_multiplier) < 0:
        raise ValueError(f"dry_multiplier must be >= 0 (0 = off), got {c.dry_multiplier!r}")
    if _finite("dry_base", c.dry_base) < 1.0:
        raise ValueError(f"dry_base must be >= 1 (llama.cpp disables DRY below 1), got {c.dry_base!r}")
    _integer("dry_allowed_length", c.dry_allowed_length, 1, "repeats up to this length are free")
    _integer("dry_last_n", c.dry_last_n, -1, "-1 = the whole context, 0 = DRY off")
    for s in c.dry_sequence_breakers:
        if not s or any(t < 0 for t in s):
            raise ValueError(f"dry_sequence_breakers must be non-empty token-id sequences (ids >= 0), got {list(s)}")
    if not 0.0 <= _finite("xtc_probability", c.xtc_probability) <= 1.0:
        raise ValueError(f"xtc_probability must be in [0, 1] (0 = off), got {c.xtc_probability!r}")
    if not 0.0 <= _finite("xtc_threshold", c.xtc_threshold) <= 1.0:
        raise ValueError(f"xtc_threshold must be in [0, 1] (above 0.5 XTC is off), got {c.xtc_threshold!r}")


def _check_contrastive(c: SamplerConfig) -> None:
    a = _finite("penalty_alpha", c.penalty_alpha)
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"penalty_alpha must be in [0, 1] (0 = off; contrastive search), got {a!r}")
    if a == 0:
        return
    if not c.top_k or c.top_k < 2:
        raise ValueError(f"penalty_alpha > 0 (contrastive search) needs top_k >= 2 candidates, got top_k={c.top_k!r}")
    if c.greedy:
        raise ValueError("penalty_alpha > 0 is contrastive search, its own deterministic mode: do not also set greedy")
    off = {
        "temperature": c.temperature == 1.0,
        "top_p": c.top_p in (None, 1.0),
        "min_p": not c.min_p,
        "typical_p": c.typical_p in (None, 1.0),
        "top_n_sigma": not c.top_n_sigma,
        "xtc_probability": not c.xtc_probability,
    }
    ignored = [name for name, is_off in off.items() if not is_off]
    if ignored:
        raise ValueError(f"contrastive search (penalty_alpha > 0) does not sample: unset {', '.join(ignored)}")
