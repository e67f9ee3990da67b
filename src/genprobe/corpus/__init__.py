"""Bundled Tang corpus, character tokenizer and train/validation splits."""

from .tang import Corpus, bundled_corpus_path, load_corpus
from .tokenizer import PAD_ID, UNK_ID, CharTokenizer, EncodeResult

__all__ = ["Corpus", "load_corpus", "bundled_corpus_path", "CharTokenizer", "EncodeResult", "PAD_ID", "UNK_ID"]
