"""Engine groups in separate processes, alternated: robust cross-engine ratios on a shared machine.

CTranslate2 and PyTorch each bring an OpenMP runtime; in one process the threads one leaves spinning take
the cores of the other (see ``generate_speed.py``), so they must be timed in separate processes. Engines of
one runtime disturb each other too, less: interleaved in one process, the engine timed after a two-thread
eager one (``hf``, ``cached``, ``ct2``) starts while that one's OpenMP workers still spin and with its own
weights evicted from the caches. So by default every engine whose ratio is the verdict runs in a process
of its own (``compiled``, ``ct2``, ``ct2-1t``; ``cached`` and ``hf``, the references, share one). Processes
run at different moments, and on a shared machine a neighbour can slow one of them by more than the margins
being measured. This script runs ``generate_speed.py --json`` once per group per round, alternating the
order of the groups from round to round, and reports, per batch size, the ratio of ``--ours`` to the best
engine of the other groups *in each round* and the median over rounds: a moment that slowed one process
moves one round's ratio, not the verdict::

    python benchmarks/bench_alternate.py --model 58m --rounds 3 -- --batch 1 16 64 --reps 3 --threads 2
    # groups default to "compiled", "cached hf", "ct2" and "ct2-1t"; anything after -- goes to generate_speed.py
    python benchmarks/bench_alternate.py --model 58m --group compiled --group compiled-bf16 --group "cached hf" \
        --group ct2 --group ct2-1t --versus compiled-bf16 -- --batch 1 --reps 3 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_GROUPS = ["compiled", "cached hf", "ct2", "ct2-1t"]


def run_group(model: str, engines: list[str], passthrough: list[str]) -> dict[int, dict[str, float]]:
    """One ``generate_speed.py`` process for ``engines``: {batch: {engine: median tok/s}}.

    Exits when an engine's greedy tokens differ from our eager engine's (checked in every process): a ratio
    between engines that do not compute the same thing is not a speed-up.
    """
    cmd = [sys.executable, str(HERE / "generate_speed.py"), "--model", model, "--engines", *engines, "--json"]
    cmd += ["--no-memory", *passthrough]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"generate_speed.py failed ({' '.join(engines)}):\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout)
    wrong = [(row["batch"], k) for row in result["rows"] for k, ok in row["greedy_tokens_agree"].items() if not ok]
    if wrong:
        raise SystemExit(f"greedy tokens differ from our eager engine's (batch, engine): {wrong}")
    return {row["batch"]: dict(row["tokens_per_s"]) for row in result["rows"]}


def ratios(merged: dict[int, dict[str, float]], ours: str, against: list[str]) -> dict[int, float]:
    """Per batch: ``ours`` tok/s over the best of ``against`` present in that batch's row."""
    out = {}
    for batch, speeds in merged.items():
        peers = [speeds[e] for e in against if e in speeds]
        if ours in speeds and peers:
            out[batch] = speeds[ours] / max(peers)
    return out


def print_summary(rounds: list[dict[int, dict[str, float]]], ours: str, against: list[str]) -> dict[int, float]:
    """Print the per-round ratios of ``ours`` over the best of ``against`` and their median; return the medians."""
    per_round = [ratios(m, ours, against) for m in rounds]
    print(f"\n| batch | {ours} / best of {', '.join(against)} per round | median |\n|---|---|---|")
    summary = {}
    for batch in sorted(per_round[0]):
        values = [rr[batch] for rr in per_round if batch in rr]
        summary[batch] = statistics.median(values)
        print(f"| {batch} | {' / '.join(f'{v:.2f}x' for v in values)} | **{summary[batch]:.2f}x** |")
    return summary


def main(argv: list[str] | None = None) -> int:
    """Alternate the groups for ``--rounds`` rounds; print each round's ratios and their median."""
    argv = sys.argv[1:] if argv is None else argv
    passthrough = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", choices=["default", "58m"])
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the groups (>= 2 to be robust)")
    ap.add_argument("--group", action="append", default=None, help="engines of one process, space-separated")
    ap.add_argument("--ours", default="compiled", help="the engine the ratios are about")
    ap.add_argument("--out", type=Path, default=None, help="write alternate-MODEL.json here")
    ap.add_argument(
        "--versus",
        nargs="+",
        default=None,
        help="more engines to rate the same way (e.g. compiled-bf16), and against hf",
    )
    args = ap.parse_args(own)
    if args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    groups = [g.split() for g in (args.group or DEFAULT_GROUPS)]
    if sum(args.ours in g for g in groups) != 1 or len(groups) < 2:
        raise SystemExit(f"--ours {args.ours} must be in exactly one of two or more --group's, got {groups}")
    versus = args.versus or []
    # The peers: engines of the other processes, not our own variants rated beside (--versus).
    others = [e for g in groups if args.ours not in g for e in g if e not in versus]
    rounds = []
    for r in range(args.rounds):
        merged: dict[int, dict[str, float]] = {}
        for engines in groups if r % 2 == 0 else groups[::-1]:  # A B, B A, ...: neither group always goes first
            for batch, speeds in run_group(args.model, engines, passthrough).items():
                merged.setdefault(batch, {}).update(speeds)
        rounds.append(merged)
        line = ", ".join(f"b{b} {v:.2f}x" for b, v in sorted(ratios(merged, args.ours, others).items()))
        print(f"round {r + 1}: {args.ours} / best of {' '.join(others)}: {line}", flush=True)
    summary = print_summary(rounds, args.ours, others)
    against = {}
    for engine in [args.ours, *versus]:  # e.g. compiled-bf16 against the same peers
        if engine != args.ours:
            against[engine] = print_summary(rounds, engine, others)
        if "hf" in others:  # and against transformers alone
            against[f"{engine}/hf"] = print_summary(rounds, engine, ["hf"])
    if args.out:
        from genprobe._io import atomic_write_json

        args.out.mkdir(parents=True, exist_ok=True)
        doc = {"model": args.model, "groups": groups, "ours": args.ours, "rounds": rounds, "median_ratio": summary}
        doc["versus"] = against
        atomic_write_json(args.out / f"alternate-{args.model}.json", doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
