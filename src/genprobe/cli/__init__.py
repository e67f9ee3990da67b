"""The ``genprobe`` command. Thin: parses arguments, calls library functions, prints.

Each sub-command lives in a module ``genprobe.cli.cmd_<name>`` declaring ``COMMANDS`` (:class:`._common.Command`:
name, help, options, run); modules are discovered, so adding a command never edits this file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import warnings


def build_parser() -> argparse.ArgumentParser:
    """Assemble the parser from every ``cmd_*`` module of this package."""
    parser = argparse.ArgumentParser(
        prog="genprobe",
        description="Measure and fix the inference-time behaviour of autoregressive transformer LMs.",
    )
    from .._version import __version__

    parser.add_argument("--version", action="version", version=f"genprobe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            for command in importlib.import_module(f"{__name__}.{info.name}").COMMANDS:
                command.add_to(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit status."""
    from .._io import CacheBusyError, json_stdout
    from ..registry import FetchError
    from ._common import JSON_STREAM, check_model_kind

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    shown = warnings.formatwarning
    warnings.formatwarning = _format_warning
    try:
        check_model_kind(args, command_name(args))
        # with --json, stdout holds the JSON alone: fd 1 points at stderr while the command runs (vLLM and native
        # libraries print there) and emit_json writes to the real stdout (genprobe._io.json_stdout)
        with warnings.catch_warnings(), json_stdout(bool(getattr(args, "json", False))) as stream:
            warnings.simplefilter("default")
            JSON_STREAM.append(stream)
            try:
                rc = args.func(args)
            finally:
                JSON_STREAM.pop()
    except (ValueError, FileNotFoundError, FetchError, CacheBusyError) as exc:  # bad input 2, a fetch or busy cache 1
        print(f"genprobe {command_name(args)}: error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, (FetchError, CacheBusyError)) else 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = shown
    return int(rc or 0)


def command_name(args: argparse.Namespace) -> str:
    """``loops scan``, ``attention heads``, ``generate``: the command and its action, as a user typed them."""
    return " ".join(filter(None, (args.command, getattr(args, "action", None))))


def _format_warning(message, category, filename, lineno, line=None) -> str:  # noqa: ARG001
    """Warnings as one line a user can read (no source path and line)."""
    return f"genprobe: {category.__name__}: {message}\n"
