"""Loop rates over a prompt set (chanting and plain greedy by default).

Through our engine, vLLM, llama.cpp or a live endpoint.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..._io import json_safe
from .._common import MODEL_KINDS, Command, emit_json, info, option, out_dir, show_progress, write_out
from .._sampler_args import add_sampler_arguments, sampler_flags_given, sampler_from_args
from .._vllm_args import add_engine_arguments, add_http_arguments, endpoint_backend, engine_options, require_engine
from ._shared import (
    DEFAULT_MODEL,
    LOOPS_MODEL,
    add_llamacpp_args,
    add_loop_args,
    chat_flag,
    check_common,
    is_bundled_char_model,
    load_model_or_default,
    loop_settings_from,
    read_loop_prompts,
    scan_calibration,
)

SCAN_FILE = "scan.json"  # what --out DIR holds
BACKEND_KINDS = {  # llama.cpp runs GGUF files (a fetched name: the GGUF `genprobe fetch` kept); vLLM a model directory
    "genprobe": MODEL_KINDS,
    "vllm": ("checkpoint", "transformers", "name"),
    "llama.cpp": ("gguf", "name"),
    "endpoint": ("url",),
}


def scan_options(s: argparse.ArgumentParser) -> None:
    add_loop_args(s, with_val=False)
    option(s, "--n", 256, "number of Tang openings with --tang-prompts")
    setting = "both = chanting (greedy, <unk> banned) and plain greedy (the default); sample = the sampler flags "
    setting += "below (the default when any is given)"
    option(s, "--setting", choices=("both", "chanting", "greedy", "sample"), help=setting)
    add_sampler_arguments(s)
    option(s, "--out", type=Path, metavar="DIR", help=f"directory for {SCAN_FILE}, with per-generation records")
    backend = (
        "who generates: genprobe's engine (default for a model on disk), vLLM, llama.cpp (MODEL a GGUF file: its own "
        "sampler chain) or endpoint (default for a URL: a live OpenAI-compatible server); same JSON; a sampler the "
        "engine cannot express exactly is refused"
    )
    option(s, "--backend", choices=tuple(BACKEND_KINDS), help=backend)
    g = s.add_argument_group("a live endpoint (MODEL is a URL: --backend endpoint)")
    option(g, "--reference", metavar="MODEL", help="the served model on disk, whose tokenizer the scan reads with")
    add_http_arguments(g)
    add_engine_arguments(s, title="with --backend vllm; passed to vllm.LLM")
    add_llamacpp_args(s)


def run_scan(args: argparse.Namespace) -> int:
    """Scan one or two decoding settings (:func:`genprobe.scan_loop_settings`) and print the tables (tokens,
    characters where they are the unit, and the human false-positive rate of the calibrated detectors)."""
    from ...corpus.inputs import heldout_openings
    from ...loops.scan import ScanOptions, loop_study_settings, scan_loop_settings, scan_table

    check_common(args)
    if args.out:
        out_dir(args.out, SCAN_FILE)
    if args.compile and args.backend == "llama.cpp":  # genprobe: its compiled fast path; vllm: vLLM compiles
        raise ValueError(
            "--compile is for genprobe's engine (its compiled fast path) and vLLM, not --backend llama.cpp"
        )
    if args.backend in ("vllm", "llama.cpp"):  # an engine not installed here, a llama.cpp MODEL that is no GGUF file
        require_engine(args.backend)
    gguf: Path | None = None
    if args.backend == "llama.cpp":
        from ...serving.llamacpp.scan import gguf_file_for

        gguf = gguf_file_for(args.model or str(DEFAULT_MODEL))  # a ValueError when MODEL names no GGUF file
    server, model = endpoint_backend(args) if args.backend == "endpoint" else (None, load_model_or_default(args))
    texts, source = read_loop_prompts(args, model)
    if texts is None:
        texts = heldout_openings(model.tokenizer, args.n, args.prefix)
    calibration = scan_calibration(args, model, texts)  # on the user's text: its language, not the template's
    if chat_flag(args, model):
        texts, source = [model.chat_prompt(t) for t in texts], f"{source} (chat template)"
    given = sampler_flags_given(args)
    setting = args.setting or ("sample" if given else "both")
    if given and setting != "sample":  # never ignore a sampler flag silently
        raise ValueError(f"{' '.join(given)} set the sampler of --setting sample, not of --setting {setting}")
    sample = setting == "sample"
    settings = {"sample": sampler_from_args(args, model.tokenizer)} if sample else loop_study_settings(model, setting)
    backend = _scan_backend(args, server, gguf)
    result = scan_loop_settings(
        model,
        texts,
        settings,
        ScanOptions(
            args.max_new_tokens,
            batch_size=args.batch_size,
            seed=args.seed,
            loop=None if calibration is not None else loop_settings_from(args),
            progress=show_progress(args),
        ),
        calibration=calibration,
        chars_unit=is_bundled_char_model(model),
        prompt_source=source,
        backend=backend,
        log=info,
        on_scan=lambda name, res, seconds: info(scan_table(res.summary, f"{name} ({seconds:.1f} s)")),
        compile=args.compile and args.backend == "genprobe",
    )
    for note in result.backend.get("not_checked", []):
        info(f"not checked: {note}")
    write_out(args, SCAN_FILE, json_safe(result))
    if args.json:
        emit_json(result.to_dict(with_records=False))
    return 0


def _scan_backend(args: argparse.Namespace, server: Any, gguf: Path | None) -> Any:
    """Who generates (None: genprobe's engine); the others refuse every setting they cannot run exactly, by flag."""
    if args.backend == "vllm":
        from ...serving.scan import vllm_scan_backend

        vllm = vllm_scan_backend(engine_options(args, seed=args.seed))

        def check(sampler: Any, model: Any, n_ctx: int) -> None:
            try:
                vllm.check(sampler, model, n_ctx)
            except ValueError as exc:  # name the flags that fix it
                hint = " (on the command line: --preset vllm or --order vllm)" if "engine=" in str(exc) else ""
                raise ValueError(f"{exc}{hint}") from None

        return replace(vllm, name="--backend vllm", check=check)
    if args.backend == "llama.cpp":
        from ...serving.llamacpp.scan import llamacpp_scan_backend

        assert gguf is not None  # run_scan found it before loading the model
        breakers = tuple(args.dry_breakers)
        llama = llamacpp_scan_backend(gguf, n_threads=args.threads, kv_type=args.kv_type, dry_breaker_strings=breakers)
        return replace(llama, name="--backend llama.cpp")
    if server is not None:  # --backend endpoint
        from ...loops.scan import backend_engine

        return backend_engine(server, args.concurrency)
    return None


SCAN = Command("scan", __doc__ or "", run_scan, scan_options, model=BACKEND_KINDS, **LOOPS_MODEL)
