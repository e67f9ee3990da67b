"""Write the subword reference model as a standard transformers directory, atomically.

Files: ``config.json``, ``generation_config.json``, ``model.safetensors`` (``save_pretrained``),
``tokenizer.json`` + ``tokenizer_config.json`` (``PreTrainedTokenizerFast.save_pretrained``) and
``genprobe_training.json`` (recipe, split, losses, bits/char; *not* named ``genprobe.json``, which marks
a genprobe char checkpoint). The directory is assembled in a temporary sibling and renamed into place,
so a crash never leaves a half-written model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .._io import atomic_write_json, check_target_dir, read_format_json, replacing
from ..corpus import bpe
from .hf import quiet_transformers

if TYPE_CHECKING:  # tokenizers and transformers are imported lazily at run time
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SUMMARY_FILE = "genprobe_training.json"
SUMMARY_FORMAT = "genprobe-subword-training-v1"


def save_subword_dir(
    out: str | os.PathLike[str], model: PreTrainedModel, tok: Tokenizer, summary: dict[str, Any]
) -> Path:
    """Write ``model`` + BPE ``tok`` + ``summary`` to ``out`` (replacing an earlier run there)."""
    out = Path(out)
    check_target_dir(out, SUMMARY_FILE, "a genprobe-trained model", "output")
    if tok.get_vocab_size() != model.config.vocab_size:
        raise ValueError(
            f"tokenizer has {tok.get_vocab_size()} ids but the model's vocab_size is {model.config.vocab_size}"
        )
    with replacing(out, directory=True) as tmp:
        with quiet_transformers(False):
            model.save_pretrained(tmp, safe_serialization=True)
        bpe.to_hf_tokenizer(tok, model.config.max_position_embeddings).save_pretrained(tmp)
        _portable_tokenizer_class(tmp / "tokenizer_config.json")
        atomic_write_json(tmp / SUMMARY_FILE, {"format": SUMMARY_FORMAT, **summary})
    return out


def _portable_tokenizer_class(path: Path) -> None:
    """Name the class both transformers 4 and 5 resolve to "load tokenizer.json as is".

    transformers 5 writes ``TokenizersBackend``, a name transformers 4 does not know;
    ``PreTrainedTokenizerFast`` is that class in 4 and an alias of it in 5.
    """
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    atomic_write_json(path, cfg)


def read_summary(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The training summary of a directory written by :func:`save_subword_dir`."""
    return read_format_json(Path(directory) / SUMMARY_FILE, SUMMARY_FORMAT)


def load_subword_dir(directory: str | os.PathLike[str]) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``(model, tokenizer)`` through the public transformers API: offline, safetensors only, float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet_transformers(False):
        model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
            directory, local_files_only=True, use_safetensors=True, dtype=torch.float32
        )
    tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model.eval()  # type: ignore[no-untyped-call]  # transformers' eval() override is unannotated
    return model, tok
