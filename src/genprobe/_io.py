"""Atomic file writes (a crash never leaves a half-written file behind), strict JSON, a stdout that holds only
JSON (:func:`json_stdout`), and the one lock every writer into genprobe's cache takes (:func:`cache_lock`,
:func:`write_once`; see docs/cache.md)."""

from __future__ import annotations

import dataclasses
import enum
import glob
import hashlib
import json
import lzma
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Callable, Iterator

#: ``field(metadata=NOT_JSON)``: a dataclass field :func:`json_safe` leaves out (listed elsewhere, or not data).
NOT_JSON = {"json": False}


def json_safe(obj: Any) -> Any:
    """The JSON form of a result: genprobe's one serialiser (strict JSON, nothing lost; the rules: docs/API.md).

    Dataclasses become objects of their fields less private and ``NOT_JSON`` ones, plus ``JSON_PROPERTIES``; a
    ``to_dict()`` wins. Mapping keys become strings; tensors and arrays their ``tolist()``; paths and enums their
    string and value; non-finite floats ``"nan"``/``"inf"``/``"-inf"`` (strict parsers reject ``NaN``/``Infinity``).
    """
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    if isinstance(obj, dict):
        return {k if isinstance(k, str) else str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "to_dict"):
        return json_safe(obj.to_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = [f.name for f in dataclasses.fields(obj) if f.metadata.get("json", True) and f.name[0] != "_"]
        names += getattr(obj, "JSON_PROPERTIES", ())
        return {name: json_safe(getattr(obj, name)) for name in names}
    if isinstance(obj, enum.Enum):
        return json_safe(obj.value)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "tolist"):  # tensors, numpy arrays and scalars
        return json_safe(obj.tolist())
    return obj


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> None:
    """Call ``write(tmp_path)`` then rename the temp file over ``path`` (same directory, fsynced)."""
    with replacing(path) as tmp:
        write(str(tmp))
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        fault_point("atomic_write:written")


@contextmanager
def replacing(target: str | os.PathLike, *, directory: bool = False, suffix: str = "") -> Iterator[Path]:
    """A temporary file (or directory) beside ``target`` (:func:`temp_beside`) for the block to write: renamed over
    ``target`` when the block completes, removed when it raises. An existing directory ``target`` is moved aside
    first and removed once the new one is in place (put back if the rename fails)."""
    target = Path(target)
    tmp = temp_beside(target, directory, suffix)
    try:
        yield tmp
        if directory and target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            try:
                os.replace(tmp, target)
            except BaseException:
                os.replace(old, target)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


def check_target_dir(out: Path, marker: str, what: str, name: str = "--out") -> None:
    """Refuse to write into ``out`` when it is a file, or a non-empty directory without ``marker`` (so not ``what``:
    a directory genprobe wrote)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{name} {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / marker).exists():
        raise ValueError(f"{name} {out} is a non-empty directory that is not {what}; refusing to write into it")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> None:
    """Serialise ``obj`` as UTF-8 JSON (non-ASCII kept readable) and write it atomically."""
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False, indent=indent, allow_nan=False) + "\n")


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_text(path: str | os.PathLike, what: str) -> str:
    """The UTF-8 text of ``path``; a missing or non-UTF-8 file is refused, naming ``what`` it is."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{what} not found: {p}")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {p} is not UTF-8 text ({exc.reason})") from None


def read_json_object(path: str | os.PathLike, error: type[Exception] = ValueError) -> dict:
    """The JSON object a file holds; ``error`` naming the file when it is not valid JSON or not an object."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"{path} does not hold a JSON object but {type(data).__name__}")
    return data


def read_format_json(path: str | os.PathLike, expected_format: str, error: type[Exception] = ValueError) -> dict:
    """Read a genprobe JSON file and check its ``format`` field; raise ``error`` naming the file otherwise."""
    meta = read_json_object(path, error)
    if meta.get("format") != expected_format:
        raise error(f"{path}: unknown format {meta.get('format')!r}, expected {expected_format!r}")
    return meta


def read_jsonl(path: str | os.PathLike, limit: int | None = None) -> list[tuple[int, Any]]:
    """``(line number, value)`` of the first ``limit`` (default: all) non-empty lines of a JSON Lines file, ``.xz``
    compressed or not; ValueError naming the file and line when one is not JSON."""
    path, out = Path(path), list[tuple[int, Any]]()
    with (lzma.open if path.suffix == ".xz" else open)(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if limit is not None and len(out) >= limit:
                break
            if not line.strip():
                continue
            try:
                out.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {lineno} is not valid JSON ({exc.msg})") from None
    return out


def figure_bytes(fig: Any, fmt: str = "png", **savefig: Any) -> bytes:
    """A matplotlib figure rendered as ``fmt`` (``savefig`` options passed on), then closed: what a page inlines or
    :func:`atomic_write_bytes` saves."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, **savefig)
    plt.close(fig)
    return buf.getvalue()


