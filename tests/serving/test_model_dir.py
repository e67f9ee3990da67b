"""verify-serving and loops scan --backend vllm take every MODEL form the other commands take (no vLLM needed)."""

from __future__ import annotations

import pytest

from genprobe.model.errors import ModelLoadError
from genprobe.serving.engine import served_model


def test_a_catalog_name_resolves_to_its_fetched_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("GENPROBE_CACHE_DIR", str(tmp_path))  # nothing fetched here
    with pytest.raises(ModelLoadError, match="genprobe fetch smollm2"):
        served_model("smollm2")
    with pytest.raises(FileNotFoundError, match="no such model directory: not-a-model"):
        served_model("not-a-model")


def test_a_gguf_file_is_refused_with_the_conversion_command(tmp_path):
    f = tmp_path / "m.Q4_0.gguf"
    f.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="genprobe convert-gguf"):
        served_model(f)
    with pytest.raises(ValueError, match="genprobe convert-gguf"):
        served_model(tmp_path)  # a directory holding only a GGUF file
