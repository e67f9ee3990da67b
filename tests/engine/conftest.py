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
