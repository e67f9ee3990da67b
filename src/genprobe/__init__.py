"""genprobe: make the inference-time behaviour of autoregressive transformer LMs measurable and fixable.

The public API, in one screen::

    import genprobe

    model = genprobe.load("out/case/model")           # a genprobe checkpoint or a transformers directory
    out = model.generate("床前明月光", genprobe.SamplingParams(temperature=0.8, top_p=0.9), max_new_tokens=50)
    print(out[0].text)

Names are imported lazily, so ``import genprobe`` (and ``genprobe --version``) stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__

# public name -> "module:attribute" (imported on first use)
_EXPORTS = {
    "load": "genprobe.engine.loaded:load_model",
    "json_safe": "genprobe._io:json_safe",
    "Model": "genprobe.engine.loaded:LoadedModel",
    "Tokenizer": "genprobe.model.load:Tokenizer",
    "ModelLoadError": "genprobe.model.errors:ModelLoadError",
    "SamplingParams": "genprobe.engine.samplers.stages:SamplingParams",
    "Completion": "genprobe.engine.loaded:Completion",
    "scan_loops": "genprobe.api:scan_loops",
    "scan_loop_settings": "genprobe.loops.scan:scan_loop_settings",
    "calibrate_loops": "genprobe.api:calibrate_loops",
    "repair_loops": "genprobe.api:repair_loops",
    "RepairConfig": "genprobe.loops.study:RepairConfig",
    "attention_heads": "genprobe.api:attention_heads",
    "padding_leak": "genprobe.api:padding_leak",
    "run_case": "genprobe.experiments.case:run_case",
    "verify_cache": "genprobe.verify.api:verify_cache",
    "verify_caches": "genprobe.verify.api:verify_caches",
    "verify_speculative": "genprobe.verify.speculative:verify_speculative",
    "speculative_generate": "genprobe.engine.speculative:speculative_generate",
    "chapter_phenomena": "genprobe.experiments.phenomena:chapter_phenomena",
    "diagnose": "genprobe.api:diagnose",
    "PhenomenaConfig": "genprobe.experiments.phenomena:PhenomenaConfig",
    # what the functions above return (and what those results hold), for annotations and isinstance checks
    "ScanResult": "genprobe.loops.scan:ScanResult",
    "LoopRates": "genprobe.loops.scan:LoopRates",
    "LoopSettings": "genprobe.metrics.degeneracy:LoopSettings",
    "LoopCalibration": "genprobe.metrics.calibrate:LoopCalibration",
    "LoopRepair": "genprobe.api:LoopRepair",
    "LoopScans": "genprobe.loops.scan:LoopScans",
    "RepairReport": "genprobe.loops.repair:RepairReport",
    "Patch": "genprobe.loops.patch:Patch",
    "CompareConfig": "genprobe.loops.compare_fixes:CompareConfig",
    "CompareResult": "genprobe.loops.compare_fixes:CompareResult",
    "AttentionReport": "genprobe.attention.metrics:AttentionReport",
    "LeakReport": "genprobe.attention.leak:LeakReport",
    "CaseStudy": "genprobe.experiments.case:CaseStudy",
    "PhenomenaResult": "genprobe.experiments.phenomena:PhenomenaResult",
    "VerifyReport": "genprobe.verify.report:VerifyReport",
    "CacheVerification": "genprobe.verify.api:CacheVerification",
    "MutantTable": "genprobe.verify.api:MutantTable",
    "SpeculativeVerification": "genprobe.verify.speculative:SpeculativeVerification",
    "SpeculativeResult": "genprobe.engine.speculative:SpeculativeResult",
    "Thresholds": "genprobe.verify.compare:Thresholds",
    "ServingReport": "genprobe.serving.verify:ServingReport",  # importing it does not import vLLM
    "DoctorReport": "genprobe.doctor.run:DoctorReport",
    "Finding": "genprobe.doctor.options:Finding",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'genprobe' has no attribute {name!r}")
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
