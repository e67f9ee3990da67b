"""Cache-equivalence verification: adapters, the step-by-step harness, and mutants that test it."""

from .adapters import (
    CacheImpl,
    CompiledEngineAdapter,
    EngineAdapter,
    FullRecompute,
    HFAdapter,
    HFReference,
    ImplSpecError,
    Reference,
    check_impl,
    load_impl,
)
from .harness import PhaseResult, ReferenceRun, Thresholds, VerifyReport, max_abs_diff, verify_implementation
from .mutants import MUTANTS, TeachingCache, cache_exact, mask_noop, run_mutant_reports, run_mutants

__all__ = [
    "CacheImpl",
    "CompiledEngineAdapter",
    "EngineAdapter",
    "FullRecompute",
    "HFAdapter",
    "HFReference",
    "ImplSpecError",
    "Reference",
    "check_impl",
    "load_impl",
    "PhaseResult",
    "ReferenceRun",
    "Thresholds",
    "VerifyReport",
    "max_abs_diff",
    "verify_implementation",
    "MUTANTS",
    "TeachingCache",
    "cache_exact",
    "mask_noop",
    "run_mutant_reports",
    "run_mutants",
]
