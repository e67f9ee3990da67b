"""Cache-equivalence verification: adapters, the step-by-step harness, and mutants that test it."""

from .adapters import (
    CacheImpl,
    CacheUnavailableError,
    CompiledEngineAdapter,
    EngineAdapter,
    FullRecompute,
    HFAdapter,
    HFReference,
    ImplFactoryError,
    ImplSpecError,
    Reference,
    check_impl,
    load_impl,
)
from .api import verify_cache
from .compare import Thresholds, max_abs_diff
from .harness import ReferenceRun, verify_implementation
from .hf_caches import CACHE_KINDS
from .mutants import MUTANTS, TeachingCache, cache_exact, mask_noop, run_mutant_reports, run_mutants
from .report import PhaseError, PhaseResult, VerifyReport
from .window import WindowedRecompute, windowed_forward

__all__ = [
    "CACHE_KINDS",
    "CacheImpl",
    "CacheUnavailableError",
    "CompiledEngineAdapter",
    "EngineAdapter",
    "FullRecompute",
    "HFAdapter",
    "HFReference",
    "ImplFactoryError",
    "ImplSpecError",
    "Reference",
    "check_impl",
    "load_impl",
    "PhaseError",
    "PhaseResult",
    "ReferenceRun",
    "Thresholds",
    "VerifyReport",
    "WindowedRecompute",
    "max_abs_diff",
    "verify_cache",
    "verify_implementation",
    "windowed_forward",
    "MUTANTS",
    "TeachingCache",
    "cache_exact",
    "mask_noop",
    "run_mutant_reports",
    "run_mutants",
]
