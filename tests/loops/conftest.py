"""Shared builders of the loop tests."""

from __future__ import annotations

from pathlib import Path

import torch

POEM = "床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。春眠不覺曉，處處聞啼鳥。夜來風雨聲，花落知多少。"


def save_tiny_qwen2(d: Path) -> Path:
    """A tiny random Qwen2 with a byte-level BPE whose end-of-text token is id 0, saved as a transformers dir."""
    import transformers as T
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [POEM] * 5,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    fast = T.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    cfg = T.Qwen2Config(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=fast.eos_token_id,
        bos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    T.Qwen2ForCausalLM(cfg).save_pretrained(d)
    fast.save_pretrained(d)
    return d
