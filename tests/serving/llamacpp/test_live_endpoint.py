"""The live verifier (issue #47) on a planted faulty server in front of a real llama.cpp engine: the honest server
passes every phase it can check, each planted fault is caught at defaults with a margin of at least 3x the pass line,
and bad servers are one-line errors (see live_server.py for the app and its faults)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "model"))
from gguf_tiny import CHAT_TEMPLATE  # noqa: E402
from live_server import TinyServer  # noqa: E402
from models import tiny_llama_gguf  # noqa: E402

from genprobe.serving.judge import GAP_PASS, NOT_CHECKED  # noqa: E402
from genprobe.serving.verify import Settings  # noqa: E402
from genprobe.verify.compare import Thresholds  # noqa: E402


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    from genprobe.model.load import load_model

    hf, gguf = tiny_llama_gguf(tmp_path_factory.getbasetemp() / "llamacpp-tiny")
    model = load_model(hf)
    model.tokenizer.hf.chat_template = CHAT_TEMPLATE
    return model, gguf


@pytest.fixture(scope="module")
def server(reference):
    from genprobe.serving.llamacpp.engine import LlamaCppModel

    model, gguf = reference
    with (
        LlamaCppModel(gguf, n_ctx=256, kv_type="f32") as engine,
        TinyServer(engine, model.tokenizer.hf, CHAT_TEMPLATE) as srv,
    ):
        yield srv


def verify(server, reference, fault="", settings=None, url=None, timeout=60.0):
    from genprobe.serving.endpoint import EndpointBackend, HttpSettings
    from genprobe.serving.verify import verify_backend

    server.set_fault(fault)
    model, _ = reference
    backend = EndpointBackend(url or server.url, HttpSettings(timeout_s=timeout, retries=1, backoff_s=0.05))
    return verify_backend(backend, model, "tiny", settings or Settings(), url=server.url)


def phases(report):
    return {p.phase: p for p in report.phases}


def test_the_honest_server_passes_at_defaults(server, reference):
    """64 requests, 8 in flight: every phase a server can be checked on passed (the server is llama.cpp with float32
    K/V); the ones it cannot be checked on (it says no cache block, no step budget) say why."""
    report = verify(server, reference)
    got = phases(report)
    assert report.server == "vllm"
    checked = {name: p.verdict for name, p in got.items() if p.verdict != NOT_CHECKED}
    assert checked == dict.fromkeys(checked, "pass"), report
    assert {"prompt", "greedy", "batch", "prefix", "diverge_boundary", "seed", "limits", "chat"} <= set(checked)
    assert all(got[name].note for name in set(got) - set(checked))
    assert got["batch"].requests == 64 and got["batch"].divergence_rate == 0.0
    assert got["greedy"].top1_agreement == 1.0 and got["greedy"].topk_agreement == 1.0
    assert got["greedy"].max_abs_dlogp < Thresholds().noise / 3  # the pass line, with the same 3x margin


PASS_LINE = Thresholds().noise  # the absolute scale's pass line on max |Δ log p|
FEWER = Settings(requests=16)  # the default thresholds and concurrency; fewer requests (seconds each)


@pytest.mark.parametrize(
    "fault, phase, settings",
    [
        ("shift", "greedy", FEWER),
        ("wrong_token", "greedy", FEWER),
        ("stale_prefix", "prefix", FEWER),
        ("nondeterminism", "batch", FEWER),
        ("template", "chat", FEWER),
    ],
)
def test_each_planted_fault_is_caught(server, reference, fault, phase, settings):
    report = verify(server, reference, fault, settings)
    p = phases(report)[phase]
    assert p.verdict == "bug", p
    if p.judged_on == "reference":
        assert p.max_abs_dlogp >= 3 * PASS_LINE and p.max_abs_dlogp > Thresholds().bug, p
    elif p.judged_on == "gap":
        assert p.gap_ratio >= 3 * GAP_PASS, p
    else:
        assert p.note.startswith("the system turn is missing; first differing token 8: server 'u', template 's'"), p
    assert report.verdict == "bug"


def test_bad_servers_are_one_line_errors(server, reference):
    from genprobe.serving.endpoint import EndpointError

    with pytest.raises(EndpointError, match=r"/v1/completions answered 500: .*planted.* \(2 tries\)$"):
        verify(server, reference, "error500", FEWER)
    with pytest.raises(EndpointError, match=r"/v1/models timed out after 0.5 s \(2 tries\)$"):
        verify(server, reference, "hang", FEWER, timeout=0.5)
    with pytest.raises(ValueError, match=r"returned no log-probabilities: nothing to compare$"):
        verify(server, reference, "no_logprobs", FEWER)
    with pytest.raises(EndpointError, match=r"Connection refused \(2 tries\)$"):
        verify(server, reference, "", FEWER, url="http://127.0.0.1:9/v1")


def test_a_server_of_another_model_is_refused(server, tmp_path):
    """The reference's tokenizer splits the probe string differently: refused before anything is compared."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "matrix"))
    from command_cells import save_tiny_llama

    from genprobe.model.load import load_model

    other = load_model(save_tiny_llama(tmp_path)[0])
    with pytest.raises(ValueError, match=r"tokenizes a probe string differently .* it serves another model$"):
        verify(server, (other, None), "", FEWER)


