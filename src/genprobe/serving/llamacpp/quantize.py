"""A float model in, GGUF files of llama.cpp's quantization types out: the converter, then its quantize API.

1. **F32 GGUF** by llama.cpp's own ``convert_hf_to_gguf.py`` of the pinned source (``<genprobe cache>/llama.cpp-
   0.3.36``, extracted by ``scripts/install_llamacpp.sh``). The converter names a BPE pre-tokenizer by hashing a fixed
   text's ids and refuses one it has never seen (a BPE we trained ourselves): ``pre_tokenizer=`` names it instead,
   used only where the hash is unknown.
2. **Each type** through ``llama_model_quantize`` as ``llama-quantize`` calls it. A file type is a *recipe*: norms
   stay F32, K-quant mixes give some tensors more bits, and a tensor whose rows do not fit the type's block falls
   back to another type. :class:`QuantizedFile` records what was actually written (docs/quantization.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..._io import fault_point, output_to_file, replacing, write_once
from .engine import LLAMA_CPP_PYTHON_VERSION, require_llama_cpp

#: GGUF file type name -> (llama_ftype constant of llama.h, the ggml type of its quantized 2-D tensors, that
#: type's block length). The types ``llama_model_quantize`` writes without an importance matrix.
QUANT_TYPES: dict[str, tuple[str, str, int]] = {
    "F32": ("LLAMA_FTYPE_ALL_F32", "F32", 1),
    "F16": ("LLAMA_FTYPE_MOSTLY_F16", "F16", 1),
    "BF16": ("LLAMA_FTYPE_MOSTLY_BF16", "BF16", 1),
    "Q8_0": ("LLAMA_FTYPE_MOSTLY_Q8_0", "Q8_0", 32),
    "Q6_K": ("LLAMA_FTYPE_MOSTLY_Q6_K", "Q6_K", 256),
    "Q5_K_M": ("LLAMA_FTYPE_MOSTLY_Q5_K_M", "Q5_K", 256),
    "Q5_K_S": ("LLAMA_FTYPE_MOSTLY_Q5_K_S", "Q5_K", 256),
    "Q5_1": ("LLAMA_FTYPE_MOSTLY_Q5_1", "Q5_1", 32),
    "Q5_0": ("LLAMA_FTYPE_MOSTLY_Q5_0", "Q5_0", 32),
    "Q4_K_M": ("LLAMA_FTYPE_MOSTLY_Q4_K_M", "Q4_K", 256),
    "Q4_K_S": ("LLAMA_FTYPE_MOSTLY_Q4_K_S", "Q4_K", 256),
    "Q4_1": ("LLAMA_FTYPE_MOSTLY_Q4_1", "Q4_1", 32),
    "Q4_0": ("LLAMA_FTYPE_MOSTLY_Q4_0", "Q4_0", 32),
    "Q3_K_L": ("LLAMA_FTYPE_MOSTLY_Q3_K_L", "Q3_K", 256),
    "Q3_K_M": ("LLAMA_FTYPE_MOSTLY_Q3_K_M", "Q3_K", 256),
    "Q3_K_S": ("LLAMA_FTYPE_MOSTLY_Q3_K_S", "Q3_K", 256),
    "Q2_K": ("LLAMA_FTYPE_MOSTLY_Q2_K", "Q2_K", 256),
}
DEFAULT_TYPES = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")
SOURCE_DIRNAME = f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"
SOURCE_HINT = "bash scripts/install_llamacpp.sh (it extracts llama.cpp's source, with its converter, to the cache)"


class UnsupportedQuantTypeError(ValueError):
    """A GGUF type genprobe cannot ask llama.cpp to write (unknown, or one that needs an importance matrix)."""


def check_types(types: list[str] | tuple[str, ...]) -> list[str]:
    """The types, upper-cased and de-duplicated in order; an unknown one raises naming it and the supported list."""
    out: list[str] = []
    for name in types:
        t = name.strip().upper()
        if t not in QUANT_TYPES:
            raise UnsupportedQuantTypeError(
                f"GGUF type {name!r} cannot be written by genprobe's quantizer (it is unknown, or like the IQ types "
                f"needs an importance matrix); supported: {', '.join(QUANT_TYPES)}"
            )
        if t not in out:
            out.append(t)
    if not out:
        raise UnsupportedQuantTypeError(f"no GGUF type given; supported: {', '.join(QUANT_TYPES)}")
    return out


def llama_cpp_source_dir() -> Path:
    """The pinned llama.cpp source tree (converter + gguf-py) in genprobe's cache; an error says how to get it."""
    from ...registry import cache_root

    d = cache_root() / SOURCE_DIRNAME
    if not (d / "convert_hf_to_gguf.py").is_file() or not (d / "gguf-py").is_dir():
        raise FileNotFoundError(f"llama.cpp's converter is not in {d} (convert_hf_to_gguf.py, gguf-py): {SOURCE_HINT}")
    return d


