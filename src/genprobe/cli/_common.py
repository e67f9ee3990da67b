"""Helpers shared by the sub-command modules."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.loaded import LoadedModel

Kinds = tuple[str, ...] | dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class Command:
    """A sub-command, declared: ``genprobe NAME [MODEL] [options]``. ``doc``: its help (the first paragraph) and
    description; ``model``: the kinds of MODEL it takes (:func:`add_model_argument`; None: no MODEL). A command with
    ``actions`` is their parent (``genprobe attention heads``), without ``run``."""

    name: str
    doc: str
    run: Callable[[argparse.Namespace], int] | None = None
    options: Callable[[argparse.ArgumentParser], Any] = lambda p: None
    epilog: str | None = None
    model: Kinds | None = None
    model_help: str = ""
    optional_model: bool = False
    actions: Sequence["Command"] = ()

    def add_to(self, sub: Any) -> argparse.ArgumentParser:
        """Add this command's parser (``--json`` last, as every command takes it) to ``sub``."""
        help = " ".join(self.doc.split("\n\n")[0].split()).rstrip(".")
        help = help[:1].lower() + help[1:] if help[1:2].islower() else help  # "Train a model" -> "train a model"
        fmt = argparse.RawDescriptionHelpFormatter
        p = sub.add_parser(self.name, help=help, description=self.doc, epilog=self.epilog, formatter_class=fmt)
        p.set_defaults(func=self.run or self.choose)
        if self.actions:
            actions = p.add_subparsers(dest="action", metavar="ACTION")
            for action in self.actions:
                action.add_to(actions)
            return p
        if self.model is not None:
            add_model_argument(p, not self.optional_model, self.model_help or MODEL_HELP, self.model)
        self.options(p)
        p.add_argument("--json", action="store_true", help="print a machine-readable JSON summary on stdout")
        return p

    def choose(self, args: argparse.Namespace) -> int:
        """The command given without an action: says which there are."""
        names = ", ".join(a.name + (" MODEL" if a.model else "") for a in self.actions)
        raise ValueError(f"choose an action: {names} (genprobe {self.name} -h; MODEL: {MODEL_HELP})")


Column = tuple[str, int, Callable[[Any], Any]]  # header ("\n" splits it over two lines), width (< 0: left), cell


def table(columns: Sequence[Column], rows: Any, rule: bool = False) -> str:
    """The one text table: a header, an optional rule, a line per row; each cell ``str()``-ed, right-aligned in its
    width (left-aligned where the width is negative), cells one space apart."""

    def line(cells: Sequence[Any]) -> str:
        cells = [f"{c!s:<{-w}}" if w < 0 else f"{c!s:>{w}}" for c, (_, w, _) in zip(cells, columns, strict=True)]
        return " ".join(cells).rstrip()

    heads = [h.split("\n") for h, _, _ in columns]
    lines = [line([h[i] if i < len(h) else "" for h in heads]) for i in range(max(map(len, heads)))]
    if rule:
        lines.append("-" * (sum(abs(w) for _, w, _ in columns) + len(columns) - 1))
    return "\n".join(lines + [line([cell(r) for _, _, cell in columns]) for r in rows])


def option(p: Any, flag: str, default: Any = None, help: str = "", **kw: Any) -> None:
    """``p.add_argument(flag, ...)`` typed by ``default`` (False: a switch; a list or tuple: :class:`Accumulate`) and
    " (default X)" added to a help that has none."""
    if default is False:
        kw.setdefault("action", "store_true")
    else:
        if isinstance(default, (list, tuple)):
            default = list(default)
            kw = {"nargs": "+", "action": Accumulate} | ({"type": type(default[0])} if default else {}) | kw
        elif default is not None and "action" not in kw:
            kw.setdefault("type", type(default))
        shown = " ".join(map(str, default)) if isinstance(default, list) else default
        if default not in (None, []) and "default" not in help:
            help = f"{help} (default {shown})".lstrip()
        kw["default"] = default
    p.add_argument(flag, help=help, **kw)


def integers(flag: str, values: list[str]) -> list[int]:
    """``values`` of ``flag`` as integers, else a ValueError naming the flag (exit 2, not argparse's usage exit)."""
    try:
        return [int(v) for v in values]
    except ValueError:
        raise ValueError(f"{flag} expects integers, got {' '.join(values)!r}") from None