def test_the_command_line(server, reference, tmp_path, capsys):
    """``genprobe verify-serving URL --reference MODEL``: the table, --json, --out; a bad server writes nothing."""
    import json

    from genprobe.cli import main

    model, _ = reference
    server.set_fault("")
    out = tmp_path / "out"
    ref = str(model.source)
    rc = main(["verify-serving", server.url, "--reference", ref, "--requests", "8", "--out", str(out), "--json"])
    got = capsys.readouterr()
    assert rc == 0, got.err
    summary = json.loads(got.out)
    assert summary["verdict"] == "pass" and summary["exit_status"] == 0
    assert json.loads((out / "verify-serving.json").read_text()) == summary
    assert "batch" in got.err and "vllm server" in got.err
    server.set_fault("shift")
    assert main(["verify-serving", server.url, "--reference", ref, "--requests", "8"]) == 1
    server.set_fault("error500")
    capsys.readouterr()
    bad = tmp_path / "bad"
    assert main(["verify-serving", server.url, "--reference", ref, "--requests", "8", "--out", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert [line for line in err if "error" in line] == err[-1:], err  # progress lines, then one error line
    assert err[-1].startswith("genprobe verify-serving: error: http://127.0.0.1:"), err
    assert err[-1].endswith('/v1/completions answered 500: {"error": "planted"} (3 tries)'), err
    assert not bad.exists()
    assert main(["verify-serving", server.url]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("give --reference MODEL: the weights the server should serve (what it is compared with)")
    )


def test_loops_scan_through_the_endpoint(server, reference, tmp_path, capsys):
    """``genprobe loops scan URL --reference MODEL``: the scan of what the server generates (end-of-text banned
    through logit_bias) gives the tokens genprobe's own engine gives on the reference (greedy, float32)."""
    import json

    from genprobe.cli import main

    model, _ = reference
    server.set_fault("")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the quick brown fox\nthe cat sat on the mat\na b c d e\n")
    common = ["--prompts", str(prompts), "--max-new-tokens", "16", "--setting", "greedy", "--no-calibrate"]
    records = {}
    for where in (server.url, str(model.source)):
        out = tmp_path / ("served" if where == server.url else "engine")
        extra = ["--reference", str(model.source)] if where == server.url else []
        assert main(["loops", "scan", where, *common, *extra, "--out", str(out), "--no-progress"]) == 0
        scan = json.loads((out / "scan.json").read_text())
        records[out.name] = [r["tokens"] for r in scan["scans"]["greedy"]["records"]]
        if where == server.url:
            assert (scan["backend"], scan["server"], scan["model"]) == ("endpoint", "vllm", "tiny")
    assert records["served"] == records["engine"] and len(records["served"]) == 3
    capsys.readouterr()


def test_doctor_gains_the_deployment_section(server, reference):
    """``genprobe doctor MODEL --serving URL``: the live verifier's verdict is a finding with the reproducing
    command; an unusable server is the finding's reason, not the doctor's failure."""
    from genprobe.doctor.inference import _serving, _serving_findings
    from genprobe.doctor.options import DoctorOptions

    model, _ = reference
    for fault, severity in (("shift", "bug"), ("error500", "warning")):
        server.set_fault(fault)
        (finding,) = _serving_findings(_serving(model, DoctorOptions(serving=server.url, quick=True), print), "M")
        assert (finding.check, finding.severity) == ("serving.endpoint", severity), finding
        assert finding.command == f"genprobe verify-serving {server.url} --reference M"
    assert "answered 500" in finding.title
    with pytest.raises(ValueError, match="serving must be one of"):
        DoctorOptions(serving="tgi")
