"""Models with one planted fault each, built from tiny configs (nothing downloaded), for the doctor's tests."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
import torch

from genprobe.cli import main

CHARS = string.ascii_letters + string.digits + " .,"


def run_cli(*args: str) -> int:
    """``genprobe ARGS`` in this process (the imports are shared between tests)."""
    return main([str(a) for a in args])


def char_tokenizer(eos: str, pad: str, lowercase: bool = False):
    """A character-level transformers tokenizer over ASCII with ``eos`` / ``pad`` as its special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = list(dict.fromkeys(["<unk>", eos, pad]))
    vocab = {t: i for i, t in enumerate(specials + list(CHARS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    if lowercase:  # a normaliser that loses information: the round trip breaks on capitals
        core.normalizer = normalizers.Lowercase()
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token=eos, pad_token=pad)


def tiny_llama_dir(d: Path, eos: str = "</s>", pad: str = "<pad>", lowercase: bool = False) -> Path:
    """A one-layer Llama with a character tokenizer, saved as a transformers directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = char_tokenizer(eos, pad, lowercase)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture
def gpt2_dir(tmp_path) -> Path:
    """A tiny random GPT-2 (learned absolute positions, no tokenizer) as a transformers directory."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    d = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=2)).save_pretrained(d)
    return d


@pytest.fixture
def looping_ckpt(tmp_path, tokenizer) -> Path:
    """A genprobe GPT that writes the same character after every prompt: every weight zero but the final layer
    norm's bias, which points the head at one token (logit 30, every other 0)."""
    from genprobe.model.checkpoint import save_checkpoint
    from genprobe.model.config import GPTConfig
    from genprobe.model.gpt import GPT

    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, n_layer=1, n_head=2, d_model=16, d_ff=32, block_size=64))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        token = tokenizer.encode("山")[0]
        model.wte.weight[token, 0] = 1.0
        model.ln_f.bias[0] = 30.0
    return save_checkpoint(tmp_path / "looping", model.eval(), tokenizer)
