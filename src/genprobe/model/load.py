"""One loader: a genprobe checkpoint, a ``transformers`` directory or a GGUF file becomes one :class:`Model`.

A :class:`Model` carries the module (in eval mode), its tokenizer (behind one :class:`Tokenizer` protocol), its limits
and where its MLPs are; generating from it is the engine's job (``genprobe.load`` wraps this loader and adds a runner).
The rules, the same for every caller: docs/ARCHITECTURE.md, "The one loader".
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence, cast, runtime_checkable

import torch
import torch.nn as nn

from .._io import json_safe, read_json_object
from ..corpus.tokenizer import CharTokenizer
from .arch import MLPSite, mlp_sites, state_sha256
from .errors import ModelLoadError, UnsupportedArchitectureError
from .gpt import GPT

PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
TOKENIZER_FILE = "genprobe_tokenizer.json"  # a char vocabulary beside a transformers model (genprobe export-hf)


@runtime_checkable
class Tokenizer(Protocol):
    """What genprobe needs from a tokenizer, character-level or subword."""

    kind: str  # "char" | "subword"
    pad_id: int

    # Read-only: genprobe never sets them, and CharTokenizer derives vocab_size and fixes the special ids.
    @property
    def vocab_size(self) -> int: ...

    @property
    def unk_id(self) -> int | None: ...  # None when every text encodes

    @property
    def eos_id(self) -> int | None: ...  # None when the vocabulary has no end-of-text token

    def encode(self, text: str) -> list[int]:
        """Text → ids, no special tokens added."""

    def decode(self, ids: Sequence[int]) -> str:
        """Ids → text (padding and special tokens dropped)."""

    def token_str(self, token_id: int) -> str:
        """Display form of one id."""

    def unknown_chars(self, text: str) -> list[str]:
        """Characters of ``text`` the vocabulary cannot represent (they become the unknown token)."""


class SubwordTokenizer:
    """A ``transformers`` fast tokenizer (BPE, WordPiece, …) behind :class:`Tokenizer`."""

    kind = "subword"

    def __init__(self, hf_tokenizer: Any):
        self.hf = hf_tokenizer
        self.vocab_size = len(hf_tokenizer)
        self.unk_id = hf_tokenizer.unk_token_id
        self.eos_id = hf_tokenizer.eos_token_id
        pad = hf_tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_id if self.eos_id is not None else 0)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))  # a prompt is continued, not wrapped

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self.hf.decode([int(i) for i in ids], skip_special_tokens=True)
        return text

    def token_str(self, token_id: int) -> str:
        """The text of one token (a partial UTF-8 sequence shows as U+FFFD)."""
        text: str = self.hf.decode([int(token_id)])
        return text

    def unknown_chars(self, text: str) -> list[str]:
        """Characters that encode to the unknown token (none for byte-level BPE)."""
        if self.unk_id is None or not text:
            return []
        enc = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        out: list[str] = []
        for tid, (a, b) in zip(enc["input_ids"], enc["offset_mapping"], strict=True):
            for ch in text[a:b] if tid == self.unk_id else ():
                if ch not in out:
                    out.append(ch)
        return out


# ---- what a module accepts, read off the module itself (the loaded Model and the engine's runners agree) ----
def vocab_size(module: Any) -> int:
    """Rows of the output embedding: what a token id must stay below."""
    if isinstance(module, GPT):
        return module.cfg.vocab_size
    out_emb = module.get_output_embeddings() if hasattr(module, "get_output_embeddings") else None
    return int(out_emb.weight.shape[0]) if out_emb is not None else int(module.config.vocab_size)


def max_positions(module: Any) -> int | None:
    """Hard context length (learned positions, or the config's), None when positions are unbounded."""
    if isinstance(module, GPT):
        return module.cfg.max_positions
    c = module.config
    positions = getattr(c, "n_positions", None) or getattr(c, "max_position_embeddings", None)
    return None if positions is None else int(positions)


def pad_id(module: Any) -> int:
    """An id to fill left padding with (never attended to): the config's pad token when it is in range, else 0."""
    if isinstance(module, GPT):
        return 0
    pad = getattr(module.config, "pad_token_id", None)
    return int(pad) if pad is not None and 0 <= int(pad) < vocab_size(module) else 0


@dataclass(eq=False)
class Model:
    """A loaded causal LM: module + tokenizer + limits + where its MLPs are. Build with :func:`load_model`.

    Plain data and what can be read off the module. Running it is the engine's: every engine entry point takes a
    ``Model`` (``genprobe.engine.runner.runner_for`` chooses its runner), and ``genprobe.load`` returns the engine's
    subclass, ``genprobe.engine.loaded.LoadedModel``, which adds ``runner`` and ``generate()``.
    """

    module: nn.Module
    tokenizer: Tokenizer | None
    kind: str  # "genprobe" | "hf"
    arch: str  # "gpt" for ours, else the transformers ``model_type``
    source: Path | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_module(cls, module: nn.Module, tokenizer: Tokenizer | None = None, source: Path | None = None) -> "Model":
        """Wrap an in-memory genprobe GPT or ``transformers`` causal LM."""
        if isinstance(module, GPT):
            return cls(module.eval(), tokenizer, "genprobe", "gpt", source)
        config = getattr(module, "config", None)
        if config is None or not callable(module):
            raise TypeError(f"expected a genprobe GPT or a transformers causal LM, got {type(module).__name__}")
        return cls(module.eval(), tokenizer, "hf", str(getattr(config, "model_type", type(module).__name__)), source)

    # ---- limits -----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Rows of the output embedding (what a token id must stay below)."""
        return vocab_size(self.module)

    @property
    def max_positions(self) -> int | None:
        """Context length: the learned position table's rows, or the HF config's; None when unbounded."""
        return max_positions(self.module)

    @property
    def window(self) -> int | None:
        """Sliding-window length when (some of) the model's layers attend over a window, else None."""
        if self.kind != "hf":
            return None
        c = self.module.config
        w = getattr(c, "sliding_window", None)
        if not w or getattr(c, "use_sliding_window", True) is False:
            return None
        return int(w)

    # ---- tokens ------------------------------------------------------------------------------
    @property
    def eos_id(self) -> int | None:
        """End-of-text token id, if the tokenizer has one."""
        return None if self.tokenizer is None else self.tokenizer.eos_id

    @property
    def unk_id(self) -> int | None:
        """Unknown-token id, if the tokenizer has one."""
        return None if self.tokenizer is None else self.tokenizer.unk_id

    @property
    def pad_id(self) -> int:
        """A safe id to fill left padding with (never attended to)."""
        return self.tokenizer.pad_id if self.tokenizer is not None else pad_id(self.module)

    def require_tokenizer(self) -> Tokenizer:
        """The tokenizer; an error naming ``--ids`` when the model has none."""
        if self.tokenizer is None:
            where = f" {self.source}" if self.source else ""
            raise ValueError(
                f"the model{where} has no tokenizer: text cannot be encoded; pass token ids instead "
                "(on the command line: --ids ID ...)"
            )
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        return self.require_tokenizer().encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.require_tokenizer().decode(ids)

    # ---- structure ---------------------------------------------------------------------------
    def mlp_sites(self) -> list[MLPSite]:
        """One :class:`~genprobe.model.arch.MLPSite` per layer (the MLP down-projections a loop patch edits)."""
        return mlp_sites(self.module)

    def state_sha256(self) -> str:
        """sha256 over the full state dict (what a loop patch checks before and after)."""
        return state_sha256(self.module)

    def num_parameters(self) -> int:
        """Distinct parameters (tied embeddings counted once)."""
        return sum(p.numel() for p in self.module.parameters())

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary: kind, architecture, size, limits, tokenizer."""
        tok = self.tokenizer
        return {
            "source": str(self.source) if self.source else None,
            "kind": self.kind,
            "arch": self.arch,
            "parameters": self.num_parameters(),
            "vocab_size": self.vocab_size,
            "max_positions": self.max_positions,
            "window": self.window,
            "tokenizer": None
            if tok is None
            else {"kind": tok.kind, "vocab_size": tok.vocab_size, "eos_id": tok.eos_id, "unk_id": tok.unk_id},
            "chat_template": self.chat_template is not None,
            # weights read from a GGUF file: each tensor's quantization type there (Q4_1, Q8_0, F32, …)
            "gguf": self.meta.get("gguf"),
        }

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template (Jinja), when the model ships one."""
        hf = getattr(self.tokenizer, "hf", None)
        template = getattr(hf, "chat_template", None)
        return template if isinstance(template, str) else None

    def chat_prompt(self, user_text: str) -> str:
        """``user_text`` as one user turn rendered by the model's chat template, ready for the assistant's reply."""
        template = self.chat_template
        if template is None:
            raise ValueError(f"the model {self.source or ''} has no chat template; drop --chat")
        hf: Any = getattr(self.tokenizer, "hf", None)  # a template exists only on a transformers tokenizer
        messages = [{"role": "user", "content": user_text}]
        from jinja2 import TemplateError

        try:
            text: str = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except TemplateError as exc:  # the model's template is its own code: refused, sandbox violations included
            raise ValueError(
                f"the chat template of {self.source or 'the model'} cannot render a user turn "
                f"({type(exc).__name__}: {exc}); `genprobe doctor MODEL --only audit` says why"
            ) from exc
        return text


# ---- loading --------------------------------------------------------------------------------
def load_model(
    path: str | os.PathLike[str],
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    weight_dtype: torch.dtype | None = None,
    narrow_output: bool = False,
) -> Model:
    """Load a genprobe checkpoint or a ``transformers`` model directory (auto-detected, offline, safetensors only).

    ``weight_dtype=torch.bfloat16`` or ``torch.int8`` (genprobe checkpoints and Llama-family transformers models,
    float32) stores the linear layers' weights narrow, computing in float32: an opt-in approximation, see
    :mod:`genprobe.model.weight_only`; ``narrow_output=True`` the output layer tied to the embedding too.
    """
    weight_dtype = dtype if weight_dtype is None else weight_dtype  # linear layers stored as the model, unless asked
    if narrow_output and weight_dtype == dtype:
        raise ModelLoadError(
            "narrow_output stores the output layer in weight_dtype, which must be bfloat16 or int8 (and not the "
            f"model's dtype); got {weight_dtype}"
        )
    from .catalog import resolve_name
    from .kinds import FILE_KINDS, ModelKind, kinds_phrase, model_kind

    if model_kind(path) is ModelKind.URL:
        raise ModelLoadError(
            f"{path} is a URL: live endpoints are not supported yet; a model is {kinds_phrase(FILE_KINDS)}"
        )
    d = Path(path) if Path(path).exists() else resolve_name(str(path))  # a catalog name: its fetched directory
    kind = model_kind(d)
    if kind is ModelKind.GGUF:
        if weight_dtype not in (dtype, torch.int8):
            raise ModelLoadError(
                f"weight-only {weight_dtype} storage is for genprobe checkpoints and transformers models; {d} is a "
                "GGUF file (int8 keeps its quantized blocks, Q8_0 and the 4-6-bit types, as they are)"
            )
        return _load_gguf(d, dtype, device, int8_blocks=weight_dtype == torch.int8, narrow_output=narrow_output)
    if kind is ModelKind.CHECKPOINT:
        from .checkpoint import load_checkpoint

        gpt, char_tok, meta = load_checkpoint(d, device=str(device))
        model = Model(gpt.to(dtype), char_tok, "genprobe", "gpt", d, meta)
    elif kind is ModelKind.TRANSFORMERS:
        model = _load_transformers(d, dtype, device)
    else:
        raise ModelLoadError(
            f"{d} is a {'file' if d.is_file() else 'directory'} but neither a genprobe checkpoint (genprobe.json + "
            "model.safetensors), a transformers model directory (config.json + *.safetensors) nor a GGUF file"
        )
    if weight_dtype != dtype:
        _narrow_linear_layers(model, weight_dtype, narrow_output)
    return model


def _load_transformers(d: Path, dtype: torch.dtype, device: str | torch.device) -> Model:
    """A transformers model directory, offline, safetensors only, never remote code: checked against its config."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    from .gguf import read_sidecar
    from .hf import from_pretrained

    cfg = read_json_object(d / "config.json", ModelLoadError)
    check_weights_files(d)
    model_type = cfg.get("model_type")
    if not model_type:
        raise ModelLoadError(f"{d / 'config.json'} has no model_type")
    if model_type not in CONFIG_MAPPING:
        remote = " and needs remote code (auto_map)" if "auto_map" in cfg else ""
        raise UnsupportedArchitectureError(
            f"{d}: model_type {model_type!r} is not an architecture of the installed transformers{remote}; "
            "genprobe never runs trust_remote_code"
        )
    loaded = from_pretrained(
        AutoModelForCausalLM, d, "the model", use_safetensors=True, dtype=dtype, output_loading_info=True
    )
    module, info = cast(tuple[nn.Module, dict[str, Any]], loaded)  # output_loading_info: (model, info)
    # tied parameters are not stored in safetensors, so legitimately "missing" (a dict of them, or a list)
    tied = set(getattr(module, "_tied_weights_keys", None) or ())
    missing = [k for k in info.get("missing_keys", ()) if k not in tied]
    if missing:
        raise ModelLoadError(
            f"{d}: the weights leave {len(missing)} parameter(s) uninitialised (e.g. {missing[:3]}); "
            "the safetensors file does not belong to this config"
        )
    tok = load_tokenizer(d)
    meta = {"config": cfg}
    if (gguf := read_sidecar(d)) is not None:  # a directory converted from GGUF records the file's tensor types
        meta["gguf"] = gguf
    model = Model(module.to(device).eval(), tok, "hf", str(model_type), d, meta)
    if tok is not None and tok.vocab_size > model.vocab_size:
        raise ModelLoadError(
            f"{d}: the tokenizer has {tok.vocab_size} tokens but the model's output embedding has only "
            f"{model.vocab_size} rows; the tokenizer does not belong to this model"
        )
    return model


def _narrow_linear_layers(model: Model, weight_dtype: torch.dtype, narrow_output: bool) -> None:
    """Linear layers stored in ``weight_dtype`` (transformers: Llama-family only, whose fast path reads them narrow)."""
    from .llama_family import unsupported_reason
    from .weight_only import with_weight_dtype

    reason = None if model.kind == "genprobe" else unsupported_reason(model.module)
    if reason is not None:
        raise ModelLoadError(
            f"weight-only {weight_dtype} storage is for genprobe checkpoints and Llama-family transformers "
            f"models; {model.source}: {reason} (load it in another dtype with dtype=...)"
        )
    try:
        model.module = with_weight_dtype(model.module, weight_dtype, narrow_output)
    except ValueError as exc:
        raise ModelLoadError(f"{model.source}: {exc}") from None


def _load_gguf(
    path: Path, dtype: torch.dtype, device: str | torch.device, int8_blocks: bool = False, narrow_output: bool = False
) -> Model:
    """A GGUF file (or the one in a directory), dequantized by transformers (see :mod:`genprobe.model.gguf`).

    ``int8_blocks``: the linear layers of a float32 Llama-family model keep the file's quantized matrices as their
    blocks instead (:func:`~genprobe.model.gguf_blocks.with_gguf_blocks`); every other matrix stays float32
    (``meta["weight_blocks"]`` says which).
    """
    from .gguf import gguf_blocks, gguf_file_of, one_header_read, read_gguf
    from .gguf_blocks import BLOCK_TYPES, BlockLinear, with_gguf_blocks
    from .llama_family import unsupported_reason
    from .weight_only import WeightOnlyLinear

    file = gguf_file_of(path)
    with one_header_read():  # the int8 blocks come from the same parse of the file as the model
        module, hf_tok, summary = read_gguf(file, dtype)
        if int8_blocks:
            reason = unsupported_reason(module)
            if dtype != torch.float32 or reason is not None:
                why = reason or f"the model's dtype is {dtype}, int8 blocks widen to float32"
                raise ModelLoadError(
                    f"keeping a GGUF file's quantized blocks is for float32 Llama-family models; {file}: {why}"
                )
            blocks = gguf_blocks(file, module, set(BLOCK_TYPES))
            if not blocks:
                raise ModelLoadError(
                    f"{file} holds no matrices in blocks genprobe keeps ({', '.join(BLOCK_TYPES)}); load it without "
                    "weight_dtype, or make a quantized file with `genprobe quant-compare MODEL --types Q8_0 Q4_0`"
                )
            try:  # the loader's model is its own (read_gguf made it): its layers are replaced in place, no copy
                module = with_gguf_blocks(module, blocks, narrow_output, copy_model=False)
            except ValueError as exc:
                raise ModelLoadError(f"{file}: {exc}") from None
    config: Any = module.config  # a transformers model
    meta = {"config": config.to_dict(), "gguf": json_safe(summary)}
    if int8_blocks:  # which linear layers hold the file's blocks (count per ggml type) and which stayed float32
        kept = Counter(
            m.type_name if isinstance(m, BlockLinear) else "Q8_0"
            for m in module.modules()
            if isinstance(m, BlockLinear) or (isinstance(m, WeightOnlyLinear) and m.blocked)
        )
        float32 = [name for name, m in module.named_modules() if type(m) is torch.nn.Linear]
        meta["weight_blocks"] = {"blocks": dict(kept), "float32_linear_layers": float32}
    return Model(module.to(device).eval(), SubwordTokenizer(hf_tok), "hf", str(config.model_type), file, meta)


def check_weights_files(d: Path) -> None:
    """Refuse a directory whose weights are missing or pickled (genprobe never unpickles)."""
    if any(d.glob("*.safetensors")):
        return
    pickled = sorted(p.name for p in d.iterdir() if p.suffix in PICKLED_SUFFIXES)
    if pickled:
        raise ModelLoadError(
            f"{d} holds only pickled weights ({', '.join(pickled)}); genprobe loads safetensors only, because "
            "unpickling can run arbitrary code. Convert it once, where you trust the file: "
            "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)"
        )
    raise ModelLoadError(f"{d} has a config.json but no weights (*.safetensors)")


def load_tokenizer(d: Path) -> Tokenizer | None:
    """The tokenizer stored beside a transformers model: genprobe's char vocabulary, else AutoTokenizer, else None."""
    char = read_char_tokenizer(d)
    if char is not None:
        return char
    if not any((d / f).is_file() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    from .hf import from_pretrained

    return SubwordTokenizer(from_pretrained(AutoTokenizer, d, "the tokenizer"))


def read_char_tokenizer(d: Path, wordlevel: bool = False) -> CharTokenizer | None:
    """The char vocabulary stored beside a GPT-2 directory: genprobe's ``genprobe_tokenizer.json``, else (with
    ``wordlevel``) a character-level WordLevel ``tokenizer.json`` written by us or compatible; None when neither."""
    p = d / TOKENIZER_FILE
    if p.is_file():
        try:
            return CharTokenizer.from_dict(json.loads(p.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, ValueError) as exc:
            raise ModelLoadError(f"{p} is not a genprobe char vocabulary ({exc})") from None
    p = d / "tokenizer.json"
    if wordlevel and p.is_file():
        try:
            vocab = json.loads(p.read_text(encoding="utf-8"))["model"]["vocab"]
            itos = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
            if [vocab[t] for t in itos] != list(range(len(itos))):
                raise ValueError("ids are not contiguous")
            return CharTokenizer.from_itos(itos)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{p} is not a character-level WordLevel vocabulary genprobe reads ({exc})") from None
    return None
