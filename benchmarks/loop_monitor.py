"""Online loop detection: genprobe's monitor vs vLLM's own repetition detection, on the same generations.

vLLM generates free (no detector) continuations of held-out openings (``MODEL`` as in
loop_scan_throughput.py; chanting setting by default). The ground truth is the offline loop verdict on
each whole continuation (:func:`genprobe.metrics.degeneracy.detect_loop`). Each online detector is replayed
token by token over the same continuations, exactly as it runs inside generation (the tests show the
replay reproduces the live engine's stops for both):

* genprobe's monitor: :class:`genprobe.serving.monitor.ExactPeriodDetector` (smallest period whose
  periodic tail covers ≥ ``min_repeats`` units and ≥ 8 tokens), at two settings;
* vLLM's ``RepetitionDetectionParams`` (``check_sequence_repetition``, called by its scheduler after
  every token: the last ``min_count`` units of some size in [min, max] are identical), at two settings.

Per detector: loops found (recall on looping continuations), detection lag (tokens generated after the
final loop's onset before it fired; median and 90th percentile), false stops (fired on a continuation
that does not end in a loop), tokens it would save, and the cost per token — measured twice: the replay
in Python (µs per token), and live in vLLM (wall time of the same generate call with the detector on vs
off, median of interleaved repetitions, per generated token).

    python benchmarks/loop_monitor.py [MODEL] [--prompts 256] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Detector:
    """A named online detector: ``fire(tokens)`` → step of its first firing (or None), and its live request kwargs."""

    name: str
    fire: Callable[[list[int]], int | None]
    live_kwargs: Callable[[int], dict]


def _ours(max_period: int, min_repeats: float) -> Detector:
    from genprobe.serving.monitor import ExactPeriodDetector, replay
    from genprobe.serving.vllm_monitor import monitor_request_kwargs

    def fire(toks):
        d = replay(toks, lambda: ExactPeriodDetector(max_period=max_period, min_repeats=min_repeats))
        return None if d is None else d.step

    return Detector(
        f"genprobe monitor (p ≤ {max_period}, ≥{min_repeats:g} units, ≥8 tokens)",
        fire,
        lambda stop: monitor_request_kwargs(stop, "stop", max_period=max_period, min_repeats=min_repeats),
    )


def _vllm(max_pattern: int, min_count: int, min_pattern: int = 1) -> Detector:
    from vllm.sampling_params import RepetitionDetectionParams
    from vllm.v1.core.sched.utils import check_sequence_repetition

    rd = RepetitionDetectionParams(max_pattern_size=max_pattern, min_pattern_size=min_pattern, min_count=min_count)

    def fire(toks):
        return next((n - 1 for n in range(1, len(toks) + 1) if check_sequence_repetition(toks[:n], rd)), None)

    return Detector(
        f"vLLM RepetitionDetection (size {min_pattern}–{max_pattern}, ×{min_count})",
        fire,
        lambda stop: {"repetition_detection": rd},
    )


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def score(det: Detector, free: list[list[int]]) -> dict:
    """Recall, lag, false stops and replay cost of one detector over the free continuations."""
    from genprobe.metrics.degeneracy import detect_loop

    found, lags, false_stops, saved, loops = 0, [], 0, 0, 0
    t0 = time.perf_counter()
    fires = [det.fire(t) for t in free]
    replay_s = time.perf_counter() - t0
    for toks, step in zip(free, fires, strict=True):
        truth = detect_loop(toks)
        loops += truth.looping
        if step is None:
            continue
        saved += len(toks) - (step + 1)
        if truth.looping:
            found += 1
            lags.append(step + 1 - truth.onset)
        else:
            false_stops += 1
    n_tok = sum(len(t) for t in free)
    return {
        "detector": det.name,
        "loops": loops,
        "found": found,
        "recall": found / loops if loops else None,
        "lag_median": _quantile(lags, 0.5),
        "lag_p90": _quantile(lags, 0.9),
        "non_looping": len(free) - loops,
        "false_stops": false_stops,
        "tokens_saved": saved,
        "tokens": n_tok,
        "replay_us_per_token": 1e6 * replay_s / n_tok,
    }


def live_runs(eng, prompts, base_kwargs: Callable[..., object], dets: list[Detector], reps: int, stop: int) -> dict:
    """Wall time and tokens of the same generate call with each detector live (median of interleaved runs).

    A stopping detector shortens runs, so its per-token cost is confounded with a shrinking batch; the
    monitor's "break" action keeps every run at full length and isolates the plug-in's per-token cost.
    """
    from genprobe.serving.vllm_monitor import monitor_request_kwargs

    runs = [("off", {}), ("genprobe monitor, break action (full length)", monitor_request_kwargs(None, "break"))]
    runs += [(d.name, d.live_kwargs(stop)) for d in dets]
    times: dict[str, list[float]] = {name: [] for name, _ in runs}
    tokens: dict[str, int] = {}
    for _ in range(reps):  # interleaved: machine noise hits all alike
        for name, kw in runs:
            t0 = time.perf_counter()
            outs = eng.generate(prompts, base_kwargs(**kw))
            times[name].append(time.perf_counter() - t0)
            tokens[name] = sum(len(o.outputs[0].token_ids) for o in outs)
    return {k: {"seconds": statistics.median(v), "tokens": tokens[k]} for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; with ``--json`` stdout holds the JSON alone: what vLLM or a native library prints goes to
    stderr (``genprobe._io.json_stdout``)."""
    from genprobe._io import json_stdout

    with json_stdout("--json" in (sys.argv[1:] if argv is None else argv)) as json_out:
        return _main(argv, json_out)


