"""Hugging Face *directory* form of a checkpoint: what ``GPT2LMHeadModel.from_pretrained(DIR)`` loads offline.

The directory holds ``config.json`` + ``model.safetensors`` (``save_pretrained``), our vocabulary as
``genprobe_tokenizer.json`` and a character-level ``tokenizer.json`` (WordLevel vocabulary, one token per
character, ``<pad>``=0, ``<unk>``=1) so ``AutoTokenizer.from_pretrained(DIR)`` works too. It is assembled in
a temporary sibling directory and renamed into place, so a crash never leaves a half-written export.
Import reads safetensors only (``use_safetensors=True``): a ``pytorch_model.bin`` is never unpickled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .._io import atomic_write_json, json_safe, read_json_object, replacing
from ..corpus.tokenizer import PAD_TOKEN, UNK_TOKEN, CharTokenizer
from .checkpoint import load_checkpoint
from .gpt import GPT
from .hf import from_hf_gpt2, quiet_transformers, to_hf_gpt2

if TYPE_CHECKING:  # transformers is imported lazily at run time
    from transformers import PreTrainedTokenizerFast

TOKENIZER_FILE = "genprobe_tokenizer.json"


def _hf_char_tokenizer(tokenizer: CharTokenizer) -> PreTrainedTokenizerFast:
    """A ``PreTrainedTokenizerFast`` that maps every character to our id (unknown → ``<unk>``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(tokenizer.itos)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # One pre-token per character, newlines and spaces included ([\s\S], not '.', which skips '\n').
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()  # join characters without the default space separator
    # transformers' tokenizer __init__ takes **kwargs unannotated: a stub gap.
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core, unk_token=UNK_TOKEN, pad_token=PAD_TOKEN, clean_up_tokenization_spaces=False
    )


def export_hf_dir(
    source: str | os.PathLike[str] | GPT,
    out_dir: str | os.PathLike[str],
    tokenizer: CharTokenizer | None = None,
    overwrite: bool = False,
    hf_tokenizer: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Write a ``from_pretrained``-loadable GPT-2 directory from a checkpoint dir (or a GPT + tokenizer)."""
    model, tok = (source, tokenizer) if isinstance(source, GPT) else load_checkpoint(source)[:2]
    if tok is not None and tok.vocab_size != model.cfg.vocab_size:
        raise ValueError(f"tokenizer has {tok.vocab_size} ids but the model's vocab_size is {model.cfg.vocab_size}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"export target exists and is not a directory: {out}")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"export target {out} exists and is not empty (overwrite=True replaces it)")
    hf = to_hf_gpt2(model)  # refuses positions GPT-2 has no table for, before anything is written
    with replacing(out, directory=True) as tmp:
        with quiet_transformers(progress):
            hf.save_pretrained(tmp)
        if tok is not None:
            atomic_write_json(tmp / TOKENIZER_FILE, json_safe(tok))
            if hf_tokenizer:
                _hf_char_tokenizer(tok).save_pretrained(tmp)
    return {
        "out": str(out),
        "files": sorted(p.name for p in out.iterdir()),
        "parameters": model.num_parameters(),
        "vocab_size": model.cfg.vocab_size,
        "block_size": model.cfg.block_size,
        "tokenizer": tok is not None,
        "hf_tokenizer": tok is not None and hf_tokenizer,
    }


def read_char_tokenizer(d: Path, wordlevel: bool = False) -> CharTokenizer | None:
    """The char vocabulary stored beside a GPT-2 directory: genprobe's ``genprobe_tokenizer.json``, else (with
    ``wordlevel``) a character-level WordLevel ``tokenizer.json`` written by us or compatible; None when neither."""
    p = d / TOKENIZER_FILE
    if p.is_file():
        try:
            return CharTokenizer.from_dict(json.loads(p.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, ValueError) as exc:
            raise ValueError(f"{p} is not a genprobe char vocabulary ({exc})") from None
    p = d / "tokenizer.json"
    if wordlevel and p.is_file():
        try:
            vocab = json.loads(p.read_text(encoding="utf-8"))["model"]["vocab"]
            itos = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
            if [vocab[t] for t in itos] != list(range(len(itos))):
                raise ValueError("ids are not contiguous")
            return CharTokenizer.from_itos(itos)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{p} is not a character-level WordLevel vocabulary genprobe can use ({exc})") from None
    return None


def import_hf_dir(hf_dir: str | os.PathLike[str], progress: bool = False) -> tuple[GPT, CharTokenizer]:
    """Load a GPT-2 directory (safetensors only, offline) back into the reference GPT and its vocabulary."""
    from transformers import GPT2LMHeadModel

    d = Path(hf_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"HF model directory does not exist: {d}")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ValueError(f"{d} is not a Hugging Face model directory: config.json is missing")
    model_type = read_json_object(cfg_path).get("model_type")
    if model_type != "gpt2":
        raise ValueError(f"{d}: model_type is {model_type!r}; only 'gpt2' maps onto the reference GPT")
    if not any(d.glob("*.safetensors")):
        raise ValueError(f"{d} has no *.safetensors weights (genprobe never loads pickled .bin weights)")
    tok = read_char_tokenizer(d, wordlevel=True)
    if tok is None:
        raise ValueError(f"{d} has neither {TOKENIZER_FILE} nor a character-level tokenizer.json")
    try:
        with quiet_transformers(progress):
            hf = GPT2LMHeadModel.from_pretrained(d, local_files_only=True, use_safetensors=True, dtype=torch.float32)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{d}: transformers could not load the GPT-2 weights ({exc})") from None
    model = from_hf_gpt2(hf)
    if tok.vocab_size != model.cfg.vocab_size:
        raise ValueError(
            f"{d}: vocabulary has {tok.vocab_size} ids but config.json has vocab_size {model.cfg.vocab_size}"
        )
    return model, tok
