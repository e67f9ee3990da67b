"""The inference path: the model's own caches and the user's implementation against full recomputation
(:func:`genprobe.verify.api.verify_caches`), padding leak and, when asked, the serving engine (docs/doctor.md)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Callable

from .._io import json_safe
from ..attention.leak import LEAK_THRESHOLD, LeakReport, padding_leak
from ..model.load import Model
from ..verify.api import CacheVerification, verify_caches
from .options import DoctorOptions, DoctorRun, Finding

VERDICT_SEVERITY = {
    "pass": "ok",
    "small": "info",
    "suspicious": "warning",
    "bug": "bug",
    "error": "bug",
    "unavailable": "info",
}
VERIFY_CRITERION = (
    "each phase's max |Δlogit| against full recomputation: below max(1e-4, 4 x the reference's own noise floor) "
    "pass, above 1 (or 1 standard deviation of the reference logits) bug; an implementation that raises is a bug"
)
LEAK_CRITERION = (
    "a sequence's logits alone vs inside left- and right-padded batches: max |Δlogit| <= the caches' pass line "
    "(1e-4, raised to 4 x the model's measured noise floor)"
)
LEAK_TEXTS = 3
CACHE_EVIDENCE = tuple(
    "impl verdict max_abs_dlogit worst_phase bug_margin first_diff_step text_divergences unavailable pass_line".split()
)


@dataclass
class InferenceCheck:
    """The inference path's reports: the model's own caches (with the reference's noise floor and the pass line it
    raises), the user's implementation, padding, serving."""

    caches: CacheVerification
    impl: CacheVerification | None
    padding_leak: LeakReport
    padding_leak_no_position_ids: LeakReport | None
    serving: dict[str, Any] | None
    findings: list[Finding] = field(default_factory=list)


def cache_kinds(model: Model, opts: DoctorOptions) -> tuple[str, ...]:
    """The transformers cache classes that apply: the default one (quick), dynamic + static (+ sliding when the
    config has a window) in a full run; none for a genprobe model (its engine's cache is verified)."""
    if model.kind != "hf" or not opts.plan.all_cache_classes:
        return ()
    return ("dynamic", "static") + (("sliding",) if model.window is not None else ())


def _encoded(model: Model, prompts: list[str] | None, n: int, room: int) -> list[list[int]]:
    """The first ``n`` prompts' ids, each cut to ``room`` tokens (none without a tokenizer or prompts)."""
    if model.tokenizer is None or not prompts:
        return []
    return [ids[:room] for ids in (model.encode(p) for p in prompts[:n]) if ids]


def check_inference(run: DoctorRun) -> InferenceCheck:
    """Verify the model's caches and the user's, padding, and the serving engine when asked."""
    model, opts, prompts, log = run.model, run.opts, run.inputs.prompts, run.note
    # two of the prompts, of distinct lengths where possible, cut to leave room for the steps (None: the verifier's
    # defaults, random ids for a model without a tokenizer)
    room = max(1, min(24, (model.max_positions or 64) - opts.plan.verify_steps - 1))
    seqs = _encoded(model, prompts, 8, room)
    by_len = {len(s): s for s in seqs}
    ids = [by_len[n] for n in sorted(by_len, reverse=True)][:2] if len(by_len) >= 2 else seqs or None
    if len(by_len) < 2 and len(seqs) >= 2:  # prompts of one length (Tang openings): two joined make the longer one
        ids = [(seqs[0] + seqs[1])[:room], seqs[-1][: max(1, room - 1)]]
    decoded = [model.decode(p) for p in ids] if ids else None
    texts = decoded if decoded and all(decoded) else None
    caches, found = _verify(run, None, ids, texts)
    impl, more = _verify(run, opts.impl, ids, texts) if opts.impl else (None, [])
    found += more
    room = min(48, (model.max_positions or 64) - 4)  # up to three sequences of different lengths: the prompts' ids
    seqs = _encoded(model, prompts, 4 * LEAK_TEXTS, room)
    if len({len(s) for s in seqs}) < 2:  # no text, or all of one length: fixed ids of three lengths
        lo = 2 if model.vocab_size > 3 else 0
        seqs = [[lo + (7 * i + j) % (model.vocab_size - lo) for j in range(n)][:room] for i, n in enumerate((5, 9, 16))]
    by_len = {len(s): s for s in seqs}
    seqs = [by_len[n] for n in sorted(by_len)][:LEAK_TEXTS]
    line = max(LEAK_THRESHOLD, caches.pass_line or 0.0)  # a deep model's own float noise is not a leak
    m, pad = model.module, model.pad_id
    leak = padding_leak(m, seqs, pad, position_ids=True, threshold=line)
    bare = padding_leak(m, seqs, pad, position_ids=False, threshold=line) if model.kind == "hf" else None
    serving = _serving(model, opts, log) if opts.serving else None
    base = f"genprobe attention padding-leak {run.arg} --threshold {leak.threshold:.3g}"
    changes = f"{'changes' if leak.leak else 'leaves'} a sequence's logits (max |Δlogit| {leak.max_delta:.2e}"
    title, sev = f"padding {changes}, position ids from the mask)", "bug" if leak.leak else "ok"
    found.append(Finding("inference", "padding.leak", sev, title, json_safe(leak), LEAK_CRITERION, base))
    if bare is not None:  # a bug only when the user's code passes no position_ids
        sev = "ok" if not bare.leak else "bug" if not opts.hf_position_ids else "info"
        how = (
            "your inference code passes no position_ids (--hf-no-position-ids)"
            if not opts.hf_position_ids
            else "code that calls the model without position_ids"
        )
        delta = f"(max |Δlogit| {bare.max_delta:.2e})"
        title = f"without position_ids left padding changes the logits {delta}: {how} gets wrong results"
        title = title if bare.leak else f"without position_ids padding leaves the logits {delta}"
        crit, cmd = LEAK_CRITERION + "; a bug when the user's code passes no position_ids", base + " --no-position-ids"
        found.append(Finding("inference", "padding.no_position_ids", sev, title, json_safe(bare), crit, cmd))
    check = InferenceCheck(caches, impl, leak, bare, serving)
    check.findings = found + _serving_findings(serving, run.arg)
    return check


