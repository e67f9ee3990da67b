"""Atomic file writes (a crash never leaves a half-written file behind), strict JSON, and a stdout that holds
only JSON (:func:`json_stdout`)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Callable, Iterator


def json_safe_dict(d: dict[str, Any]) -> dict[str, Any]:
    """:func:`json_safe` of a dict (same keys), typed as one: what a ``to_dict()`` returns."""
    return {k: json_safe(v) for k, v in d.items()}


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float spelled ``"nan"``, ``"inf"`` or ``"-inf"``: strict JSON, nothing lost.

    ``json.dumps`` would write ``NaN``/``Infinity``, which strict parsers (JavaScript, jq, Go) reject.
    Recurses into dicts, lists, tuples, objects with ``to_dict()``, dataclasses and tensors/arrays (``tolist()``).
    """
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "to_dict"):
        return json_safe(obj.to_dict())
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return json_safe(asdict(obj))
    if hasattr(obj, "tolist"):  # tensors, numpy arrays and scalars
        return json_safe(obj.tolist())
    return obj


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` then rename the temp file over ``path`` (same directory, fsynced)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    # mkstemp creates 0600; give the result the permissions a plain open() would have.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""

    def _w(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)

    atomic_write(path, _w)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    """Serialise ``obj`` as UTF-8 JSON (non-ASCII kept readable) and write it atomically."""
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False, indent=indent, allow_nan=False) + "\n")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_format_json(path: str | os.PathLike, expected_format: str, error: type[Exception] = ValueError) -> dict:
    """Read a genprobe JSON file and check its ``format`` field; raise ``error`` naming the file otherwise."""
    path = Path(path)
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != expected_format:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise error(f"{path}: unknown format {found!r}, expected {expected_format!r}")
    return meta


def _flush_c_stdio() -> None:
    """Flush the C library's stdio buffers (a native library's ``printf`` output still waiting in them)."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no C library to reach (an unusual platform): nothing to flush
        pass


@contextmanager
def json_stdout(enabled: bool = True) -> Iterator[IO[str]]:
    """Keep stdout for JSON alone: while active, file descriptor 1 points at stderr (what vLLM, C extensions or a
    stray ``print`` write there lands on stderr, and so does ``sys.stdout``); yields a text stream on the real
    stdout for the JSON. Restored on exit, every buffer flushed to the side it was written for.

    ``enabled=False`` changes nothing and yields ``sys.stdout`` (``with json_stdout(args.json) as out:``). When
    ``sys.stdout`` is not the process's fd 1 (replaced by a caller, e.g. a test's capture), the yielded stream is
    that object and only fd 1 and ``sys.stdout`` are pointed at stderr.
    """
    out = sys.stdout
    if not enabled:
        yield out
        return
    out.flush()
    _flush_c_stdio()
    try:
        on_fd1 = out.fileno() == 1
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both OSError and ValueError
        on_fd1 = False
    saved = os.dup(1)
    stream: IO[str] = open(os.dup(saved), "w", encoding="utf-8", closefd=True) if on_fd1 else out  # noqa: SIM115
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        yield stream
    finally:
        sys.stdout = out
        out.flush()  # what was written to the old sys.stdout meanwhile belongs to stderr: fd 1 still points there
        sys.stderr.flush()
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)
        stream.flush()
        if stream is not out:
            stream.close()
