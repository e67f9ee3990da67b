"""The explicit fetch step: a pinned wheel through pip, its sha256 checked, one member extracted atomically.

pip reads PIP_NO_INDEX / PIP_FIND_LINKS from the environment, so a local folder stands in for the registry.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from genprobe.registry import FetchError, PinnedWheel, extract_member, fetch_wheel

MEMBER = "toypkg/data/model.bin"
PAYLOAD = b"\x00GGUF-like payload\xff" * 100


def _wheel(d: Path) -> Path:
    path = d / "toypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("toypkg/__init__.py", "")
        zf.writestr(MEMBER, PAYLOAD)
        zf.writestr("toypkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: toypkg\nVersion: 1.0\n")
        zf.writestr("toypkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("toypkg-1.0.dist-info/RECORD", "")
    return path


@pytest.fixture
def local_registry(tmp_path, monkeypatch):
    index = tmp_path / "index"
    index.mkdir()
    wheel = _wheel(index)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return PinnedWheel("toypkg", "1.0", wheel.name, digest, MEMBER, "MIT")


def test_fetch_checks_the_sha256_and_extracts_the_member(local_registry, tmp_path):
    cache = tmp_path / "cache"
    got = fetch_wheel(local_registry, cache, quiet=True)
    assert got == cache / "wheels" / local_registry.filename
    out = extract_member(local_registry, got, cache / "models" / "model.bin")
    assert out.read_bytes() == PAYLOAD
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp file left


def test_a_wheel_whose_sha256_differs_is_refused_and_not_kept(local_registry, tmp_path):
    wrong = PinnedWheel(**{**local_registry.__dict__, "sha256": "0" * 64})
    cache = tmp_path / "cache"
    with pytest.raises(FetchError, match="does not match the pinned"):
        fetch_wheel(wrong, cache, quiet=True)
    assert not (cache / "wheels" / wrong.filename).exists()


def test_a_cached_wheel_is_not_downloaded_again(local_registry, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    fetch_wheel(local_registry, cache, quiet=True)
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))  # the registry is gone: only the cache can answer
    assert fetch_wheel(local_registry, cache, quiet=True).is_file()


def test_an_unreachable_package_is_a_fetch_error_naming_it(local_registry, tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    with pytest.raises(FetchError, match="toypkg==1.0"):
        fetch_wheel(local_registry, tmp_path / "cache", quiet=True)


def test_compiled_wheels_are_fetched_by_their_own_tags():
    w = PinnedWheel(
        "gensim", "4.4.0", "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl", "", "", ""
    )
    args = w.pip_args()
    assert args[:3] == ["--no-deps", "--only-binary=:all:", "gensim==4.4.0"]
    assert args[args.index("--python-version") + 1] == "311" and args[args.index("--abi") + 1] == "cp311"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--platform"] == [
        "manylinux_2_24_x86_64",
        "manylinux_2_28_x86_64",
    ]
    pure = PinnedWheel("x", "1", "x-1-py3-none-any.whl", "", "", "").pip_args()
    assert "--platform" not in pure
