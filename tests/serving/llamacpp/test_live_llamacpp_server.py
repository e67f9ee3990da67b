"""The live verifier against llama-cpp-python's own OpenAI-compatible server (``python -m llama_cpp.server``, the
``llama-cpp-python[server]`` extra the test setup installs), started on a free port of 127.0.0.1 with a tiny
float32 Llama + byte-level BPE GGUF: the verifier detects the server, and the honest server passes every phase it
can check (the others say why they were not checked)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "model"))
from gguf_tiny import write_tiny_gguf  # noqa: E402
from models import skip_without_llama_cpp  # noqa: E402

from genprobe.serving.judge import NOT_CHECKED  # noqa: E402
from genprobe.serving.verify import Settings  # noqa: E402

STARTUP_S = 120  # the server's imports and the model load, on a loaded 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    skip_without_llama_cpp()
    gguf = tmp_path_factory.mktemp("bpe-gguf") / "tiny-bpe.gguf"
    write_tiny_gguf(gguf)
    port = _free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--n_ctx", "0", "--n_threads", "1", "--logits_all", "true", "--seed", "0"]
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + STARTUP_S
    try:
        while True:
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"llama_cpp.server did not start (exit {proc.poll()}): {log.read_text()[-2000:]}")
                time.sleep(0.5)
        yield gguf, url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_llama_cpp_pythons_server_passes_what_it_can_be_checked_on(llama_server):
    from genprobe.model.load import load_model
    from genprobe.serving.endpoint import EndpointBackend, HttpSettings, piece_table
    from genprobe.serving.verify import verify_backend

    gguf, url = llama_server
    reference = load_model(gguf)
    http = HttpSettings(timeout_s=60.0, retries=1, backoff_s=0.05)
    backend = EndpointBackend(url, http, pieces=piece_table(reference))
    assert backend.capabilities.server == "llama-cpp-python"
    report = verify_backend(backend, reference, "tiny", Settings(requests=8, concurrency=4, steps=8), url=url)
    by = {p.phase: p for p in report.phases}
    checked = [p for p in report.phases if p.verdict != NOT_CHECKED]
    assert by["greedy"].verdict == "pass" and by["greedy"].top1_agreement == 1.0, by["greedy"]
    assert {"greedy", "batch", "limits"} <= {p.phase for p in checked}, report.phases
    assert all(p.verdict == "pass" for p in checked), [(p.phase, p.verdict, p.note) for p in checked]
    assert all(p.note for p in report.phases if p.verdict == NOT_CHECKED)  # each says why
