"""Issue #52: every writer into genprobe's cache, run twice at once from an empty cache, and killed (SIGKILL) at
each of its fault points then run again. Both end with exit 0 and the result of an undisturbed run (checksum).

Each writer runs as its own process (tests/cache_writers_driver.py): the real code path, with a local stand-in
for the network (a toy wheel in a local package index) and for what is slow or optional (AOTInductor's compiler,
llama.cpp, the quick training recipe; see the driver), forked by one serving process per test worker that imported
torch and genprobe once (those imports were most of this file's CPU: 39 writer runs). ``$GENPROBE_FAULT`` kills or
delays a writer at a named point and ``$GENPROBE_FAULT_LOG`` records the points it passed
(``genprobe._io.fault_point``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import os
import subprocess
import sys
import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from genprobe._io import FAULT_ENV, FAULT_LOG_ENV, LOCK_WAIT_ENV, CacheBusyError, cache_lock, write_once

sys.path.insert(0, str(Path(__file__).parent))
from cache_writers_driver import TOY_GGUF_MEMBER, TOY_MEMBERS  # noqa: E402

DRIVER = Path(__file__).with_name("cache_writers_driver.py")
KILLED = -9


def _no_gguf() -> str | None:
    return None if importlib.util.find_spec("gguf") else "the gguf extra is not installed"


def _no_compiler() -> str | None:
    from genprobe.engine.fast.kernels.build import compiler

    return None if compiler() else "no C++ compiler"


@dataclass(frozen=True)
class Writer:
    """A writer of the driver: the paths (globs under the run's root) of its result, the points it is killed
    at (in order, on the same cache), and whether two processes share one result (else each writes its own)."""

    name: str
    result: tuple[str, ...]
    kill_points: tuple[str, ...]
    skip: object = staticmethod(lambda: None)
    shared: bool = True  # False: a --out file, written whole by each process (the last rename wins)


WRITERS = [
    Writer(
        "english",
        ("cache/data/lee-corpus/background.cor", "cache/data/lee-corpus/rated.cor"),
        ("fetch_wheel:downloaded", "extract_member:copied"),
    ),
    # The registry's points are english's; `genprobe fetch smollm2` was killed at all four by hand (docs/cache.md).
    Writer("catalog", ("cache/models/tiny-llama",), ("convert_gguf:weights",), _no_gguf),
    Writer("kernels", ("cache/kernels/shim-test.so",), ("kernels:built",), _no_compiler),
    Writer("aot", ("cache/aot/*-step.pt2",), ("aot:compiled",)),
    Writer(
        "quantize",
        ("out/toy-F32.gguf", "out/toy-Q8_0.gguf"),
        ("quantize:converted", "quantize:half", "quantize:quantized"),
    ),
    Writer("checkpoint", ("cache/tang-quick-*",), ("atomic_write:written", "checkpoint:trained")),
    Writer("out_file", ("out/report.json",), ("atomic_write:written",), shared=False),
]
BY_NAME = {w.name: w for w in WRITERS}

# A stand-in for llama.cpp's convert_hf_to_gguf.py: the "GGUF" is the model's config.json, repeated.
FAKE_CONVERTER = """
import sys
from pathlib import Path
src, out = Path(sys.argv[1]), Path(sys.argv[sys.argv.index("--outfile") + 1])
out.write_bytes((src / "config.json").read_bytes() * 5000)
"""


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    """A local package index holding a toy wheel (two text members and a tiny GGUF), a tiny transformers
    directory, and llama.cpp's converter's stand-in."""
    d = tmp_path_factory.mktemp("cache-writer-fixtures")
    (d / "index").mkdir()
    wheel = d / "index" / "toypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("toypkg/__init__.py", "")
        for i, member in enumerate(TOY_MEMBERS):
            zf.writestr(member, "".join(f"Document {i}.{k} of the toy corpus. It ends here.\n" for k in range(500)))
        if not _no_gguf():
            from model.gguf_tiny import write_tiny_gguf

            write_tiny_gguf(d / "tiny.gguf")
            zf.write(d / "tiny.gguf", TOY_GGUF_MEMBER)
        zf.writestr("toypkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: toypkg\nVersion: 1.0\n")
        zf.writestr("toypkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("toypkg-1.0.dist-info/RECORD", "")
    (d / "wheel.sha256").write_text(hashlib.sha256(wheel.read_bytes()).hexdigest())
    (d / "tiny-hf").mkdir()
    (d / "tiny-hf" / "config.json").write_text('{"model_type": "llama", "hidden_size": 8}\n')
    (d / "converter.py").write_text(FAKE_CONVERTER)
    return d


def _root(tmp: Path, fixtures: Path, name: str) -> Path:
    """An empty cache (and --out directory) beside the fixtures; llama.cpp's source tree installed in it."""
    from genprobe.serving.llamacpp.quantize import SOURCE_DIRNAME

    root = tmp / name
    root.mkdir()
    (root / "fixtures").symlink_to(fixtures, target_is_directory=True)
    tree = root / "cache" / SOURCE_DIRNAME
    (tree / "gguf-py").mkdir(parents=True)
    (tree / "convert_hf_to_gguf.py").symlink_to(fixtures / "converter.py")
    return root


class Forker:
    """The driver's serving process (``cache_writers_driver.py --serve``): it forks each writer run."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, FAULT_LOG_ENV)} | {"OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, str(DRIVER), "--serve"]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, request: dict) -> int | None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, f"the driver's serving process ended (exit {self.proc.wait()})"
        return json.loads(answer)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def forker():
    f = Forker()
    yield f
    f.close()


@dataclass(frozen=True)
class Run:
    """A writer process started by the forker; its stderr goes to a file of its own."""

    forker: Forker
    pid: int
    stderr: Path


_RUN_IDS = itertools.count()


def _start(forker: Forker, writer: str, root: Path, fault: str | None = None) -> Run:
    env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, FAULT_LOG_ENV)}
    env |= {"GENPROBE_CACHE_DIR": str(root / "cache"), "GENPROBE_TEST_CACHE": str(root / "cache")}
    env |= {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(root / "fixtures" / "index"), "OMP_NUM_THREADS": "1"}
    if fault:
        env |= {FAULT_ENV: fault, FAULT_LOG_ENV: str(root / "faults.log")}
    stderr = root / f"stderr-{next(_RUN_IDS)}.txt"
    files = {"stdout": os.devnull, "stderr": str(stderr)}
    pid = forker.ask({"start": {"writer": writer, "root": str(root), "env": env, **files}})
    assert pid is not None
    return Run(forker, pid, stderr)


def _finish(run: Run) -> tuple[int, str]:
    rc = run.forker.ask({"wait": run.pid, "timeout": 300})
    assert rc is not None, f"a writer still ran after 300 s (killed); its stderr:\n{run.stderr.read_text()}"
    return rc, run.stderr.read_text()


def _result_files(root: Path, writer: Writer) -> list[Path]:
    """The writer's result: every file under its result paths."""
    found = [p for pattern in writer.result for p in sorted(root.glob(pattern))]
    return sorted(f for p in found for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())


def _digest(root: Path, writer: Writer) -> str:
    """Checksum of the result's files and names (the run's own root, which a GGUF conversion records, elided)."""
    h = hashlib.sha256()
    for f in _result_files(root, writer):
        data = f.read_bytes().replace(str(root).encode(), b"<root>")
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + data)
    return h.hexdigest()


