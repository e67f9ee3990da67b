"""What weight-only narrow storage costs in quality, beside what it gains in speed (benchmarks/llama_speed.py).

For each ``--variants`` entry (``int8``, ``int8-head``: int8 with the output layer int8 too, ``bfloat16``,
``bfloat16-head``) the model is loaded with ``genprobe.load(model, weight_dtype=..., narrow_output=...)`` and its
logits on real text are compared with the float32 model's, position by position: KL(float32 ‖ variant) mean, p99 and
max, top-1 agreement, perplexity of both. The text is the one ``genprobe quant-compare`` measures llama.cpp's GGUF
types on (``--text-windows`` windows of ``--window-tokens`` tokens of the English validation documents for an English
model), so a row here reads beside that study's Q8_0 row::

    python benchmarks/weight_only_quality.py smollm2 --variants int8 int8-head --json > out/bench/wo-quality.json
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from genprobe._io import json_safe

VARIANTS = {
    "int8": ("int8", False),
    "int8-head": ("int8", True),
    "bfloat16": ("bfloat16", False),
    "bfloat16-head": ("bfloat16", True),
}


def measure(model_ref: str, variants: list[str], windows: int, window_tokens: int) -> dict[str, Any]:
    """KL / top-1 / perplexity of each variant against the float32 model on the quant study's text windows."""
    import torch

    import genprobe
    from genprobe.serving.llamacpp.quant_study import (
        AgreementAccumulator,
        QuantStudyConfig,
        study_inputs,
        transformers_logits,
    )

    base = genprobe.load(model_ref)
    cfg = QuantStudyConfig(types=(), prompts=1, text_windows=windows, window_tokens=window_tokens)
    texts = study_inputs(base, cfg)
    reference = [transformers_logits(base, ids) for ids in texts.windows]
    rows: dict[str, Any] = {}
    for name in variants:
        dtype, head = VARIANTS[name]
        model = genprobe.load(model_ref, weight_dtype=getattr(torch, dtype), narrow_output=head)
        acc = AgreementAccumulator()
        for ref, ids in zip(reference, texts.windows, strict=True):
            acc.add(ref, np.asarray(transformers_logits(model, ids), dtype=np.float32), ids)
        rows[name] = json_safe(acc.result())
    return {"model": model_ref, "text": texts.text_source, "windows": windows, "window_tokens": window_tokens} | {
        "variants": rows
    }


def main(argv: list[str] | None = None) -> int:
    """Run it; with ``--json`` stdout holds the JSON alone (``genprobe._io.json_stdout``: anything else goes to
    stderr)."""
    from genprobe._io import json_stdout

    with json_stdout("--json" in (sys.argv[1:] if argv is None else argv)) as out:
        return _main(argv, out)


def _main(argv: list[str] | None, out: Any) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="smollm2", help="a fetched name or a Llama-family directory")
    ap.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["int8", "int8-head"])
    ap.add_argument("--text-windows", type=int, default=16, help="windows of real text (as quant-compare)")
    ap.add_argument("--window-tokens", type=int, default=128, help="tokens per window (as quant-compare)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = ap.parse_args(argv)
    doc = measure(args.model, args.variants, args.text_windows, args.window_tokens)
    if args.json:
        import json

        out.write(json.dumps(doc, indent=1) + "\n")
        return 0
    print(f"{doc['model']}: {doc['windows']} windows of {doc['window_tokens']} tokens ({doc['text']})")
    print("variant        KL mean    KL p99     top-1   perplexity (float32)")
    for name, r in doc["variants"].items():
        ppl = f"{r['perplexity']:.3f} ({r['reference_perplexity']:.3f})"
        print(f"{name:<14} {r['kl_mean']:.2e}  {r['kl_p99']:.2e}  {r['top1_agreement']:.3f}   {ppl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