def _main(argv: list[str] | None, json_out: IO[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=str(REPO / "out" / "case" / "model"))
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=57)
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions of the live timing (median)")
    ap.add_argument("--in-process", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from genprobe.corpus.inputs import heldout_openings
    from genprobe.loops.scan import chanting_sampler
    from genprobe.model.load import load_model
    from genprobe.serving.engine import EngineOptions, shared_engine
    from genprobe.serving.scan import to_sampling_params

    model = load_model(args.model)
    prompts = [model.encode(t) for t in heldout_openings(model.tokenizer, args.prompts)]
    sampler = chanting_sampler(model.unk_id, model.eos_id)
    eng = shared_engine(
        args.model,
        EngineOptions(
            max_num_seqs=64,
            max_num_batched_tokens=512,
            kv_cache_memory_bytes=256 << 20,
            multiprocessing=not args.in_process,
        ),
    )
    N = args.max_new_tokens
    base = lambda **kw: to_sampling_params(sampler, eng.vocab_size, N, **kw)  # noqa: E731
    free = [list(o.outputs[0].token_ids) for o in eng.generate(prompts, base())]
    stop = model.pad_id  # the monitor's stop token: never generated by the trained char model
    dets = [_ours(64, 2), _ours(64, 3), _vllm(64, 2), _vllm(64, 3)]
    rows = [score(d, free) for d in dets]
    live = live_runs(eng, prompts, base, dets, args.reps, stop)
    out = {
        "model": args.model,
        "prompts": len(prompts),
        "max_new_tokens": N,
        "rows": rows,
        "live": live,
        "live_prompts": len(prompts),
        "reps": args.reps,
    }
    _print(out, sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(out, indent=2), file=json_out)
    return 0


def _fmt(x, spec=".1f"):
    return "—" if x is None else format(x, spec)


def _print(out: dict, file) -> None:
    r0 = out["rows"][0]
    print(
        f"{out['prompts']} continuations of {out['max_new_tokens']} tokens; {r0['loops']} end in a loop "
        f"(offline detect_loop), {r0['non_looping']} do not",
        file=file,
    )
    print(
        f"{'detector':<58} {'found':>9} {'lag med/p90':>11} {'false stops':>12} {'saved tok':>9} {'replay µs/tok':>13}",
        file=file,
    )
    for r in out["rows"]:
        print(
            f"{r['detector']:<58} {r['found']:>4}/{r['loops']:<4} "
            f"{_fmt(r['lag_median'], 'd'):>5}/{_fmt(r['lag_p90'], 'd'):<5} "
            f"{r['false_stops']:>5}/{r['non_looping']:<6} {r['tokens_saved']:>9} {r['replay_us_per_token']:>13.2f}",
            file=file,
        )
    live = out["live"]
    off = live["off"]
    print(f"live in vLLM ({out['live_prompts']} prompts, median of {out['reps']} interleaved runs):", file=file)
    print(f"  {'run':<58} {'seconds':>8} {'tokens':>7} {'µs/token':>9} {'time vs off':>11}", file=file)
    for name, r in live.items():
        print(
            f"  {name:<58} {r['seconds']:>8.2f} {r['tokens']:>7} {1e6 * r['seconds'] / r['tokens']:>9.0f} "
            f"{r['seconds'] / off['seconds']:>10.2f}×",
            file=file,
        )


if __name__ == "__main__":  # vLLM spawns worker processes: the guard is required
    sys.exit(main())
