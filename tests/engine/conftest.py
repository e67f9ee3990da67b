"""Engine tests run single-threaded: their tensors are tiny, and on a shared, oversubscribed CPU an
OpenMP parallel region around a (3, 10) softmax can cost a whole scheduler slice (≈25 ms)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _sharp_gpt(seed: int = 3, **config):
    """A small random GPT with trained-scale logits (matrices x 10), so a wrong or stale weight shows in the tokens.

    Its configuration is the one of ``tiny_model`` and the verifier's sharp model: compiled decode programs are
    cached by configuration and batch size (not weights), so the test files share them instead of each building its
    own (a build costs 10-30 s of a core). ``config``: fields of that configuration changed (a model of its own).
    """
    from genprobe.model.config import GPTConfig
    from genprobe.model.gpt import GPT

    torch.manual_seed(seed)
    shape = dict(vocab_size=50, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=32) | config
    m = GPT(GPTConfig(**shape))
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.mul_(10)
    return m.eval()


@pytest.fixture(scope="session")
def sharp_gpt():
    """The builder of :func:`_sharp_gpt` models (``sharp_gpt(seed=3)``), for module- and function-scoped use."""
    return _sharp_gpt


@pytest.fixture
def traced_only(monkeypatch):
    """The compiled path's own logic without Inductor's builds (``GENPROBE_COMPILE_BACKEND=aot_eager``): Dynamo traces
    the same functions, with the same guards, graphs per situation and fingerprints, and PyTorch's eager kernels
    run them. For tests of that logic (hooks, edits, padding, eos, limits); Inductor's own paths — the loop, the
    stepwise step, the prefill, the AOT programs, the narrow and block weights — keep tests that build them."""
    from genprobe.engine.fast import compiled

    monkeypatch.setenv(compiled.BACKEND_ENV, "aot_eager")
