"""The quality stage's inputs: the held-out texts of the model's language and the reference model, loaded."""

from __future__ import annotations

import shlex
from typing import Any

from .options import DoctorOptions
from .quality import Quality, measure_quality, quality_findings


def quality_stage(model: Any, opts: DoctorOptions, arg: str) -> Quality:
    """:func:`~.quality.measure_quality` on held-out human text (the corpus the prompts come from), against
    ``opts.reference`` when given."""
    from ..corpus.inputs import corpus_of, held_out
    from ..model.load import load_model

    corpus = corpus_of(model)
    texts = list(held_out(model, corpus, opts.plan.scan_prompts).texts)
    reference = load_model(opts.reference) if opts.reference else None
    q = measure_quality(model, texts, corpus, reference)
    ref = f" --reference {shlex.quote(opts.reference)}" if opts.reference else ""
    q.findings = quality_findings(q, f"genprobe doctor {arg} --only quality{ref} --out DIR")
    return q