def thresholds_of(args: argparse.Namespace) -> Any:
    """The verdict scale of ``--noise`` and ``--bug`` (and ``--rel-bug``, ``--floor-multiple`` where the command has
    them); the lines in between derived from them: suspicious at max(noise, min(0.001, bug)), rel-suspicious at
    min(0.01, rel-bug)."""
    from ..verify.compare import Thresholds

    rel = {"rel_suspicious": min(0.01, args.rel_bug)} if hasattr(args, "rel_bug") else {}
    return fields_of(Thresholds, args, suspicious=max(args.noise, min(1e-3, args.bug)), **rel)


def check_min(args: argparse.Namespace, **least: float) -> None:
    """Refuse an option below its least value: ``check_min(args, threads=1)`` -> "--threads must be >= 1, got 0"."""
    for name, low in least.items():
        if getattr(args, name) is not None and getattr(args, name) < low:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {low:g}, got {getattr(args, name)}")


def fields_of(cls: Any, args: argparse.Namespace, **values: Any) -> Any:
    """``cls(...)`` (a dataclass) from the options named like its fields (lists as tuples) and ``values``."""
    from dataclasses import fields

    given = {f.name: getattr(args, f.name) for f in fields(cls) if f.init and hasattr(args, f.name)}
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()} | values)


#: Where ``emit_json`` writes (the last entry): the real stdout while ``main`` holds it for ``--json``; else stdout.
JSON_STREAM: list[IO[str]] = []


def emit_json(obj: Any) -> None:
    """Print ``obj`` as strict JSON on stdout (UTF-8, readable; NaN/inf spelled out by ``json_safe``)."""
    from .._io import json_safe

    text = json.dumps(json_safe(obj), ensure_ascii=False, indent=2, allow_nan=False)
    out = JSON_STREAM[-1] if JSON_STREAM else sys.stdout
    out.write(text + "\n")
    out.flush()


def fmt(x: float | None, spec: str = ".3g", missing: str = "—") -> str:
    """A table cell: ``x`` formatted, or ``missing`` for None."""
    return missing if x is None else format(x, spec)


def show_progress(args: argparse.Namespace) -> bool:
    """Progress bars unless ``--no-progress``, and only on a terminal."""
    return not getattr(args, "no_progress", False) and sys.stderr.isatty()


def user_project_importable() -> None:
    """``--impl MOD:FACTORY`` names a module of the user's project: import it as ``python -m`` would (cwd first)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def info(msg: str, quiet: bool = False) -> None:
    """Human-readable progress goes to stderr so ``--json`` stdout stays clean."""
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


# ---- list flags: a repeated flag is never silently dropped -----------------------------------------
class Accumulate(argparse.Action):
    """A list flag (``nargs="+"``/``"*"``) that accumulates when repeated: ``--prompt A --prompt B`` gives
    ``[A, B]``. Unlike ``action="extend"`` the first use replaces the default instead of extending it. With
    ``nargs="*"`` an occurrence without values means "all" and wins over any values."""

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest, None)
        first = current is None or current is self.default
        if self.nargs == "*" and (not values or (not first and not current)):
            setattr(namespace, self.dest, [])
            return
        setattr(namespace, self.dest, [*([] if first else current), *values])


class Once(argparse.Action):
    """A flag whose values belong together (one sequence of token ids): giving it twice is an error, never a
    silent replacement."""

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest, None)
        if current is not None and current is not self.default:
            parser.error(f"{option_string} given twice: give all its values after one {option_string}")
        setattr(namespace, self.dest, values)


def write_out(args: argparse.Namespace, name: str, data: Any) -> None:
    """With ``--out DIR``: ``data`` written as strict JSON to DIR/``name`` (DIR made if missing), said on stderr."""
    if args.out:
        from .._io import atomic_write_json

        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out / name, data)
        info(f"wrote {args.out / name}")


def out_dir(path: Path, names: str) -> Path:
    """``--out DIR``: refused when ``path`` exists and is not a directory (``names``: the files written there)."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {path} exists and is not a directory (--out is the directory for {names})")
    return path


# ---- the one CLI grammar: genprobe COMMAND [MODEL] [options] -------------------------------------
MODEL_HELP = (
    "a genprobe checkpoint directory, a transformers model directory (safetensors), a GGUF file, or the name of a "
    "fetched model (smollm2; see `genprobe fetch`); detected automatically"
)


#: The ``--backend`` a URL gets when none is given (a command whose kinds name it takes live endpoints)
URL_BACKEND = "endpoint"
#: Every kind a model on disk can be (``genprobe.model.kinds.FILE_KINDS``' values).
MODEL_KINDS = ("checkpoint", "transformers", "gguf", "name")


