"""Synthetic long-range tasks + position-encoding extrapolation.

Prints, per position encoding, accuracy vs distance on the passkey task (content suffices) and on the
position-only "token k places back" task — inside and beyond the training context — and the Tang
validation loss vs evaluation length (models trained at L = 64). Learned positions past their table
show the model's own error instead of a number. Writes longrange.json and longrange.png to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from .._io import json_safe
from ._common import Column, Command, emit_json, info, option, show_progress, table

DEFAULT_PE = ("learned", "rope", "alibi")
BAR: Column = ("|", 1, lambda _: "|")


def options(p: argparse.ArgumentParser) -> None:
    option(p, "--pe", list(DEFAULT_PE), "position encodings to compare", choices=(*DEFAULT_PE, "none"), metavar="PE")
    option(p, "--quick", False, "few training steps (a few minutes on 2 CPU cores)")
    option(p, "--no-corpus", False, "skip the Tang-corpus extrapolation runs")
    option(p, "--seed", 0, "training seed")
    option(p, "--out", "runs/longrange", "output directory", metavar="DIR")
    option(p, "--no-progress", False, "no progress bars")


def _corpus_cell(w) -> str:
    beyond = "" if w is None or w.loss_beyond_context is None else f" [{w.loss_beyond_context:.3f}]"
    return "error" if w is None else f"{w.loss:.3f}{beyond}"


def _accuracy(key: Any) -> Column:
    """The column of one distance or lag, over rows whose last element maps it to an accuracy (err: refused)."""
    return (str(key), 5, lambda row: "err" if row[-1][key] is None else f"{row[-1][key]:.2f}")


def format_results(res) -> str:
    """Text tables of a :class:`~genprobe.attention.longrange.LongRangeResult`, then each encoding's first refusal."""
    from ..attention.longrange import N_CONTENT, N_VALUE

    syn = res.synthetic
    L, lags = syn.config.context, syn.config.lags
    passkey = [(pe, r.accuracy) for pe, r in syn.passkey.items()]
    lag = [(pe, n, accs) for pe, r in syn.lag.items() for n, accs in r.accuracy.items()]
    encoding: Column = ("encoding", 9, lambda row: row[0])
    lines = [
        f"passkey accuracy vs distance (trained at length {L}; distances > {L - 2} need longer rows; "
        f"chance {1 / N_VALUE:.2f})",
        table([encoding, BAR, *map(_accuracy, passkey[0][1])], passkey),
        "",
        f"'token k places back' accuracy vs lag k (position only; chance {1 / N_CONTENT:.2f})",
        table([encoding, ("len", 4, lambda row: row[1]), BAR, *map(_accuracy, lags)], lag),
    ]
    if (c := res.corpus) is not None:
        loss_at = lambda n: lambda row: _corpus_cell(row[1].by_length[n])  # noqa: E731
        lengths: list[Column] = [(str(n), 15, loss_at(n)) for n in c.config.eval_lengths]
        lines += [
            "",
            f"Tang validation loss vs evaluation length (trained at L={c.config.context}, "
            f"{c.config.steps} steps; non-overlapping windows, all positions; [positions >= L])",
            table([encoding, BAR, *lengths], c.encodings.items()),
        ]
    first = {pe: errs[0] for pe, errs in res.errors.items() if errs}
    if first:
        lines.append("")
        lines += [f"{pe} ({e.at}): {e.message}" for pe, e in first.items()]
    lines.append(f"\n({res.seconds:.0f} s)")
    return "\n".join(lines)


def run(args) -> int:
    """Run the experiment, print tables, write JSON + plot."""
    from .._io import atomic_write_json
    from ..attention.longrange import LongRangeConfig, quick_config, run_longrange
    from ..attention.plots import longrange_plot

    pes = list(args.pe)
    lc = quick_config(pes) if args.quick else LongRangeConfig(pos_encodings=pes)
    lc.synthetic.seed = args.seed
    lc.corpus = None if args.no_corpus or lc.corpus is None else dataclasses.replace(lc.corpus, seed=args.seed)
    info(f"longrange: {', '.join(pes)}{' (quick)' if args.quick else ''}")
    res = run_longrange(lc, progress=show_progress(args))
    data = {**json_safe(res), "quick": bool(args.quick)}
    out = Path(args.out)
    atomic_write_json(out / "longrange.json", data)
    longrange_plot(res, out / "longrange.png")
    if args.json:
        emit_json({**data, "files": {"json": str(out / "longrange.json"), "plot": str(out / "longrange.png")}})
    else:
        print(format_results(res))
        info(f"wrote {out / 'longrange.json'} and {out / 'longrange.png'}")
    return 0


COMMANDS = (Command("longrange", __doc__, run, options),)
