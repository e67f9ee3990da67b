"""Tiny models for the llama.cpp engine tests: a random Llama as a ``transformers`` directory, and the F32 GGUF that
llama.cpp's own converter (``convert_hf_to_gguf.py`` of the pinned source) writes from it.

The tokenizer is a 96-piece SentencePiece BPE trained in well under a second on a fixed sentence: the converter's
Llama path reads ``tokenizer.model`` (``conversion/llama.py``, ``LlamaModel.set_vocab`` →
``_set_vocab_sentencepiece``), so no pre-tokenizer hash has to be known, and ``transformers`` loads the same file.
The weights are random (normal, σ :data:`SCALE`) and saved in float32, so the F32
GGUF holds exactly the directory's numbers and the directory is the float32 reference.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

#: σ of the random weights: greedy generation loops after some prompts and not after others (a quarter of 24
#: random prompts degenerate within 32 tokens), and the logit gaps stay far above float noise
SCALE = 0.08
TRAINING_TEXT = ["the quick brown fox jumps over the lazy dog and the cat sat on the mat again and again"] * 50 + [
    "a b c d e f g h i j k l m n o p q r s t u v w x y z 0 1 2 3 4 5 6 7 8 9 . , ! ?"
] * 20


def write_tiny_llama(out: Path, seed: int = 0, layers: int = 2, max_positions: int = 256, scale: float = SCALE) -> Path:
    """A random LlamaForCausalLM (d 64, 4 heads / 2 KV heads, ``layers`` layers, weights N(0, ``scale``²), norms 1)
    + its SentencePiece tokenizer."""
    import sentencepiece as spm
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAINING_TEXT),
        model_writer=buf,
        vocab_size=96,
        model_type="bpe",
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    (out / "tokenizer.model").write_bytes(buf.getvalue())
    vocab = spm.SentencePieceProcessor(model_proto=buf.getvalue()).get_piece_size()
    (out / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    )
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    gen = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    model.save_pretrained(out)
    return out


_BUILT: dict[Path, tuple[Path, Path]] = {}


def skip_without_llama_cpp() -> None:
    """Skip (with the reason) when the bindings or llama.cpp's converter source are missing. Module-scoped fixtures
    run before the folder's autouse skip, so each one that builds or opens a model calls this first."""
    import pytest
    from install_wait import llama_cpp_or_skip

    from genprobe.serving.llamacpp.quantize import llama_cpp_source_dir

    llama_cpp_or_skip()
    try:
        llama_cpp_source_dir()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def tiny_llama_gguf(root: Path, seed: int = 0) -> tuple[Path, Path]:
    """(transformers directory, its F32 GGUF written by llama.cpp's converter) under ``root``; built once per
    process and root (the converter is a subprocess that imports torch: ~10 s on the shared 2-core machine)."""
    from genprobe.serving.llamacpp.quantize import convert_to_gguf

    skip_without_llama_cpp()
    hf, gguf = root / "tiny-llama", root / "tiny-llama-F32.gguf"
    if root not in _BUILT and gguf.is_file():  # built by this file imported under another name (`.models`, `models`)
        _BUILT[root] = (hf, gguf)
    if root not in _BUILT:
        _BUILT[root] = (write_tiny_llama(hf, seed), convert_to_gguf(hf, gguf))
    return _BUILT[root]
