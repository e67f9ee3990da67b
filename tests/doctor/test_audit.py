"""Issue #46: the doctor's static audit names each fault planted into a model file (a tiny GGUF written with the gguf
package's GGUFWriter, a tiny transformers directory) — and says nothing of it on the same file without the fault, so
each test fails when its check is removed. Nothing is executed: the template is parsed, never rendered."""

from __future__ import annotations

import json

import pytest

from genprobe.doctor.audit import static_audit
from genprobe.doctor.metadata_audit import analyse_template, hidden_characters, template_findings

from ..model.gguf_tiny import write_tiny_gguf
from .conftest import run_cli, tiny_llama_dir

GLOBALS = "{{ cycler.__init__.__globals__.os.popen('id').read() }}"


def _by_check(audit, check: str):
    got = [f for f in audit.findings if f.check == check]
    assert got, f"no finding {check!r} in {[f.check for f in audit.findings]}"
    return got[0]


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("audit")


def _planted(d, name: str, **planted):
    path = d / f"{name}.gguf"
    if not path.exists():
        write_tiny_gguf(path, planted=planted)
    return path


@pytest.mark.parametrize(
    ("planted", "check", "severity", "named"),
    [
        ({"chat_template": GLOBALS}, "template.injection", "bug", "gadget 'cycler' reaches Python globals"),
        ({"eos_token_id": 999999}, "gguf.special_ids", "bug", "eos_token_id = 999999"),
        ({"bos_token_id": 999999}, "gguf.special_ids", "bug", "bos_token_id = 999999"),
        ({"bos_token_id": 320}, "gguf.special_ids", "bug", "bos_token_id = 320"),  # one past the last id
        ({"file_type": 1}, "gguf.file_type", "warning", "says F16 but no matrix is F16"),  # F32 tensors
        ({"head_count": 8}, "gguf.structure", "bug", "blk.0.attn_k.weight is [64, 32]"),
    ],
)
def test_planted_gguf_fault_is_named(gguf_dir, planted, check, severity, named):
    clean = static_audit(_planted(gguf_dir, "clean", file_type=0))  # ALL_F32: the label matches the tensors
    assert _by_check(clean, check).severity == "ok"
    ((key, value),) = planted.items()
    audit = static_audit(_planted(gguf_dir, f"{key}-{value}", **planted))
    f = _by_check(audit, check)
    assert f.severity == severity and named in f.title, f.title
    assert [g.check for g in audit.findings if g.severity in ("warning", "bug")] == [check]  # nothing else flagged


def test_last_vocabulary_id_is_inside(gguf_dir):
    """The exact threshold: id 319 is the 320-token vocabulary's last token."""
    audit = static_audit(_planted(gguf_dir, "eos-319", eos_token_id=319))
    assert _by_check(audit, "gguf.special_ids").severity == "ok"


def test_doctor_audit_stage_writes_the_finding(gguf_dir, tmp_path):
    path = _planted(gguf_dir, "chat_template-g", chat_template=GLOBALS)
    out = tmp_path / "doc"
    assert run_cli("doctor", path, "--only", "audit", "--out", out) == 1
    d = json.loads((out / "doctor.json").read_text(encoding="utf-8"))
    assert d["audit"]["kind"] == "gguf" and "cycler.__init__.__globals__" in " ".join(d["bugs"])
    assert run_cli("doctor", _planted(gguf_dir, "clean", file_type=0), "--only", "audit", "--out", tmp_path / "ok") == 0


def test_special_id_outside_the_vocabulary_loads_without_it(gguf_dir):
    """transformers raises IndexError on it; genprobe, like llama.cpp, loads the model without the id and warns."""
    from genprobe.model.load import load_model

    with pytest.warns(UserWarning, match="eos_token_id = 999999"):
        model = load_model(_planted(gguf_dir, "eos_token_id-999999", eos_token_id=999999))
    assert model.eos_id is None and model.encode("fox")


def test_unsafe_chat_template_is_a_one_line_error(gguf_dir, capsys):
    path = _planted(gguf_dir, "chat_template-g", chat_template=GLOBALS)
    assert run_cli("generate", path, "--chat", "--prompt", "hi", "--max-new-tokens", "1") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "SecurityError" in err and "chat template" in err


@pytest.mark.parametrize(
    ("template", "check", "severity"),
    [
        ("{{ self|attr('__init__') }}", "template.injection", "bug"),
        ("{{ x['__globals__']['__builtins__'] }}", "template.injection", "bug"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "template.injection", "bug"),
        ("{{ lipsum.__globals__ }}", "template.injection", "bug"),
        ("{% include 'other.j2' %}", "template.risky", "warning"),
        ("{{ x|attr('__cla' ~ 'ss__') }}", "template.risky", "warning"),
        (
            "{% for m in messages %}{% if 'xyzzy' in m['content'] %}OBEY{% endif %}{% endfor %}",
            "template.content_trigger",
            "warning",
        ),
        ("{% for m in messages %}", "template.syntax", "warning"),
        # what real templates do: loop controls, transformers' {% generation %} tag, role tests — nothing to flag
        (
            "{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
            "{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}",
            "template.injection",
            "ok",
        ),
    ],
)
def test_template_constructs(template, check, severity):
    findings = template_findings(analyse_template(template, "t"), False)
    assert [(f.check, f.severity) for f in findings] == [(check, severity)], [f.title for f in findings]