# The converter as a module, with the pre-tokenizer named where its hash table does not know the tokenizer's.
_CONVERT_LAUNCHER = """
import os, sys
sys.argv = [os.environ["GENPROBE_CONVERTER"], *sys.argv[1:]]
sys.path.insert(0, os.path.dirname(os.environ["GENPROBE_CONVERTER"]))
pre = os.environ.get("GENPROBE_BPE_PRE")
if pre:
    from conversion.base import TextModel
    known = TextModel.get_vocab_base_pre
    def get_vocab_base_pre(self, tokenizer):
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            return pre
    TextModel.get_vocab_base_pre = get_vocab_base_pre
import runpy
runpy.run_path(os.environ["GENPROBE_CONVERTER"], run_name="__main__")
"""


def _run_converter(tree: Path, src: Path, out: Path, pre_tokenizer: str | None) -> None:
    """Run llama.cpp's converter on ``src`` into a temporary file beside ``out``, then rename it to ``out``."""
    env = {**os.environ, "GENPROBE_CONVERTER": str(tree / "convert_hf_to_gguf.py")}
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "gguf-py"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if pre_tokenizer:
        env["GENPROBE_BPE_PRE"] = pre_tokenizer
    with replacing(out, suffix=".gguf") as tmp:
        cmd = [sys.executable, "-c", _CONVERT_LAUNCHER, str(src), "--outtype", "f32", "--outfile", str(tmp)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
            raise RuntimeError(f"llama.cpp's converter failed on {src} (exit {proc.returncode}):\n{tail}")
        fault_point("quantize:converted")


def convert_to_gguf(
    model_dir: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    pre_tokenizer: str | None = None,
    log: Callable[[str], None] | None = None,
    current: Callable[[Path], bool] | None = None,
) -> Path:
    """Write ``model_dir`` (a ``transformers`` directory) as an all-F32 GGUF at ``out_path`` with llama.cpp's
    ``convert_hf_to_gguf.py`` (``--outtype f32``); atomic (a partial file is never left at ``out_path``).

    An existing ``out_path`` for which ``current`` is true is kept (default: replaced). One process converts while
    another asking for the same file waits, then keeps it when ``current`` says so (:func:`genprobe._io.write_once`).
    """
    src = Path(model_dir)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} is not a transformers directory (no config.json): the converter reads one")
    tree = llama_cpp_source_dir()
    out = Path(out_path)
    started = time.perf_counter()
    wrote = write_once(
        out, current or (lambda _: False), lambda: _run_converter(tree, src, out, pre_tokenizer), out.name
    )
    if log and not wrote:
        log(f"reusing {out}")
    elif log:
        log(
            f"converted {src} -> {out} (F32 GGUF, {out.stat().st_size / 2**20:.1f} MiB, "
            f"{time.perf_counter() - started:.1f} s)"
        )
    return out


@dataclass
class QuantizedFile:
    """One GGUF file as llama.cpp wrote it: the recipe asked for and the tensor types actually written."""

    type: str
    path: str
    size_bytes: int
    bits_per_weight: float  # tensor bytes × 8 / parameters (every tensor, norms included)
    main_type: str  # the ggml type of the recipe's quantized tensors
    type_counts: dict[str, int]  # ggml type -> tensors
    off_target: dict[str, str] = field(default_factory=dict)  # 2-D tensor -> its type, where not main_type
    shape_fallbacks: list[str] = field(default_factory=list)  # off-target tensors whose row length forced it
    seconds: float = 0.0

    def describe(self) -> str:
        """One line: size, bits per weight, what was not written at the main type."""
        counts = ", ".join(f"{k} ×{v}" for k, v in self.type_counts.items())
        extra = ""
        if self.off_target:
            extra = f"; {len(self.off_target)} 2-D tensor(s) not {self.main_type}"
            if self.shape_fallbacks:
                extra += f" ({len(self.shape_fallbacks)} by llama.cpp's shape fallback)"
        size = f"{self.size_bytes / 2**20:.1f} MiB, {self.bits_per_weight:.2f} bits/weight"
        return f"{self.type}: {size} [{counts}]{extra}"