def _flush_c_stdio() -> None:
    """Flush the C library's stdio buffers (a native library's ``printf`` output still waiting in them)."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError, TypeError):  # no C library to reach (an unusual platform): nothing to flush
        pass


@contextmanager
def _fds_pointed_at(target: int, fds: tuple[int, ...]) -> Iterator[None]:
    """File descriptors ``fds`` point at ``target`` while the block runs; every buffer (Python's streams, the C
    library's) is flushed on entry and on exit, so each write lands on the side it was made for."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    _flush_c_stdio()
    saved = {fd: os.dup(fd) for fd in fds}
    for fd in fds:
        os.dup2(target, fd)
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        _flush_c_stdio()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


@contextmanager
def output_to_file(path: str | os.PathLike) -> Iterator[IO[str]]:
    """Send everything written to file descriptors 1 and 2 — engines' log lines, native libraries' prints, Python's
    ``sys.stdout`` / ``sys.stderr`` and the logging handlers bound to them — to ``path`` (appended) while the block
    runs; yields a text stream on the terminal's stderr for the caller's own progress lines. Restored on exit."""
    terminal = open(os.dup(2), "w", encoding="utf-8", errors="replace", buffering=1, closefd=True)  # noqa: SIM115
    try:
        with open(path, "ab") as log, _fds_pointed_at(log.fileno(), (1, 2)):
            yield terminal
    finally:
        terminal.close()


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
    try:
        on_fd1 = out.fileno() == 1
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both OSError and ValueError
        on_fd1 = False
    stream: IO[str] = open(os.dup(1), "w", encoding="utf-8", closefd=True) if on_fd1 else out  # noqa: SIM115
    try:
        with _fds_pointed_at(2, (1,)):
            sys.stdout = sys.stderr
            try:
                yield stream
            finally:
                sys.stdout = out  # what was written to it meanwhile belongs to stderr: flushed while fd 1 points there
    finally:
        stream.flush()
        if stream is not out:
            stream.close()


# ---- the cache's writers: one process writes an entry, the others wait for it; a killed writer is cleaned up ----

#: Seconds a writer waits for another process's lock on the same cache entry before giving up (a conversion or a
#: build takes seconds to a few minutes; a holder is never stale: the kernel drops a dead process's lock).
LOCK_WAIT_ENV = "GENPROBE_LOCK_WAIT_S"
DEFAULT_LOCK_WAIT_S = 1800.0
#: Tests only: ``POINT=kill`` or ``POINT=sleep:SECONDS`` (comma-separated) acts at :func:`fault_point` ``POINT``.
FAULT_ENV = "GENPROBE_FAULT"
#: Tests only: a file each :func:`fault_point` reached appends its name to (how many processes did the work).
FAULT_LOG_ENV = "GENPROBE_FAULT_LOG"
TEMP_MARK = ".tmp-"  # a writer's temporary: ``.<name>.tmp-<random>`` beside ``<name>``


class CacheBusyError(TimeoutError):
    """Another process held a cache entry's lock for longer than the bounded wait."""


def _lock_holder(lock: Path) -> str:
    try:
        return lock.read_text(encoding="utf-8").strip() or "pid unknown"
    except OSError:
        return "pid unknown"


@contextmanager
def cache_lock(target: str | os.PathLike, what: str | None = None, wait_s: float | None = None) -> Iterator[None]:
    """Hold the exclusive lock of ``target`` (``fcntl.flock`` on ``.<name>.lock`` beside it) for the ``with`` block,
    waiting at most ``wait_s`` seconds (default ``$GENPROBE_LOCK_WAIT_S``, else 1800; then :class:`CacheBusyError`).
    See docs/cache.md. The holder removes the lock file as it lets go (none pile up beside a user's outputs); a
    waiter that then gets the lock of the removed file sees it is not the path's file any more, and locks that one.
    """
    target = Path(target)
    lock = target.parent / f".{target.name}.lock"  # there while a process holds or waits for the lock
    lock.parent.mkdir(parents=True, exist_ok=True)
    wait = float(os.environ.get(LOCK_WAIT_ENV) or DEFAULT_LOCK_WAIT_S) if wait_s is None else wait_s
    deadline, what = time.monotonic() + wait, what or str(target)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            _flock_by(fd, deadline, lock, what, wait)
            if os.path.samestat(os.fstat(fd), os.stat(lock)):
                break
        except FileNotFoundError:  # removed by the holder that just let go: lock the path's new file
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}\n".encode())
        yield
    finally:
        lock.unlink(missing_ok=True)  # while still held: a waiter on this file will find it gone and retry
        os.close(fd)  # releases the lock


