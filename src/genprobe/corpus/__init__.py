"""Bundled Tang corpus, character tokenizer and train/validation splits."""
