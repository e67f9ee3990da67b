"""GGUF files (llama.cpp's format) as models, read through the well-kept libraries (the ``gguf`` extra).

``gguf`` (llama.cpp's own reader) checks the file and lists each tensor's quantization type; ``transformers``' GGUF
support maps the architecture, hyper-parameters and tokenizer and dequantizes every tensor (exactly) into an ordinary
float causal LM. A foreign, truncated or unsupported file is refused with one line before anything is written;
:func:`convert_gguf` writes the float model once as a safetensors directory. :func:`gguf_blocks` reads quantized
matrices as they are stored, in ``transformers``' names and row order, for :mod:`genprobe.model.gguf_blocks`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from .._io import atomic_write_json, fault_point, json_safe, read_json_object, replacing, sha256_file, write_once
from .errors import ModelLoadError, UnsupportedArchitectureError
from .hf import from_pretrained, quiet_transformers

GGUF_MAGIC = b"GGUF"
GGUF_SIDECAR = "genprobe_gguf.json"  # what a converted directory records about the GGUF it came from
# transformers lists two metadata prefixes among its GGUF "architectures"; they are not models
_NOT_ARCHITECTURES = {"general", "tokenizer"}
_INSTALL_HINT = "pip install 'genprobe[gguf]' (the gguf and accelerate packages)"


@dataclass(frozen=True)
class GGUFSummary:
    """What a GGUF file holds, read from its header: architecture, size, each tensor's quantization type."""

    JSON_PROPERTIES = ("type_counts",)  # computed from the fields, kept in the JSON form

    path: str
    size_bytes: int
    architecture: str
    name: str | None
    context_length: int | None
    tensor_types: dict[str, str]  # tensor name -> GGML type name (Q4_1, Q8_0, F32, …)
    # special-token ids outside the vocabulary (key -> id): loaded as absent, as llama.cpp does
    bad_special_ids: dict[str, int] = field(default_factory=dict)

    @property
    def type_counts(self) -> dict[str, int]:
        """How many tensors of each quantization type."""
        return dict(Counter(self.tensor_types.values()).most_common())


def gguf_file_of(path: Path) -> Path:
    """The GGUF file ``path`` names: the file itself, or the one ``*.gguf`` in a directory."""
    if path.is_file():
        return path
    files = sorted(path.glob("*.gguf"))
    if len(files) != 1:
        names = ", ".join(f.name for f in files)
        raise ModelLoadError(f"{path} holds {len(files)} GGUF files ({names}); name the one to load")
    return files[0]


def require_gguf_package() -> Any:
    try:
        import gguf
    except ImportError:
        raise ModelLoadError(f"reading GGUF files needs the gguf extra: {_INSTALL_HINT}") from None
    return gguf


def _check_magic(path: Path) -> None:
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file: it starts with {head!r}, a GGUF file with {GGUF_MAGIC!r}")


def _field_value(reader: Any, key: str) -> Any:
    found = reader.fields.get(key)
    return None if found is None else found.contents()


SPECIAL_ID_KEYS = tuple(
    f"tokenizer.ggml.{k}_token_id" for k in ("bos", "eos", "unknown", "padding", "seperator", "separator", "eot")
)


