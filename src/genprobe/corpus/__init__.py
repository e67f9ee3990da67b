"""Bundled Tang corpus, character tokenizer and train/validation splits."""

from .tang import Corpus, load_corpus, bundled_corpus_path
from .tokenizer import CharTokenizer, EncodeResult, PAD_ID, UNK_ID

__all__ = ["Corpus", "load_corpus", "bundled_corpus_path", "CharTokenizer", "EncodeResult", "PAD_ID", "UNK_ID"]
