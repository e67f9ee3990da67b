"""Reference GPT: config, model, loss, trainer, checkpoints, HF interop."""

from .config import GPTConfig
from .gpt import GPT, masked_cross_entropy, packed_positions

__all__ = ["GPTConfig", "GPT", "masked_cross_entropy", "packed_positions"]