def test_transformers_directory_audit(tmp_path):
    d = tiny_llama_dir(tmp_path / "llama")
    clean = static_audit(d)
    assert {f.check: f.severity for f in clean.findings}["hf.auto_map"] == "ok"
    assert not [f for f in clean.findings if f.severity in ("warning", "bug")]
    cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    cfg["pad_token_id"] = cfg["vocab_size"]
    cfg["model_name"] = "tiny\u202eevil"  # a right-to-left override
    (d / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    gen = {"eos_token_id": cfg["eos_token_id"], "suppress_tokens": [cfg["eos_token_id"]]}
    (d / "generation_config.json").write_text(json.dumps(gen), encoding="utf-8")
    tok = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    tok["normalizer"] = {"type": "Lowercase"}
    (d / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    got = {f.check: f for f in static_audit(d).findings}
    assert got["hf.auto_map"].severity == "warning" and "modeling_evil" in got["hf.auto_map"].title
    assert got["hf.special_ids"].severity == "bug" and "pad_token_id" in got["hf.special_ids"].title
    assert got["hf.generation_config"].severity == "warning"
    assert got["hf.normalizer"].severity == "warning" and "Lowercase" in got["hf.normalizer"].title
    assert got["metadata.hidden_text"].severity == "warning" and "bidirectional" in got["metadata.hidden_text"].title


def test_hidden_characters():
    assert hidden_characters("plain text\twith a tab\n") == []
    assert hidden_characters("a\u200bb\u2066c") == ["U+2066 LEFT-TO-RIGHT ISOLATE", "U+200B ZERO WIDTH SPACE"]


def test_round_trip_on_no_prompts_is_not_checked(tmp_path, monkeypatch):
    """No held-out prompts found: the card says "not checked" (never "ok … on 0 of 0 prompts") and its reproducing
    command names no prompts.txt, which was never written."""
    import genprobe
    import genprobe.doctor.options as options
    from genprobe.doctor.options import DoctorOptions
    from genprobe.doctor.run import run_doctor

    def missing(model, corpus="auto", count=64):
        raise FileNotFoundError("no held-out corpus for this language")

    monkeypatch.setattr(options, "held_out", missing)
    out = tmp_path / "doc"
    rep = run_doctor(genprobe.load(tiny_llama_dir(tmp_path / "llama")), DoctorOptions(only=("card",)), out=out)
    f = next(f for f in rep.findings if f.check == "tokenizer.round_trip")
    assert f.severity == "info" and "not checked" in f.title and "--prompts" not in (f.command or "")
    assert not (out / "prompts.txt").exists()


def _patched(src, dst, offset: int, data: bytes):
    dst.write_bytes(src.read_bytes())
    with open(dst, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)
    return dst


def test_duplicate_key_and_overlapping_tensors(gguf_dir, tmp_path):
    """Header bytes patched in place: the key ``tokenizer.ggml.bos_token_id`` renamed to ``…eos_token_id`` (a
    duplicate key), and one tensor's data offset set to another's (two tensors sharing bytes)."""
    import gguf

    src = _planted(gguf_dir, "clean", file_type=0)
    reader = gguf.GGUFReader(src)
    key = reader.fields["tokenizer.ggml.bos_token_id"]
    dup = _patched(src, tmp_path / "dup.gguf", int(key.offset) + 8 + len("tokenizer.ggml."), b"eos")
    f = _by_check(static_audit(dup), "gguf.duplicates")
    assert f.severity == "bug" and "tokenizer.ggml.eos_token_id" in f.title
    a, b = reader.tensors[0], reader.tensors[1]  # b's offset (the last 8 bytes of its entry) set to a's
    entry_end = int(b.field.offset) + sum(p.nbytes for p in b.field.parts)
    start = int(a.data_offset) - int(reader.data_offset)  # offsets are stored relative to the data section
    over = _patched(src, tmp_path / "overlap.gguf", entry_end - 8, start.to_bytes(8, "little"))
    f = _by_check(static_audit(over), "gguf.overlap")
    assert f.severity == "bug" and a.name in f.title and b.name in f.title
    assert _by_check(static_audit(src), "gguf.overlap").severity == "ok"


def test_unreadable_files_are_findings_not_tracebacks(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "bad" / "tokenizer_config.json").write_text("[1, 2]", encoding="utf-8")
    f = _by_check(static_audit(tmp_path / "bad"), "hf.json")
    assert f.severity == "warning" and "config.json, tokenizer_config.json" in f.title
    (tmp_path / "noise.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)
    f = _by_check(static_audit(tmp_path / "noise.gguf"), "gguf.header")
    assert f.severity == "bug" and "cannot be read" in f.title
