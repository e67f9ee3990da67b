"""Build ``linear.cpp`` and ``decoder.cpp`` into one library on first use and load it (cached per source and toolchain).

Like ``torch.compile`` on CPU, this needs a C++ compiler; :func:`load` never raises for a machine that lacks one
(or lacks AVX2): it returns a :class:`KernelStatus` saying why the kernels are unavailable, and the compiled decode
path then keeps Inductor's own code for the products. The library is written once per (source, torch version,
compiler, flags) into the cache directory, atomically, so concurrent first uses cannot load a half-written file, and
once: one of them builds while the others wait (:func:`build_once`; a build takes ~35 s of a core); a build killed
midway leaves a temporary file that the next build removes.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ...._io import fault_point, temp_beside, write_once

SOURCES = tuple(Path(__file__).with_name(f) for f in ("linear.cpp", "decoder.cpp", "ggml.cpp"))
SOURCE = SOURCES[0]
#: The C shim compiled programs call by name, built into a library of its own that depends on nothing (see shim.c).
SHIM_SOURCE = Path(__file__).with_name("shim.c")
#: Set to ``0`` to turn the kernels off (the compiled path then uses Inductor's code for every product).
DISABLE_ENV = "GENPROBE_KERNELS"
#: Where built libraries are kept (default: ``$XDG_CACHE_HOME/genprobe/kernels`` or ``~/.cache/genprobe/kernels``).
CACHE_ENV = "GENPROBE_CACHE_DIR"
BUILD_TIMEOUT_S = 600
ISA_FLAGS = ("-mavx2", "-mfma")


@dataclass(frozen=True)
class KernelStatus:
    """Whether the kernels are loaded in this process, and if not, why."""

    available: bool
    reason: str = ""
    library: str | None = None


_status: KernelStatus | None = None
_loading = threading.Lock()  # a background build (engine.fast.compiled) and a caller may both ask first


def status() -> KernelStatus:
    """The outcome of :func:`load` in this process (loads on first call)."""
    return load()


def loaded() -> bool:
    """Whether the kernels are loaded and available in this process already (never builds or waits)."""
    return _status is not None and _status.available


def load() -> KernelStatus:
    """Build (once per toolchain) and load the kernels; ``available=False`` with the reason when they cannot be."""
    global _status
    with _loading:
        if _status is None:
            try:
                _status = _load()
            except _Unavailable as exc:
                _status = KernelStatus(False, str(exc))
    return _status


class _Unavailable(RuntimeError):
    """Why the kernels cannot run here (a missing compiler, a CPU without AVX2, a failed build)."""


def cache_dir() -> Path:
    """Directory of built libraries (``GENPROBE_CACHE_DIR``, else the XDG cache directory)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]) / "kernels"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "genprobe" / "kernels"


def compiler() -> str | None:
    """The C++ compiler to build with: ``$CXX``, else the first of g++, c++, clang++ on the PATH."""
    if os.environ.get("CXX"):
        return os.environ["CXX"]
    return next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)


def build_command(cxx: str, output: Path) -> list[str]:
    """The compiler command that builds the kernels' sources into ``output`` against the installed torch."""
    from torch.utils.cpp_extension import include_paths, library_paths

    torch_lib = library_paths()[0]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [
        cxx,
        "-O3",
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-fopenmp",  # at::parallel_for's template is an OpenMP region compiled here; torch's libgomp is reused
        *ISA_FLAGS,
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-I{p}" for p in include_paths()),
        *(str(src) for src in SOURCES),
        "-o",
        str(output),
        f"-L{torch_lib}",
        "-lc10",
        "-ltorch_cpu",
        "-ltorch",
        f"-Wl,-rpath,{torch_lib}",
    ]


def _compiler_version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError as exc:
        raise _Unavailable(f"C++ compiler {cxx!r} cannot run ({exc})") from exc
    return out.stdout.splitlines()[0] if out.stdout else cxx


def shim_command(cxx: str, output: Path) -> list[str]:
    """The command that builds ``shim.c`` alone (as C, linked against nothing but the C library)."""
    return [
        cxx,
        "-x",
        "c",
        "-O2",
        "-shared",
        "-fPIC",
        str(SHIM_SOURCE),
        "-x",
        "none",
        "-Wl,--as-needed",
        "-o",
        str(output),
    ]