def _complete(root: Path, writer: Writer) -> bool:
    return all(any(root.glob(pattern)) for pattern in writer.result)


def _leftovers(root: Path) -> list[str]:
    """Temporaries a writer left (``.<name>.tmp-*`` of the cache's writers, ``.<name>.*.tmp`` of atomic_write)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*") if ".tmp-" in p.name or p.name.endswith(".tmp"))


def _points(root: Path) -> Counter:
    """The fault points the runs on ``root`` passed, counted."""
    return Counter(line.split()[0] for line in (root / "faults.log").read_text().splitlines())


def _params():
    return [pytest.param(w.name, marks=pytest.mark.skipif(bool(w.skip()), reason=str(w.skip()))) for w in WRITERS]


@pytest.mark.parametrize("name", _params())
def test_two_at_once_and_killed_at_each_point_each_ends_as_an_undisturbed_run(name, tmp_path, fixtures, forker):
    """From empty caches, at the same time: an undisturbed run (the reference: its result's checksum and the fault
    points it passed) and two runs on one cache (both exit 0; a cache entry written by one of them, the other
    waiting; the same checksum). Then, on a third cache, runs killed at each fault point in turn, each leaving no
    result that looks complete, and a last run: exit 0, the same checksum, no temporaries left."""
    writer = BY_NAME[name]
    reference, race = _root(tmp_path, fixtures, "reference"), _root(tmp_path, fixtures, "race")
    work = writer.kill_points[0]  # held open for 2 s, so that the second process arrives while the first works
    procs = [_start(forker, name, reference, fault="none=kill")]  # a spec that only logs the points passed
    procs += [_start(forker, name, race, fault=f"{work}=sleep:2") for _ in range(2)]
    for rc, err in [_finish(p) for p in procs]:
        assert rc == 0 and "Traceback" not in err, err
    digest = _digest(reference, writer)
    assert _complete(reference, writer) and not _leftovers(reference)
    assert _digest(race, writer) == digest and not _leftovers(race)
    # A cache entry is written by one process (the other waits, then takes it); a --out file by each.
    once = _points(reference)
    assert _points(race) == (once if writer.shared else once + once)

    killed = _root(tmp_path, fixtures, "killed")
    for point in writer.kill_points:  # one after the other on the same cache, each at a later stage
        rc, err = _finish(_start(forker, name, killed, fault=f"{point}=kill"))
        assert rc == KILLED, f"not killed at {point}: exit {rc}\n{err}"
        assert not _complete(killed, writer), f"killed at {point}, yet the result looks complete"
        assert _leftovers(killed), f"killed at {point}, nothing was half-written"
    rc, err = _finish(_start(forker, name, killed))
    assert rc == 0 and "Traceback" not in err, err
    assert _digest(killed, writer) == digest
    if writer.shared:  # a cache writer removes what the killed one left (a --out file's temporary stays hidden)
        assert not _leftovers(killed)


def test_a_lock_held_too_long_is_a_one_line_error_after_the_bounded_wait(tmp_path, capsys):
    from genprobe.corpus.english import LEE_BACKGROUND

    wheel = tmp_path / "wheels" / LEE_BACKGROUND.filename  # what `genprobe fetch english` writes first
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from genprobe._io import cache_lock\n"
         "with cache_lock(sys.argv[1]):\n print('held', flush=True); time.sleep(60)", str(wheel)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(CacheBusyError, match=r"being written by another process \(pid \d+\)"):
            with cache_lock(wheel, wait_s=0.3):
                pass
        assert "waiting for another process (pid" in capsys.readouterr().err
        env = {**os.environ, LOCK_WAIT_ENV: "0.5", "GENPROBE_CACHE_DIR": str(tmp_path), "PIP_NO_INDEX": "1"}
        cmd = [sys.executable, "-m", "genprobe", "fetch", "english"]
        fetch = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert fetch.returncode == 1 and "Traceback" not in fetch.stderr, fetch.stderr
    assert fetch.stderr.strip().splitlines()[-1].startswith("genprobe fetch: error: ")
    assert "was not done after 0.5 s" in fetch.stderr


def test_write_once_writes_once_and_removes_a_killed_writers_temporaries(tmp_path):
    target = tmp_path / "entry.bin"
    (tmp_path / ".entry.bin.tmp-dead1").write_bytes(b"half")
    (tmp_path / ".entry.bin.tmp-dead2").mkdir()
    (tmp_path / ".entry.binary.tmp-other").write_bytes(b"another entry's")  # not this entry's: kept
    calls = []
    for _ in range(2):
        write_once(target, Path.is_file, lambda: calls.append(target.write_bytes(b"whole")))
    assert calls == [5] and target.read_bytes() == b"whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".entry.binary.tmp-other", "entry.bin"]  # lock file gone
