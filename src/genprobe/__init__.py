"""genprobe: make the inference-time behaviour of autoregressive transformer LMs measurable and fixable."""

__version__ = "0.1.0"