def library_path(cxx: str) -> Path:
    """Where the library built by ``cxx`` for this source and torch lives (a content hash names it)."""
    key = hashlib.sha256()
    for src in (*SOURCES, SHIM_SOURCE):
        key.update(src.read_bytes())
    for part in (torch.__version__, _compiler_version(cxx), " ".join(build_command(cxx, Path("out")))):
        key.update(part.encode())
    return cache_dir() / f"linear-{key.hexdigest()[:20]}.so"


def shim_path(library: Path) -> Path:
    """The shim library built beside ``library`` (same hash)."""
    return library.with_name(library.name.replace("linear-", "shim-", 1))


def unsupported_reason() -> str | None:
    """Why this machine cannot have the kernels at all (turned off, not x86-64 with AVX2, no C++ compiler), else None.

    Checks only, no build: what a test or a caller asks before deciding to skip the kernel path. A machine that
    passes may still fail to build them; :func:`load` says so then.
    """
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return f"turned off by {DISABLE_ENV}=0"
    try:
        _check_machine()
    except _Unavailable as exc:
        return str(exc)
    return None if compiler() is not None else "no C++ compiler found (install g++, or set CXX)"


def _check_machine() -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise _Unavailable(f"the kernels are x86-64 (AVX2) code; this machine is {platform.machine()}")
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        raise _Unavailable(f"the kernels need AVX2 and FMA; torch reports CPU capability {capability}")


def _build(command: Callable[[str, Path], list[str]], cxx: str, target: Path) -> None:
    """Run ``command(cxx, output)`` into a temporary output file, then move that to ``target`` (atomically)."""
    tmp = temp_beside(target, suffix=".so")
    try:
        proc = subprocess.run(command(cxx, tmp), capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise _Unavailable(f"building genprobe's kernels with {cxx} failed (exit {proc.returncode}): {tail}")
        fault_point("kernels:built")
        os.replace(tmp, target)  # atomic: another process sees the old file or the whole new one
    except subprocess.TimeoutExpired as exc:
        raise _Unavailable(f"building genprobe's kernels took more than {BUILD_TIMEOUT_S} s") from exc
    finally:
        tmp.unlink(missing_ok=True)


def build_once(target: Path, build: Callable[[], None]) -> None:
    """Run ``build``, which writes ``target`` atomically, unless ``target`` exists. The cache lock of ``target``
    makes one process build while the others that need it wait, instead of each building the same file (the
    test-suite's workers start together); what a killed build left beside it is removed first
    (:func:`genprobe._io.write_once`)."""
    write_once(target, Path.exists, build, target.name)


def _load() -> KernelStatus:
    if os.environ.get(DISABLE_ENV, "1") == "0":
        raise _Unavailable(f"turned off by {DISABLE_ENV}=0")
    _check_machine()
    missing = [src.name for src in (*SOURCES, SHIM_SOURCE) if not src.exists()]
    if missing:  # an installation that left the package data out
        raise _Unavailable(f"the kernels' sources are not installed beside {__file__}: {', '.join(missing)}")
    cxx = compiler()
    if cxx is None:
        raise _Unavailable("no C++ compiler found (install g++, or set CXX)")
    path = library_path(cxx)
    shim = shim_path(path)
    build_once(path, lambda: _build(build_command, cxx, path))
    build_once(shim, lambda: _build(shim_command, cxx, shim))
    torch.ops.load_library(str(path))  # type: ignore[no-untyped-call]
    # Inductor's generated library calls the C shim by name: the shim's library (and only it: it has no
    # dependencies) goes into the global scope, pointed at this library's entry point.
    shim_lib = ctypes.CDLL(str(shim), mode=os.RTLD_GLOBAL)
    own = ctypes.CDLL(str(path), mode=os.RTLD_NOLOAD)  # a handle: nothing made global
    shim_lib.genprobe_set_small_linear(ctypes.cast(own.genprobe_small_linear_c, ctypes.c_void_p))
    shim_lib.genprobe_set_small_linear_ggml(ctypes.cast(own.genprobe_small_linear_ggml_c, ctypes.c_void_p))
    _register_fake()
    return KernelStatus(True, "", str(path))


def _register_fake() -> None:
    """Shapes for tracing: what ``torch.compile`` needs to put the op in a graph."""

    @torch.library.register_fake("genprobe::small_linear")  # type: ignore[untyped-decorator]
    def _small_linear_fake(
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        block_scales: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.register_fake("genprobe::small_linear_ggml")  # type: ignore[untyped-decorator]
    def _small_linear_ggml_fake(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ggml_type: int
    ) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], weight.shape[0]))