def header_reader(path: str | os.PathLike[str]) -> Any:
    """A ``gguf.GGUFReader`` of ``path`` (header parsed once per process while the file is unchanged: the doctor's
    audit and the loader share it; SmolLM2's header takes ~5 s in Python)."""
    p = Path(path)
    st = p.stat()
    return _cached_reader(os.path.realpath(p), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _cached_reader(path: str, size: int, mtime_ns: int) -> Any:
    return require_gguf_package().GGUFReader(path, "r")


def inspect_gguf(path: str | os.PathLike[str]) -> GGUFSummary:
    """Read a GGUF file's header (no tensor data): refuse non-GGUF, truncated and unsupported files."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such GGUF file: {p}")
    _check_magic(p)
    require_gguf_package()
    try:
        reader = header_reader(p)
    except (ValueError, IndexError, KeyError, OSError, EOFError) as exc:
        raise ModelLoadError(f"{p} is a truncated or corrupt GGUF file ({type(exc).__name__}: {exc})") from None
    size = p.stat().st_size
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise ModelLoadError(f"{p} is a truncated GGUF file: its tensors end at byte {end:,}, the file has {size:,}")
    arch = _field_value(reader, "general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{p} is a GGUF file without general.architecture; it does not describe a model")
    context = _field_value(reader, f"{arch}.context_length")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    ids = {k: _field_value(reader, k) for k in SPECIAL_ID_KEYS} if tokens is not None else {}
    return GGUFSummary(
        path=str(p),
        size_bytes=size,
        architecture=arch,
        name=_field_value(reader, "general.name"),
        context_length=int(context) if context is not None else None,
        tensor_types={t.name: t.tensor_type.name for t in reader.tensors},
        bad_special_ids={k: int(v) for k, v in ids.items() if isinstance(v, int) and not 0 <= v < len(tokens.data)},
    )


def check_supported(summary: GGUFSummary) -> None:
    """Refuse an architecture the installed ``transformers`` cannot dequantize into a model."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    supported = sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - _NOT_ARCHITECTURES)
    if summary.architecture not in supported:
        raise UnsupportedArchitectureError(
            f"{summary.path}: GGUF architecture {summary.architecture!r} is not one the installed transformers can "
            f"dequantize (it reads: {', '.join(supported)})"
        )


def read_gguf(path: str | os.PathLike[str], dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Any, GGUFSummary]:
    """Dequantize a GGUF file into a ``transformers`` causal LM (eval mode) and its fast tokenizer."""
    with one_header_read():
        summary = inspect_gguf(path)
        check_supported(summary)
        import transformers.modeling_gguf_pytorch_utils as hf_gguf
        from transformers import AutoModelForCausalLM, AutoTokenizer

        p, what = Path(summary.path), f"the GGUF file {Path(summary.path).name}"
        # transformers' dequantization loop draws its own tqdm bar, which its logging switch does not reach
        bar, hf_gguf.tqdm = hf_gguf.tqdm, functools.partial(hf_gguf.tqdm, disable=True)
        # Special-token ids outside the vocabulary: transformers indexes the vocabulary with each and raises IndexError
        # on one past its end; llama.cpp (``llama_vocab::impl::load``, src/llama-vocab.cpp: "bad special token: …
        # using default id") warns and keeps its default. genprobe reads the metadata as if they were absent, with a
        # warning (``genprobe doctor`` reports it as a bug).
        if bad := summary.bad_special_ids:
            from transformers.integrations.gguf import reader as hf_reader

            read, names = hf_reader.read_gguf_metadata, ", ".join(f"{k} = {v}" for k, v in bad.items())
            warnings.warn(
                f"special token id(s) outside the vocabulary, ignored as llama.cpp does: {names}", stacklevel=2
            )

            def filtered(*args: Any, **kwargs: Any) -> Any:
                metadata, names = read(*args, **kwargs)
                return {k: v for k, v in metadata.items() if k not in bad}, names

            hf_reader.read_gguf_metadata = filtered
        try:
            loaded = from_pretrained(AutoModelForCausalLM, p.parent, what, gguf_file=p.name, dtype=dtype)
            hf_tok = from_pretrained(AutoTokenizer, p.parent, what, gguf_file=p.name)
        finally:
            hf_gguf.tqdm = bar
            if bad:
                hf_reader.read_gguf_metadata = read
    # transformers keeps ``quantization_config`` (quant_method "gguf") on a model it dequantized, then refuses to
    # ``save_pretrained`` it; the tensors are plain floats: a fresh model of that config holds them as an ordinary one
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=loaded.dtype)  # type: ignore[no-untyped-call]
    fresh.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    fresh.tie_weights()
    module: nn.Module = fresh.eval()
    return module, hf_tok, summary


@contextlib.contextmanager
def one_header_read() -> Iterator[None]:
    """Inside, ``gguf.GGUFReader`` returns one reader per file, and ``gguf.get_tensor_name_map`` one map per
    (architecture, layer count): read-only lookups, so one serves all.

    Without it, a load parses the header four or five times (our check; transformers' config, tokenizer and weights;
    :func:`gguf_blocks`) and transformers rebuilds the name map for every submodule it walks (docs/llama-fast.md).
    """
    gguf = require_gguf_package()
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[str, Any] = {}
    name_maps: dict[tuple[Any, int], Any] = {}

    def one_name_map(arch: Any, n_blocks: int) -> Any:
        if (arch, n_blocks) not in name_maps:  # lookups only: one map serves every caller
            name_maps[arch, n_blocks] = name_map(arch, n_blocks)
        return name_maps[arch, n_blocks]

    def one_reader(path: str | os.PathLike[str], mode: str = "r") -> Any:
        if mode != "r":
            return reader_class(path, mode)
        key = os.path.realpath(path)
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = one_reader, one_name_map
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


