"""Hugging Face *directory* form of a checkpoint: what ``GPT2LMHeadModel.from_pretrained(DIR)`` loads offline.

The directory holds ``config.json`` + ``model.safetensors``, our vocabulary as ``genprobe_tokenizer.json`` and a
character-level ``tokenizer.json`` (WordLevel, ``<pad>``=0, ``<unk>``=1) so ``AutoTokenizer.from_pretrained(DIR)``
works too; it is assembled beside its place and renamed into it. Import goes through the one loader.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

from .._io import atomic_write_json, json_safe, replacing
from ..corpus.tokenizer import PAD_TOKEN, UNK_TOKEN, CharTokenizer
from .checkpoint import load_checkpoint
from .gpt import GPT
from .hf import from_hf_gpt2, quiet_transformers, to_hf_gpt2
from .load import TOKENIZER_FILE, load_model, read_char_tokenizer


def export_hf_dir(
    source: str | os.PathLike[str] | GPT,
    out_dir: str | os.PathLike[str],
    tokenizer: CharTokenizer | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write a ``from_pretrained``-loadable GPT-2 directory from a checkpoint dir (or a GPT + tokenizer)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

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
        with quiet_transformers():
            hf.save_pretrained(tmp)
        if tok is not None:  # ours, and a PreTrainedTokenizerFast mapping every character to our id (unknown: <unk>)
            atomic_write_json(tmp / TOKENIZER_FILE, json_safe(tok))
            core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tok.itos)}, unk_token=UNK_TOKEN))
            # One pre-token per character, newlines and spaces included ([\s\S], not '.', which skips '\n').
            core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
            core.decoder = decoders.Fuse()  # join characters without the default space separator
            # transformers' tokenizer __init__ takes **kwargs unannotated: a stub gap.
            PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
                tokenizer_object=core, unk_token=UNK_TOKEN, pad_token=PAD_TOKEN, clean_up_tokenization_spaces=False
            ).save_pretrained(tmp)
    return {
        "out": str(out),
        "files": sorted(p.name for p in out.iterdir()),
        "parameters": model.num_parameters(),
        "vocab_size": model.cfg.vocab_size,
        "block_size": model.cfg.block_size,
        "tokenizer": tok is not None,
    }


def import_hf_dir(hf_dir: str | os.PathLike[str]) -> tuple[GPT, CharTokenizer]:
    """A GPT-2 directory, loaded as every model is (:func:`~genprobe.model.load.load_model`: offline, safetensors
    only), back in the reference GPT, with its char vocabulary."""
    d = Path(hf_dir)
    tok = read_char_tokenizer(d, wordlevel=True)
    loaded = load_model(d)
    if tok is None:
        raise ValueError(f"{d} has neither {TOKENIZER_FILE} nor a character-level tokenizer.json")
    model = from_hf_gpt2(cast(Any, loaded.module))  # refuses any model_type but gpt2
    if tok.vocab_size != model.cfg.vocab_size:
        raise ValueError(
            f"{d}: vocabulary has {tok.vocab_size} ids but config.json has vocab_size {model.cfg.vocab_size}"
        )
    return model, tok