def _flock_by(fd: int, deadline: float, lock: Path, what: str, wait: float) -> None:
    """Take the exclusive ``flock`` of ``fd``, polling until ``deadline``; say on stderr, every 30 s, what for."""
    import fcntl  # POSIX: genprobe's cache writers run on Linux and macOS

    told = None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            now = time.monotonic()
            if now >= deadline:
                raise CacheBusyError(
                    f"{what} is being written by another process ({_lock_holder(lock)}) and was not done after "
                    f"{wait:g} s; wait for it, or end it and run again (lock: {lock})"
                ) from None
            if told is None or now - told >= 30:  # say so at once, then every 30 s
                print(
                    f"waiting for another process ({_lock_holder(lock)}) to finish writing {what} "
                    f"(up to {deadline - now:.0f} s more)",
                    file=sys.stderr,
                    flush=True,
                )
                told = now
            time.sleep(0.1)


def temp_beside(target: str | os.PathLike, directory: bool = False, suffix: str = "") -> Path:
    """A new temporary file (or directory) ``.<name>.tmp-<random><suffix>`` beside ``target``, with the permissions
    a plain ``open()`` / ``mkdir()`` would give (``mkstemp`` / ``mkdtemp`` make them private); renamed over ``target``
    when complete, removed by :func:`write_once` when its writer was killed first."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}{TEMP_MARK}"
    umask = os.umask(0)
    os.umask(umask)
    if directory:
        tmp = tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=target.parent)
        os.chmod(tmp, 0o777 & ~umask)
    else:
        fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=target.parent)
        os.close(fd)
        os.chmod(tmp, 0o666 & ~umask)
    return Path(tmp)


def write_once(
    target: str | os.PathLike, is_complete: Callable[[Path], bool], write: Callable[[], None], what: str | None = None
) -> bool:
    """Run ``write`` (which puts ``target`` in place atomically) unless ``is_complete(target)``; True when it ran.
    Two processes at once: one writes, the other waits on :func:`cache_lock` and finds it complete (docs/cache.md).
    """
    target = Path(target)
    if is_complete(target):
        return False
    with cache_lock(target, what):
        if is_complete(target):  # written by another process while this one waited
            return False
        # the temporaries a killed writer left (every live writer holds the lock while its temporary exists)
        for p in target.parent.glob(f".{glob.escape(target.name)}{TEMP_MARK}*"):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        write()
    return True


def fault_point(name: str) -> None:
    """A point at which the tests kill (``$GENPROBE_FAULT`` ``name=kill``) or delay (``name=sleep:S``) a writer;
    does nothing unless the variable is set."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    if os.environ.get(FAULT_LOG_ENV):
        with open(os.environ[FAULT_LOG_ENV], "a", encoding="utf-8") as fh:
            fh.write(f"{name} {os.getpid()}\n")
    for item in spec.split(","):
        point, _, action = item.partition("=")
        if point != name:
            continue
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action.startswith("sleep:"):
            time.sleep(float(action.removeprefix("sleep:")))
