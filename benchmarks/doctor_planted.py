"""Planted copies of SmolLM2 for docs/doctor.md's side-by-side table (issue #46): one fault each.

    python benchmarks/doctor_planted.py OUT_DIR        # after `genprobe fetch smollm2`

GGUF faults are written into copies of the fetched GGUF file by patching its header in place (same byte length:
a scalar rewritten, the chat template replaced and padded with spaces), so that everything else is byte-identical.
Quality faults are copies of the converted float directory: one MLP down-projection scaled, and a config whose
RoPE base is not the one the weights were trained with.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

TEMPLATE = "{{ cycler.__init__.__globals__.os.popen('id').read() }}"


def _value_offset(field, key: str) -> int:
    """Where a metadata value starts: after the key (u64 length + bytes) and its u32 type."""
    return int(field.offset) + 8 + len(key.encode()) + 4


def plant_gguf(src: Path, out: Path) -> list[Path]:
    """The GGUF faults of the issue's table, each in its own copy of ``src``."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    plants = {
        "template-globals": ("tokenizer.chat_template", TEMPLATE),
        "eos-999999": ("tokenizer.ggml.eos_token_id", 999999),
        "bos-999999": ("tokenizer.ggml.bos_token_id", 999999),
        "filetype-f16": ("general.file_type", int(gguf.LlamaFileType.MOSTLY_F16)),
        "heads-8": (f"{arch}.attention.head_count", 8),
    }
    written = []
    for name, (key, value) in plants.items():
        dst = out / f"{name}.gguf"
        shutil.copyfile(src, dst)
        field = reader.fields[key]
        with open(dst, "r+b") as fh:
            fh.seek(_value_offset(field, key))
            if isinstance(value, str):
                old, new = bytes(field.parts[-1]), value.encode()
                fh.seek(8, 1)  # past the string's length, which stays
                fh.write(new + b" " * (len(old) - len(new)))
            else:
                fh.write(struct.pack("<I", value))
        written.append(dst)
    return written


def plant_quality(src: Path, out: Path, layer: int = 5, scale: float = 10.0, rope_theta: float = 10000.0) -> list[Path]:
    """Copies of the converted directory ``src``: layer ``layer``'s down-projection × ``scale``; RoPE base changed."""
    from safetensors.torch import load_file, save_file

    mlp, rope = out / "smollm2-mlp-scaled", out / "smollm2-rope-base"
    for d in (mlp, rope):
        shutil.copytree(src, d, dirs_exist_ok=True, ignore=shutil.ignore_patterns("model.safetensors", "genprobe_*"))
    tensors = load_file(src / "model.safetensors")
    tensors[f"model.layers.{layer}.mlp.down_proj.weight"] *= scale
    save_file(tensors, mlp / "model.safetensors", metadata={"format": "pt"})
    (rope / "model.safetensors").unlink(missing_ok=True)
    (rope / "model.safetensors").symlink_to(src / "model.safetensors")
    cfg = json.loads((rope / "config.json").read_text(encoding="utf-8"))
    cfg["rope_parameters"]["rope_theta"] = rope_theta
    (rope / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    return [mlp, rope]


def main() -> None:
    from genprobe.model.catalog import resolve_name
    from genprobe.model.gguf import read_sidecar

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "planted")
    out.mkdir(parents=True, exist_ok=True)
    converted = resolve_name("smollm2")
    gguf_file = Path((read_sidecar(converted) or {})["path"])
    for p in plant_gguf(gguf_file, out) + plant_quality(converted, out):
        print(p)


if __name__ == "__main__":
    main()