def describe_gguf(path: str | os.PathLike[str], type_name: str, seconds: float = 0.0) -> QuantizedFile:
    """Read a GGUF file's tensor table (no data) into a :class:`QuantizedFile` for the recipe ``type_name``."""
    from ...model.gguf import require_gguf_package

    gguf = require_gguf_package()
    reader = gguf.GGUFReader(Path(path), "r")
    _, main_type, block = QUANT_TYPES[type_name]
    counts: dict[str, int] = {}
    off_target: dict[str, str] = {}
    fallbacks: list[str] = []
    n_bytes = n_params = 0
    for t in reader.tensors:
        kind = t.tensor_type.name
        counts[kind] = counts.get(kind, 0) + 1
        n_bytes += int(t.n_bytes)
        n_params += int(t.n_elements)
        shape = [int(x) for x in t.shape]  # gguf-py lists ne[0] (the row length) first
        if len(shape) >= 2 and kind != main_type:
            off_target[t.name] = kind
            if shape[0] % block:
                fallbacks.append(t.name)
    return QuantizedFile(
        type=type_name,
        path=str(path),
        size_bytes=Path(path).stat().st_size,
        bits_per_weight=8.0 * n_bytes / max(1, n_params),
        main_type=main_type,
        type_counts=dict(sorted(counts.items(), key=lambda kv: -kv[1])),
        off_target=off_target,
        shape_fallbacks=fallbacks,
        seconds=seconds,
    )


def quantize_gguf(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    type_name: str,
    *,
    threads: int = 1,
    current: Callable[[Path], bool] | None = None,
) -> QuantizedFile:
    """Quantize the F32 GGUF ``src`` to ``type_name`` at ``dst`` with ``llama_model_quantize`` (llama.cpp's
    defaults of ``llama_model_quantize_default_params``: output tensor quantized, no importance matrix); atomic.

    An existing ``dst`` for which ``current`` is true is kept (default: replaced); one process quantizes while
    another asking for the same file waits (:func:`genprobe._io.write_once`)."""
    (name,) = check_types([type_name])
    lib = require_llama_cpp()
    source, out = Path(src), Path(dst)
    if not source.is_file():
        raise FileNotFoundError(f"no such GGUF file to quantize: {source}")
    seconds: list[float] = []
    write_once(out, current or (lambda _: False), lambda: seconds.append(_quantize(lib, source, out, name, threads)))
    return describe_gguf(out, name, seconds[0] if seconds else 0.0)


def _quantize(lib: Any, source: Path, out: Path, name: str, threads: int) -> float:
    """``llama_model_quantize`` into a temporary file beside ``out``, renamed to ``out``; the seconds it took."""
    params = lib.llama_model_quantize_default_params()
    params.nthread = max(1, int(threads))
    params.ftype = getattr(lib, QUANT_TYPES[name][0])
    started = time.perf_counter()
    with replacing(out, suffix=".gguf") as tmp:
        # llama.cpp logs every tensor to the process's stderr: kept in a file (its tail goes into the error below)
        # so that a study prints its own lines
        with tempfile.NamedTemporaryFile(prefix="genprobe-quantize-", suffix=".log") as captured:
            with output_to_file(captured.name):
                rc = lib.llama_model_quantize(str(source).encode(), str(tmp).encode(), params)
            log = Path(captured.name).read_text(errors="replace")
        seconds = time.perf_counter() - started
        if rc != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
            tail = "\n".join(log.strip().splitlines()[-6:])
            raise RuntimeError(f"llama_model_quantize failed writing {name} from {source} (return code {rc}):\n{tail}")
        fault_point("quantize:quantized")
    return seconds


def quantize_all(
    f32_gguf: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    types: list[str] | tuple[str, ...],
    *,
    threads: int = 1,
    stem: str = "model",
    log: Callable[[str], None] | None = None,
) -> dict[str, QuantizedFile]:
    """Every type of ``types`` (F32 is the input itself) as ``<out_dir>/<stem>-<TYPE>.gguf``, reused when present."""

    def current(p: Path) -> bool:  # at least as new as the F32 file it was written from
        return p.is_file() and p.stat().st_mtime >= Path(f32_gguf).stat().st_mtime

    files: dict[str, QuantizedFile] = {}
    for name in check_types(types):
        if name == "F32":
            files[name] = describe_gguf(f32_gguf, "F32")
            continue
        dst = Path(out_dir) / f"{stem}-{name}.gguf"
        files[name] = quantize_gguf(f32_gguf, dst, name, threads=threads, current=current)
        if log:
            log(f"quantized {files[name].describe()}")
    return files