def _verify(
    run: DoctorRun, impl: str | None, ids: list[list[int]] | None, texts: list[str] | None
) -> tuple[CacheVerification, list[Finding]]:
    """The model's own caches (``impl`` None) or the user's implementation verified, and the findings, each with the
    ``verify-cache`` command that runs the same check alone."""
    opts, b = run.opts, run.opts.plan
    kinds = () if impl is not None else cache_kinds(run.model, opts)
    result = verify_caches(
        run.model,
        impl,
        prompts=ids,
        hf_caches=kinds,
        max_new_tokens=b.verify_steps,
        chunk_sizes=b.verify_chunks,
        hf_position_ids=opts.hf_position_ids,
        prefix_reuse=b.verify_prefix_reuse,
        log=run.note,
    )
    flags = [
        *(["--prompt " + shlex.join(texts)] if texts else []),
        f"--max-new-tokens {b.verify_steps}",
        "--chunk-sizes " + " ".join(map(str, b.verify_chunks)),
        *([f"--impl {impl}"] if impl else []),
        *(["--hf-cache " + " ".join(kinds)] if kinds else []),
        *([] if b.verify_prefix_reuse else ["--no-prefix-reuse"]),
        *([] if opts.hf_position_ids else ["--hf-no-position-ids"]),
    ]
    command, found = " ".join([f"genprobe verify-cache {run.arg}", *flags]), []
    for r in result.reports:
        ev = {k: getattr(r, k) for k in CACHE_EVIDENCE} | {"errors": json_safe(r.errors)}
        if r.verdict == "error":
            title = f"{r.impl} raised: " + "; ".join(f"{e.type} in {e.phase}: {e.message}" for e in r.errors)
        elif r.verdict == "unavailable":
            title = f"{r.impl} not verified here: {r.unavailable}"
        else:
            worst = f" in {r.worst_phase}" if r.worst_phase else ""
            title = f"{r.impl}: {r.verdict} (max |Δlogit| {r.max_abs_dlogit:.2e}{worst})"
        sev = VERDICT_SEVERITY.get(r.verdict, "warning")
        found.append(Finding("inference", f"cache.{r.impl}", sev, title, ev, VERIFY_CRITERION, command))
    return result, found


def vllm_installed() -> bool:
    """Whether the optional vLLM extra is importable here (nothing is imported)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _serving(model: Model, opts: DoctorOptions, log: Callable[[str], None]) -> dict[str, Any]:
    """vLLM's float32 deployment of the model (``verify-serving``), or a live server's (``--serving URL``), against
    float32 recomputation; an unusable server is the finding's reason, not the doctor's failure."""
    from ..serving import verify as sv

    if opts.serving != "vllm":
        from ..serving.endpoint import EndpointBackend, piece_table

        url, settings = str(opts.serving), sv.Settings(requests=16 if opts.quick else 64, steps=opts.plan.verify_steps)
        try:
            backend = EndpointBackend(url, pieces=piece_table(model))
            return json_safe(sv.verify_backend(backend, model, str(model.source), settings, log=log, url=url))
        except ValueError as exc:  # EndpointError included: unreachable, 500, timeout, another model, no log-probs
            return {"verdict": "unavailable", "reason": str(exc), "url": url}
    if not vllm_installed():
        return {"verdict": "unavailable", "reason": "vLLM is not installed (pip install 'genprobe[vllm]')"}
    if model.source is None:
        return {"verdict": "unavailable", "reason": "the model has no directory on disk to serve"}
    return json_safe(sv.verify_serving(str(model.source), dtypes=("float32",), steps=opts.plan.verify_steps, log=log))


def _serving_findings(serving: dict[str, Any] | None, model_arg: str) -> list[Finding]:
    if serving is None:
        return []
    verdict, url = serving.get("verdict", "unavailable"), serving.get("url")
    title = f"{'live server ' + url if url else 'vLLM float32 deployment'} vs recomputation: {verdict}"
    title += f" ({serving['reason']})" if serving.get("reason") else ""
    sev = VERDICT_SEVERITY.get(verdict, "warning")
    if url is None:
        evidence = {k: serving.get(k) for k in ("verdict", "reason", "verdict_by_dtype", "errors")}
        command = f"genprobe verify-serving {model_arg} --dtypes float32"
        return [Finding("inference", "serving.vllm", sev, title, evidence, VERIFY_CRITERION, command)]
    sev = "warning" if verdict == "unavailable" else sev  # the server asked about could not be used
    phases = {p["phase"]: p["verdict"] for p in serving.get("phases", [])}
    evidence = {"verdict": verdict, "reason": serving.get("reason"), "server": serving.get("server"), **phases}
    command = f"genprobe verify-serving {url} --reference {model_arg}"
    return [Finding("inference", "serving.endpoint", sev, title, evidence, VERIFY_CRITERION, command)]