def convert_gguf(
    path: str | os.PathLike[str], out_dir: str | os.PathLike[str], log: Callable[[str], None] | None = None
) -> Path:
    """Write a GGUF file as a float32 safetensors ``transformers`` directory (tokenizer and chat template included).

    The directory appears whole or not at all (written beside it, then renamed). An existing directory
    converted from the same file is kept (idempotent); any other existing path is refused. Two processes
    converting to the same directory at once: one converts while the other waits, then keeps its result
    (:func:`genprobe._io.write_once`); a conversion killed midway leaves a temporary the next one removes.
    ``log`` is told when this process (not another one) converts.
    """
    src, out = Path(path), Path(out_dir)
    if not src.is_file():
        raise FileNotFoundError(f"no such GGUF file: {src}")
    _check_magic(src)  # a foreign file is refused before it is hashed; read_gguf checks the rest
    digest = sha256_file(src)

    def converted(d: Path) -> bool:
        if not d.exists():
            return False
        if (read_sidecar(d) or {}).get("sha256") == digest and (d / "model.safetensors").is_file():
            return True
        raise ModelLoadError(f"{d} already exists and is not a conversion of {src}; choose another --out")

    def write() -> None:  # into a temporary directory beside ``out``, then renamed to ``out``
        if log:
            log(f"converting {src.name} to a float32 transformers directory")
        module, hf_tok, summary = read_gguf(src)  # refuses a truncated or unsupported file before anything is written
        with replacing(out, directory=True) as tmp, quiet_transformers():
            module.save_pretrained(tmp, safe_serialization=True)  # type: ignore[operator]  # a transformers model
            fault_point("convert_gguf:weights")
            hf_tok.save_pretrained(tmp)
            atomic_write_json(tmp / GGUF_SIDECAR, {**json_safe(summary), "sha256": digest}, indent=1)
            fault_point("convert_gguf:written")

    write_once(out, converted, write, f"the conversion of {src.name}")
    return out


def read_sidecar(d: Path) -> dict[str, Any] | None:
    """The GGUF summary a converted directory records, or None for any other directory."""
    side = d / GGUF_SIDECAR
    return read_json_object(side, ModelLoadError) if side.is_file() else None


def gguf_blocks(
    path: str | os.PathLike[str], module: nn.Module, types: set[str]
) -> dict[str, tuple[str, torch.Tensor]]:
    """The GGUF file's 2-D matrices of the ggml ``types`` (``Q8_0``, ``Q4_0``, ``Q4_K``, …) that are parameters of
    ``module`` (the model :func:`read_gguf` made of the same file), as ``{parameter name: (type name, uint8 rows)}``
    (see :mod:`genprobe.model.gguf_blocks`).

    The rows come in the order transformers gives the dequantized tensor: llama.cpp's converter reorders the rows of
    ``attn_q`` / ``attn_k`` and transformers' tensor processor undoes it, applied here to the row indices. A tensor
    whose processor does more than reorder rows is left out (it stays float)."""
    reader = require_gguf_package().GGUFReader(Path(path), "r")  # before transformers' GGUF module imports gguf
    import transformers.modeling_gguf_pytorch_utils as hf_gguf

    arch = _field_value(reader, "general.architecture")
    config = module.config.to_dict()  # type: ignore[union-attr, operator]  # a transformers model
    processor = hf_gguf.TENSOR_PROCESSORS.get(arch, hf_gguf.TensorProcessor)(config=config)  # type: ignore[no-untyped-call]
    names = hf_gguf.get_gguf_hf_weights_map(module, processor)
    found: dict[str, tuple[str, torch.Tensor]] = {}
    for tensor in reader.tensors:
        if tensor.tensor_type.name not in types or len(tensor.data.shape) != 2:
            continue
        raw = np.asarray(tensor.data)
        n = raw.shape[0]
        rows = processor.process(weights=np.arange(n).reshape(n, 1), name=tensor.name, tensor_key_mapping=names)  # type: ignore[no-untyped-call]
        if rows.name in names and sorted(rows.weights.reshape(-1).tolist()) == list(range(n)):
            ordered = np.ascontiguousarray(raw[rows.weights.reshape(n)])
            found[names[rows.name]] = (tensor.tensor_type.name, torch.from_numpy(ordered))
    return found