def add_model_argument(p: argparse.ArgumentParser, required: bool, help: str, kinds: Kinds) -> None:
    """MODEL, always the first positional of a command that studies a model. ``kinds``: the kinds of MODEL the command
    takes (some of :data:`MODEL_KINDS`), or ``{--backend value: kinds}`` (``--backend`` not given: :data:`URL_BACKEND`
    for a URL where declared, else the first key); ``main`` refuses any other kind, :mod:`.matrix` reads them."""
    p.add_argument("model", metavar="MODEL", nargs=None if required else "?", default=None, help=help)
    p.set_defaults(model_kinds=kinds)


def check_model_kind(args: argparse.Namespace, command: str) -> None:
    """Refuse (``ValueError``, one line) a MODEL of a kind ``command`` does not take: see :func:`add_model_argument`."""
    from ..model.kinds import is_url, kind_refusal

    kinds = getattr(args, "model_kinds", None)
    model = getattr(args, "model", None)
    if kinds is None or model is None:
        return
    if isinstance(kinds, dict):
        if getattr(args, "backend", None) is None:  # not given: the endpoint for a URL, else the first declared
            args.backend = URL_BACKEND if is_url(model) and URL_BACKEND in kinds else next(iter(kinds))
        kinds = kinds[args.backend]
    refusal = kind_refusal(command, model, tuple(kinds))
    if refusal:
        raise ValueError(refusal)


def model_path(args: argparse.Namespace) -> str:
    """MODEL, the positional; an error when it was not given (a command whose MODEL is optional needs it here)."""
    if args.model is None:
        raise ValueError("give MODEL: a genprobe checkpoint or a transformers model directory")
    return str(args.model)


def add_prompt_arguments(p: argparse.ArgumentParser, required: bool = False, help_default: str = "") -> Any:
    """``--prompt TEXT [TEXT ...]`` or ``--prompts FILE`` (one per line, or JSONL with a prompt/text field); returns
    their mutually exclusive group (a command may add another prompt source to it)."""
    g = p.add_mutually_exclusive_group(required=required)
    option(g, "--prompt", [], "prompt text(s); repeat the flag or list several" + help_default, metavar="TEXT")
    option(g, "--prompts", metavar="FILE", help="one prompt per line, or JSONL with a 'prompt' or 'text' field")
    return g


def read_prompts(args: argparse.Namespace) -> list[str] | None:
    """The prompts given by ``--prompt`` / ``--prompts``, or None when neither was given."""
    if getattr(args, "prompt", None):
        if any(not t for t in args.prompt):
            raise ValueError("--prompt: an empty prompt; every prompt needs at least one character")
        return list(args.prompt)
    if getattr(args, "prompts", None):
        from ..corpus.inputs import read_prompt_file

        return read_prompt_file(args.prompts)
    return None


def add_max_new_tokens(p: argparse.ArgumentParser, default: int) -> None:
    """``--max-new-tokens N`` (the token budget, one spelling everywhere)."""
    option(p, "--max-new-tokens", default, "new tokens per prompt", metavar="N")


#: ``--weight-dtype`` choices (genprobe.model.weight_only.WEIGHT_DTYPES; spelled here so parsing imports no torch).
WEIGHT_DTYPE_NAMES = ("float32", "bfloat16", "int8")


def add_weight_dtype(p: argparse.ArgumentParser) -> None:
    """``--weight-dtype`` and ``--narrow-output``: how a model's linear-layer weights are stored (weight-only)."""
    option(p, "--weight-dtype", "float32", "store the linear layers' weights in this dtype", choices=WEIGHT_DTYPE_NAMES)
    option(p, "--narrow-output", False, "with --weight-dtype bfloat16/int8: the output layer narrow too (as Q8_0)")


def load_model_arg(args: argparse.Namespace, path: str | None = None) -> "LoadedModel":
    """Load ``path`` (default: MODEL) through ``genprobe.load``, with ``--weight-dtype`` and ``--narrow-output``."""
    from ..engine.loaded import load_model
    from ..model.weight_only import weight_dtype_of

    weight_dtype = weight_dtype_of(getattr(args, "weight_dtype", "float32"))
    narrow = getattr(args, "narrow_output", False)
    return load_model(path or model_path(args), weight_dtype=weight_dtype, narrow_output=narrow)
