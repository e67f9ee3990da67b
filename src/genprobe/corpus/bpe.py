"""Byte-level BPE for the subword reference model, trained with the ``tokenizers`` library: every string encodes
(256 byte tokens, no ``<unk>``), ``decode(encode(t)) == t``, one special token ``<|endoftext|>`` between documents.
Two pipelines (``STYLES``: ``gpt2`` for Llama, ``qwen2`` as ``Qwen2Tokenizer`` rebuilds it): docs/own-model.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

EOS_TOKEN = "<|endoftext|>"
BYTE_ALPHABET = 256
MIN_VOCAB = BYTE_ALPHABET + 1  # the bytes plus <|endoftext|>, zero merges
MAX_VOCAB = 65536
STYLES = ("gpt2", "qwen2")
# Qwen2's pre-tokenisation pattern (as in transformers' Qwen2Tokenizer): a letter run may take one leading
# non-letter, digits are split one by one.
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def check_vocab_size(vocab_size: int) -> None:
    """Raise ValueError unless ``vocab_size`` is within [MIN_VOCAB, MAX_VOCAB]."""
    if not isinstance(vocab_size, int) or not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise ValueError(
            f"BPE vocabulary size must be an integer in [{MIN_VOCAB}, {MAX_VOCAB}] "
            f"(256 byte tokens + {EOS_TOKEN} + merges), got {vocab_size!r}"
        )


def train_bpe(texts: Iterable[str], vocab_size: int, style: str = "gpt2"):
    """Train a byte-level BPE ``tokenizers.Tokenizer`` on ``texts`` (deterministic: no seed involved) with the
    normaliser, pre-tokeniser and decoder of ``style`` (see module doc)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    check_vocab_size(vocab_size)
    tok = Tokenizer(models.BPE())
    if style not in STYLES:
        raise ValueError(f"tokenizer style must be one of {STYLES}, got {style!r}")
    if style == "gpt2":
        tok.normalizer = None
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,  # a merge needs a pair seen twice
        special_tokens=[EOS_TOKEN],
        # all 256 bytes up front: a character never seen in training still encodes (as its bytes)
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def eos_id(tok) -> int:
    """Id of ``<|endoftext|>`` in a tokenizer made by :func:`train_bpe`."""
    i = tok.token_to_id(EOS_TOKEN)
    if i is None:
        raise ValueError(f"tokenizer has no {EOS_TOKEN} token")
    return int(i)


def encode_batch(tok, texts: Sequence[str]) -> list[list[int]]:
    """Ids of each text, no special tokens added (Rust-side batching)."""
    return [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)]


def stream_ids(tok, texts: Sequence[str]) -> list[int]:
    """``<eos> t0 <eos> t1 ... <eos>``: the documents joined by end-of-text, which also opens the first."""
    eos = eos_id(tok)
    return [eos] + [t for ids in encode_batch(tok, texts) for t in (*ids, eos)]


def to_hf_tokenizer(tok, model_max_length: int | None = None):
    """Wrap as ``PreTrainedTokenizerFast``: eos = pad = ``<|endoftext|>``, no bos, decode without clean-up."""
    from transformers import PreTrainedTokenizerFast

    kw = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
        add_prefix_space=False,
        **kw,
    )
