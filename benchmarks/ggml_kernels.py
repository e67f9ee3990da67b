"""The matrix products of one SmolLM2-135M decode step (batch 1) on genprobe's kernels: float32 weights against the
same weights quantized to llama.cpp's block types (by gguf-py's quantizer) and read as blocks (issue #49).

Each step is the 210 products of the 30 layers (q, k, v, o, gate, up: 576 inputs; down: 1536), one row of x each;
the output layer is left out (a file keeps it in its own type). Prints the median over ``--reps`` steps of wall and
CPU time (CPU time is the steadier figure on a shared machine) and the weight bytes a step reads::

    python benchmarks/ggml_kernels.py --types Q4_0 Q5_0 Q8_0 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]


def step_weights(type_name: str, seed: int = 0) -> list[torch.Tensor]:
    """The step's weights: float32 (N, K), or uint8 blocks (N, blocks, bytes) of ``type_name``."""
    import gguf

    rng = np.random.default_rng(seed)
    out = []
    for n, k in LAYER * 30:
        w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
        if type_name == "F32":
            out.append(torch.from_numpy(w))
            continue
        qtype = gguf.GGMLQuantizationType[type_name]
        _, nbytes = gguf.GGML_QUANT_SIZES[qtype]
        out.append(torch.from_numpy(gguf.quants.quantize(w, qtype).reshape(n, -1, nbytes)))
    return out


def time_step(type_name: str, reps: int) -> dict[str, float]:
    """Median wall and CPU milliseconds of one step's products."""
    from gguf import GGMLQuantizationType

    ops = torch.ops.genprobe
    weights = step_weights(type_name)
    xs = {k: torch.randn(1, k) for k in (576, 1536)}
    ggml_type = None if type_name == "F32" else int(GGMLQuantizationType[type_name])

    shapes = LAYER * 30

    def step() -> None:
        for (_, k), w in zip(shapes, weights, strict=True):
            if ggml_type is None:
                ops.small_linear(xs[k], w, None)
            else:
                ops.small_linear_ggml(xs[k], w, None, ggml_type)

    step()
    wall, cpu = [], []
    for _ in range(reps):
        w0, c0 = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    return {"wall_ms": statistics.median(wall) * 1e3, "cpu_ms": statistics.median(cpu) * 1e3, "mb": nbytes / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=["Q4_0", "Q5_0", "Q8_0"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    from genprobe.engine.fast import kernels

    status = kernels.load()
    if not status.available:
        raise SystemExit(f"genprobe's kernels cannot run here: {status.reason}")
    torch.set_num_threads(args.threads)
    for type_name in ("F32", *args.types):
        r = time_step(type_name, args.reps)
        print(f"{type_name:5} wall {r['wall_ms']:7.2f} ms  cpu {r['cpu_ms']:7.2f} ms  weights {r['mb']:6.1f} MB")


if __name__ == "__main__":
    main()
