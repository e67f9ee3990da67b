"""Reference GPT: config, model, loss, trainer, checkpoints, HF interop."""
