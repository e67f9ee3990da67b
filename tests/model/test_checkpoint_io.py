"""Checkpoints: round trip, clear refusals of bad input, atomic saves, and no unpickling on load."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch

from genprobe.corpus.tokenizer import CharTokenizer
from genprobe.model.checkpoint import (
    META,
    PREV_WEIGHTS,
    WEIGHTS,
    CheckpointError,
    is_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT

TEXT = "春眠不覺曉處處聞啼鳥夜來風雨聲花落知多少床前明月光疑是地上霜舉頭望明月低頭思故鄉"


def _tok(text: str = TEXT, n: int = 40) -> CharTokenizer:
    return CharTokenizer.from_text(text, n)


def _model(tok: CharTokenizer, seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=16, d_ff=32, block_size=16, **kw)
    return GPT(cfg).eval()


def _same_weights(a: GPT, b: GPT) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture
def saved(tmp_path):
    tok = _tok()
    m = _model(tok)
    d = save_checkpoint(tmp_path / "ck", m, tok, {"note": "first"})
    return d, m, tok


def test_round_trip_is_exact(saved):
    d, m, tok = saved
    m2, tok2, meta = load_checkpoint(d, expect_tokenizer=tok)
    assert _same_weights(m, m2)
    assert tok2.fingerprint == tok.fingerprint
    assert meta["summary"] == {"note": "first"}
    assert not (d / PREV_WEIGHTS).exists()  # the rollback link is gone after a completed save
    assert is_checkpoint(d)


def test_truncated_weights_file_is_refused(saved):
    d, _, _ = saved
    data = (d / WEIGHTS).read_bytes()
    (d / WEIGHTS).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(d)


def test_truncated_weights_without_recorded_hash_is_refused(saved):
    # Even with the sha256 removed from the JSON, the safetensors parser's failure is reported clearly.
    d, _, _ = saved
    meta = json.loads((d / META).read_text(encoding="utf-8"))
    del meta["weights_sha256"]
    (d / META).write_text(json.dumps(meta), encoding="utf-8")
    data = (d / WEIGHTS).read_bytes()
    (d / WEIGHTS).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(d)


def test_mismatched_vocabulary_is_refused(saved):
    d, _, tok = saved
    other = CharTokenizer(list(reversed(tok.chars)))  # same size, different id→char mapping
    assert other.vocab_size == tok.vocab_size
    with pytest.raises(CheckpointError, match="vocabulary mismatch"):
        load_checkpoint(d, expect_tokenizer=other)


def test_config_weights_shape_mismatch_is_refused(saved):
    d, _, _ = saved
    meta = json.loads((d / META).read_text(encoding="utf-8"))
    meta["config"]["d_ff"] = 64  # weights were saved with d_ff = 32
    (d / META).write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"tensor h\.0\.mlp\.c_fc\.\w+ has shape"):
        load_checkpoint(d)


def test_config_vocab_size_disagreeing_with_vocabulary_is_refused(saved):
    d, _, _ = saved
    meta = json.loads((d / META).read_text(encoding="utf-8"))
    meta["config"]["vocab_size"] += 1
    (d / META).write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(CheckpointError, match="vocab_size"):
        load_checkpoint(d)


def test_missing_directory_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")


def test_not_a_checkpoint_directory_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    with pytest.raises(CheckpointError, match=f"not a genprobe checkpoint: {META} is missing"):
        load_checkpoint(tmp_path)


def test_missing_weights_file_is_refused(saved):
    d, _, _ = saved
    (d / WEIGHTS).unlink()
    with pytest.raises(CheckpointError, match="weights file missing"):
        load_checkpoint(d)


def test_saving_with_a_foreign_tokenizer_is_refused(tmp_path, saved):
    _, m, _ = saved
    with pytest.raises(CheckpointError, match="vocab_size"):
        save_checkpoint(tmp_path / "x", m, _tok(n=5))


def _snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("fail_on_call", [1, 2])
def test_interrupted_save_leaves_old_checkpoint_bit_identical(saved, monkeypatch, fail_on_call):
    """Call 1 = the weights rename, call 2 = the JSON rename (the commit point): both must leave the old pair."""
    d, m_old, tok = saved
    before = _snapshot(d)
    real_replace = os.replace
    calls = {"n": 0}

    def flaky_replace(src, dst):
        calls["n"] += 1
        if calls["n"] == fail_on_call:
            raise OSError("simulated crash during save")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", flaky_replace)
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(d, _model(tok, seed=1), tok, {"note": "second"})
    monkeypatch.undo()
    assert calls["n"] >= fail_on_call
    assert _snapshot(d) == before  # no temp files left, old files untouched byte for byte
    m_loaded, _, meta = load_checkpoint(d, expect_tokenizer=tok)
    assert meta["summary"] == {"note": "first"}
    assert _same_weights(m_loaded, m_old)


def test_hard_crash_between_renames_still_loads_old_checkpoint(saved):
    """A process killed after the weights rename (no rollback ran) leaves new weights + old JSON."""
    d, m_old, tok = saved
    # Emulate the on-disk state of a hard crash: old JSON, new weights, previous weights kept as PREV.
    os.link(d / WEIGHTS, d / PREV_WEIGHTS)
    new = _model(tok, seed=2)
    tmp_dir = d.parent / "other"
    save_checkpoint(tmp_dir, new, tok)
    os.replace(tmp_dir / WEIGHTS, d / WEIGHTS)
    m_loaded, _, meta = load_checkpoint(d)
    assert _same_weights(m_loaded, m_old)
    # Without the kept previous weights the torn pair is detected, never silently loaded.
    (d / PREV_WEIGHTS).unlink()
    with pytest.raises(CheckpointError, match="does not match the recorded"):
        load_checkpoint(d)


class _Bomb:
    """Unpickling this writes a marker file: proof that something unpickled."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_loading_never_unpickles(saved, tmp_path, monkeypatch):
    d, m, _ = saved
    marker = tmp_path / "UNPICKLED"
    for name in ("pytorch_model.bin", "model.pt", "weights.pkl"):
        (d / name).write_bytes(pickle.dumps(_Bomb(str(marker))))

    def forbidden(*a, **k):
        raise AssertionError("checkpoint loading must never unpickle")

    monkeypatch.setattr(torch, "load", forbidden)
    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    m2, _, _ = load_checkpoint(d)
    assert _same_weights(m, m2)
    assert not marker.exists()
    # The pickles are there and would fire if loaded: the test's bomb is real.
    monkeypatch.undo()
    pickle.loads((d / "pytorch_model.bin").read_bytes()).close()
    assert marker.exists()


def test_save_after_a_crashed_save_keeps_committed_weights_recoverable(saved, monkeypatch):
    """Crash 1 leaves (old JSON, new weights, PREV=old); a second save crashing too must not lose PREV."""
    d, m_old, tok = saved
    os.link(d / WEIGHTS, d / PREV_WEIGHTS)
    save_checkpoint(d.parent / "other", _model(tok, seed=2), tok)
    os.replace(d.parent / "other" / WEIGHTS, d / WEIGHTS)  # state after hard crash 1
    real_replace = os.replace

    def crash_at_commit(src, dst):
        if str(dst).endswith(META):
            raise OSError("simulated crash during save")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_at_commit)
    with pytest.raises(OSError):
        save_checkpoint(d, _model(tok, seed=3), tok)
    monkeypatch.undo()
    m_loaded, _, _ = load_checkpoint(d)
    assert _same_weights(m_loaded, m_old)
