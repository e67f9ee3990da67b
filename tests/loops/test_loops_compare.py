"""``loops compare``: the command end to end on tiny models, and each piece it is built from.

What must hold: the edit rows run with the patch applied and the model is given back bit for bit
(sha256); a method is also scored by a second model (the judge); the method list is validated; the
breaker-spanning classification, the fluency NLL, the human texts and the best-method rule give the
hand-computed answers.
"""

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from genprobe.cli import main
from genprobe.corpus.inputs import heldout_openings
from genprobe.engine.samplers.stages import XTC
from genprobe.loops.compare_fixes import (
    EDIT,
    EDIT_BEST,
    METHODS,
    NO_LOOP,
    SPANS,
    WITHIN,
    CompareConfig,
    build_methods,
    check_methods,
    choose_best,
    class_rates,
    compare_fixes,
    own_loops,
    unit_class,
)
from genprobe.loops.compare_human import NO_HUMAN, human_texts, read_continuations, score_continuations
from genprobe.loops.patch import EditSpec, finalise, make_patch, patched, save_patch
from genprobe.metrics.degeneracy import measure_loops
from genprobe.model.checkpoint import save_checkpoint
from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT
from genprobe.model.load import Model, load_model

from .conftest import save_tiny_qwen2


@pytest.fixture(autouse=True)
def _single_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tokenizer):
    """A tiny random GPT over the default 1,200-character vocabulary (saved) and a strong random patch for it."""
    root = tmp_path_factory.mktemp("cmp")
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, n_layer=2, n_head=2, d_model=32, d_ff=64, block_size=32)
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    save_checkpoint(root / "gpt", model, tokenizer, {"note": "tiny"})
    torch.manual_seed(1)
    dirs, units = {0: torch.randn(32), 1: torch.randn(32)}, {0: torch.rand(64), 1: torch.rand(64)}
    patch = finalise(model, make_patch(model, EditSpec((0, 1), 32, "subtract", 4.0), dirs, units))
    save_patch(patch, root / "patch")
    return SimpleNamespace(ckpt=root / "gpt", patch=patch, patch_json=root / "patch.json", root=root)


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    """A tiny random Qwen2 with a byte-level BPE (end-of-text id 0), saved as a transformers directory."""
    return save_tiny_qwen2(tmp_path_factory.mktemp("judge") / "qwen")


@pytest.fixture(scope="module")
def openings(tokenizer):
    """Openings of bundled Tang poems outside the default corpus (the tang genre is detected from them)."""
    return heldout_openings(tokenizer, 6)


# ---- the command end to end -----------------------------------------------------------------
def test_compare_command_end_to_end(tiny, judge_dir, tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(
        [
            "loops",
            "compare",
            str(tiny.ckpt),
            "--n",
            "6",
            "--skip",
            "0",
            "--max-new-tokens",
            "16",
            "--batch-size",
            "4",
            "--methods",
            "rep-1.2",
            "dry-lines",
            "contrastive",
            EDIT,
            EDIT_BEST,
            "--patch",
            str(tiny.patch_json),
            "--judge",
            str(judge_dir),
            "--timing-rounds",
            "1",
            "--out",
            str(out),
            "--json",
            "--no-progress",
        ]
    )
    assert rc == 0
    cap = capsys.readouterr()
    summary = json.loads(cap.out)
    assert "| method | degenerate [95% CI]" in cap.err and "best decode-time method" in cap.err
    for name in ("compare.json", "compare-texts.json", "compare.md", "compare.html", "compare.png"):
        assert (out / name).is_file()
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((out / "compare.json").read_text(encoding="utf-8"))
    names = [m["name"] for m in data["methods"]]
    assert names == ["greedy", "rep-1.2", "dry-lines", "contrastive", EDIT, EDIT_BEST]  # greedy added first
    assert data["best"]["name"] in ("rep-1.2", "dry-lines", "contrastive")
    best = next(m for m in data["methods"] if m["name"] == data["best"]["name"])
    combo = data["methods"][-1]
    assert combo["patched"] and combo["sampler"] == best["sampler"]  # the edit with the best sampler, exactly
    for m in data["methods"]:
        assert 1 in m["sampler"]["ban_ids"]  # <unk> banned in every row (the chanting setting)
        assert m["rates"]["n"] == 6 and m["nll_judge"]["model"] == str(judge_dir)
        assert m["nll_judge"]["nll_per_char"] is not None and m["nll_own"]["nll_per_char"] is not None
        assert len(m["samples"]) == 3 and m["cost"]["tokens_per_s"] > 0
    assert data["methods"][0]["cost"]["speed_vs_greedy"] == pytest.approx(1.0)
    assert data["methods"][2]["sampler"]["dry_sequence_breakers"]  # ，。 are in the char vocabulary
    assert data["human"]["genre"] == "tang" and data["human"]["legit"]["reduplication_per100"] is not None
    cal = data["calibration"]  # "degenerate" judged as loops scan judges it: calibrated on held-out Tang poems
    assert cal["source"] == "tang:heldout-poems" and data["config"]["loop"] == cal["settings"]
    assert summary["calibration"] == cal and any(n.startswith("detectors: ") for n in data["notes"])
    assert data["patch"]["reverted"] and data["patch"]["sha256_after"] == load_model(tiny.ckpt).state_sha256()
    html = (out / "compare.html").read_text(encoding="utf-8")
    assert "Which fix for loops?" in html and "weight edit + " in html and "spans a breaker" in html
    assert set(summary["methods"]) == set(names) and summary["files"]["html"] == str(out / "compare.html")
    texts = json.loads((out / "compare-texts.json").read_text(encoding="utf-8"))
    assert len(texts["prompts"]) == 6 and set(texts["texts"]) == set(names)


def test_method_list_is_validated(tiny, capsys):
    with pytest.raises(ValueError, match=r"unknown method\(s\) \['beam'\]"):
        check_methods(["greedy", "beam"], have_patch=False)
    with pytest.raises(ValueError, match="listed twice"):
        check_methods(["dry", "dry"], have_patch=False)
    with pytest.raises(ValueError, match="need a loop patch"):
        check_methods([EDIT], have_patch=False)
    with pytest.raises(ValueError, match="at least one decode-time method"):
        check_methods([EDIT, EDIT_BEST], have_patch=True)
    assert check_methods(["dry"], have_patch=False) == ["greedy", "dry"]
    assert check_methods(None, have_patch=False) == [n for n in METHODS if n not in (EDIT, EDIT_BEST)]
    assert (
        main(["loops", "compare", str(tiny.ckpt), "--methods", "greedy", "nucleus", "--out", str(tiny.root / "x")]) == 2
    )
    err = capsys.readouterr().err
    assert "unknown method(s) ['nucleus']" in err and "dry-lines" in err  # names the valid choices


# ---- the patch is applied for the edit rows and reverted --------------------------------------
def test_patch_is_applied_for_edit_rows_and_reverted(tiny, openings):
    model = load_model(tiny.ckpt)
    before = model.state_sha256()
    cfg = CompareConfig(max_new_tokens=16, batch_size=6, methods=(EDIT,), timing_rounds=1)
    res = compare_fixes(model, openings, cfg, patch=tiny.patch)
    assert model.state_sha256() == before == res.patch.sha256_model == res.patch.sha256_after
    assert res.patch.reverted and res.patch.sha256_patched == tiny.patch.meta["sha256_after"]
    assert res.method(EDIT).texts != res.method("greedy").texts  # the edit really ran on patched weights


def test_patched_block_reverts_on_error(tiny):
    model = load_model(tiny.ckpt)
    before = model.state_sha256()
    with pytest.raises(RuntimeError, match="boom"):
        with patched(model.module, tiny.patch):
            assert model.state_sha256() == tiny.patch.meta["sha256_after"]
            raise RuntimeError("boom")
    assert model.state_sha256() == before


# ---- the judge ------------------------------------------------------------------------------
def test_judge_scores_every_method_and_its_absence_is_said(tiny, judge_dir, openings):
    model, judge = load_model(tiny.ckpt), load_model(judge_dir)
    cfg = CompareConfig(max_new_tokens=16, batch_size=6, methods=("rep-1.2",), timing_rounds=1)
    res = compare_fixes(model, openings, cfg, judge=judge)
    for r in res.methods:
        direct = score_continuations(judge, openings, r.texts)
        assert r.nll_judge.model == str(judge_dir)
        assert r.nll_judge.nll_per_char == pytest.approx(sum(s.nll for s in direct) / sum(s.chars for s in direct))
        assert r.nll_judge.nll_per_char != pytest.approx(r.nll_own.nll_per_char)  # another model, another number
    assert res.human.nll_judge is not None and res.human.nll_judge.texts == len(openings)
    alone = compare_fixes(model, openings, cfg)
    assert all(r.nll_judge is None for r in alone.methods)
    assert any("no judge model" in n for n in alone.notes)


def test_unknown_backend_is_refused(tiny, openings):
    with pytest.raises(ValueError, match="backend 'vllm' is not available.*genprobe"):
        compare_fixes(load_model(tiny.ckpt), openings, backend="vllm")


# ---- fluency --------------------------------------------------------------------------------
def test_score_continuations_equals_the_log_probs_summed_by_hand(tokenizer):
    """Right-padded batches of different lengths give each row's own log-probabilities; a row longer than the
    context is cut to it and its scored characters counted."""
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, n_layer=1, n_head=2, d_model=16, d_ff=32, block_size=16)
    torch.manual_seed(2)
    model = Model.from_module(GPT(cfg).eval(), tokenizer)
    prompts, conts = ["春風", "舉頭望", "春"], ["明月光，", "明月", "眠不覺曉，處處聞啼鳥。夜來風雨聲，花落"]
    scores = score_continuations(model, prompts, conts, batch_size=2)
    for p, c, s in zip(prompts, conts, scores, strict=True):
        ids = tokenizer.encode(p + c)[:16]
        with torch.no_grad():
            logp = F.log_softmax(model.module(torch.tensor([ids]))[0, :-1], dim=-1)
        want = -sum(float(logp[i - 1, ids[i]]) for i in range(len(p), len(ids)))
        assert s.nll == pytest.approx(want, rel=1e-5)
        assert s.chars == len(ids) - len(p) and s.truncated == (len(p) + len(c) > 16)
    assert scores[2].truncated and scores[2].chars == 15
    assert score_continuations(model, ["春"], [None]) == [None]


# ---- DRY and sequence breakers ----------------------------------------------------------------
def test_breaker_classes_hand_built():
    spans = "春風吹" + "，花落盡。春風吹" * 7  # period 8 ("，花落盡。春風吹") holds the breakers
    within = "君不見" * 12  # period 3, no breaker anywhere
    clean = "床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。"
    assert unit_class(spans, measure_loops(spans), "，。") == SPANS
    assert unit_class(within, measure_loops(within), "，。") == WITHIN
    assert unit_class(clean, measure_loops(clean), "，。") == NO_LOOP
    # relative to breakers that never occur in poems (llama.cpp's defaults) the same cycle spans none
    assert unit_class(spans, measure_loops(spans), '\n:"*') == WITHIN
    rates = {c.cls: c for c in class_rates([SPANS, SPANS, WITHIN, NO_LOOP], [True, False, True, False])}
    assert (rates[SPANS].degenerate, rates[SPANS].n, rates[SPANS].rate) == (1, 2, 0.5)
    assert (rates[WITHIN].rate, rates[NO_LOOP].rate) == (1.0, 0.0)
    empty = {c.cls: c for c in class_rates([], [])}
    assert empty[SPANS].rate is None and empty[SPANS].n == 0
    own = own_loops([spans, within, clean], [measure_loops(t) for t in (spans, within, clean)], "，。")
    assert (own.loops, own.spanning, own.spanning_share) == (2, 1, 0.5)


def test_build_methods_use_the_genres_breakers(tokenizer):
    methods = {m.name: m for m in build_methods(["greedy", "dry", "dry-lines", "xtc"], tokenizer, [1], "tang")}
    comma, stop = tokenizer.encode("，")[0], tokenizer.encode("。")[0]
    assert set(methods["dry-lines"].sampler.dry_sequence_breakers) == {(comma,), (stop,)}
    assert methods["dry"].sampler.dry_multiplier == 0.8 and methods["dry"].sampler.dry_allowed_length == 2
    assert XTC.active(methods["xtc"].sampler) and not methods["xtc"].sampler.greedy
    assert all(m.sampler.ban_ids == (1,) for m in methods.values())


# ---- human texts ----------------------------------------------------------------------------
def test_human_texts_from_the_corpus_a_jsonl_file_or_none(tmp_path, openings):
    h = human_texts(openings, None)
    assert h.genre == "tang" and None not in h.poems
    assert all(p.startswith(o) and len(p) > len(o) for p, o in zip(h.poems, openings, strict=True))
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "Once upon", "continuation": " a time"}\n\n{"prompt": "The end"}\n', encoding="utf-8")
    conts = read_continuations(f)
    assert conts == [" a time", None]
    t = human_texts(["Once upon", "The end"], conts)
    assert t.genre == "text" and t.poems == ["Once upon a time", None] and "continuation" in t.source
    none = human_texts(["Once upon", "The end"], None)
    assert none.poems == [None, None] and none.reason == NO_HUMAN
    (tmp_path / "plain.txt").write_text("a\nb\n", encoding="utf-8")
    assert read_continuations(tmp_path / "plain.txt") is None
    with pytest.raises(ValueError, match="genre must be one of"):
        human_texts(openings, None, "prose")


# ---- the best-method rule -------------------------------------------------------------------
def _fake(name, degenerate, speed, nll, redup, parallel=1.0, patched=False):
    return SimpleNamespace(
        method=SimpleNamespace(name=name, patched=patched),
        rates=SimpleNamespace(degenerate_rate=degenerate),
        cost=SimpleNamespace(speed_vs_greedy=speed),
        nll_own=SimpleNamespace(nll_per_char=nll),
        nll_judge=SimpleNamespace(nll_per_char=nll),
        legit=SimpleNamespace(reduplication_per100=redup, parallel_per100=parallel, repeated_ngram_rate=None),
    )


def test_best_rule_limits_and_fallback():
    human = SimpleNamespace(
        genre="tang",
        nll_judge=SimpleNamespace(nll_per_char=4.0),
        nll_own=None,
        reason=None,
        legit=SimpleNamespace(reduplication_per100=1.0, parallel_per100=1.0),
    )
    cfg = CompareConfig()
    results = [
        _fake("greedy", 0.5, 1.0, 2.0, 1.0),
        _fake("slow", 0.0, 0.2, 3.0, 1.0),
        _fake("garbled", 0.0, 1.0, 4.5, 1.0),
        _fake("flat", 0.0, 1.0, 3.0, 0.4),
        _fake("ok", 0.05, 0.9, 3.5, 0.8),
        _fake("edit", 0.0, 1.0, 2.0, 1.0, patched=True),
    ]
    best = choose_best(results, human, cfg)
    assert best.name == "ok" and best.acceptable and best.nll_limit == 4.0
    why = {c.name: c.reasons for c in best.candidates}
    assert set(why) == {"slow", "garbled", "flat", "ok"}  # greedy and the edit are not candidates
    assert "speed 0.20x greedy < 0.25x" in why["slow"][0] and "NLL 4.500 > human 4.000" in why["garbled"][0]
    assert "keeps 40% < 50%" in why["flat"][0]
    fallback = choose_best(results[:4], human, cfg)
    assert not fallback.acceptable and fallback.name in ("slow", "garbled", "flat")
    assert fallback.name == "slow"  # lowest degenerate rate; ties -> lower NLL (3.0 beats 4.5, slow before flat)


def test_compare_on_a_transformers_model_with_human_continuations(judge_dir, tiny, tmp_path):
    """The user's own model (subword, end token) and prompts file: end token banned in every row, the edit applied
    to the transformers module and reverted, the genre-free measure (repeated n-grams) from the file's
    continuations, and the char GPT as the judge."""
    from genprobe.model.arch import mlp_sites

    model = load_model(judge_dir)
    sites = mlp_sites(model.module)
    torch.manual_seed(1)
    dirs = {i: torch.randn(s.d_model) for i, s in enumerate(sites)}
    units = {i: torch.rand(s.d_ff) for i, s in enumerate(sites)}
    patch = finalise(model.module, make_patch(model.module, EditSpec((0, 1), 16, "subtract", 4.0), dirs, units))
    prompts = ["Once upon a time", "The cat sat", "It was late"]
    conts = [" there was a cat and a cat and a dog.", " on the mat.", None]
    cfg = CompareConfig(max_new_tokens=16, batch_size=3, methods=("dry-lines", "contrastive", EDIT), timing_rounds=1)
    before = model.state_sha256()
    res = compare_fixes(model, prompts, cfg, patch=patch, judge=load_model(tiny.ckpt), continuations=conts)
    assert model.state_sha256() == before and res.patch.reverted
    assert res.human.genre == "text" and res.human.n == 2 and "continuation" in res.human.source
    assert res.human.legit.repeated_ngram_rate is not None and res.breakers == "\n.!?"
    for r in res.methods:
        assert 0 in r.method.sampler.ban_ids  # the end token is banned in every row
        assert r.rates.n == 3 and r.nll_judge is not None and r.nll_judge.model == str(tiny.ckpt)
    assert res.method(EDIT).texts != res.method("greedy").texts


def test_methods_run_as_the_named_engine_runs_them():
    """--engine / CompareConfig.engine: each fix with that engine's defaults under its own parameters, its order and
    arithmetic (SamplerConfig.preset) — llama.cpp's repeat penalty over its last 64 tokens with top-k 40 / top-p 0.95 /
    min-p 0.05 / temperature 0.8 on, transformers' sampling with top-k 50; genprobe's plain chain without it."""
    plain = {m.name: m.sampler for m in build_methods(["sample", "rep-1.2"], None, [0], "text")}
    cpp = {m.name: m.sampler for m in build_methods(["sample", "rep-1.2"], None, [0], "text", engine="llama.cpp")}
    hf = {m.name: m.sampler for m in build_methods(["sample"], None, [0], "text", engine="hf")}
    assert plain["rep-1.2"].penalty_last_n is None and plain["sample"].top_k is None
    rep = cpp["rep-1.2"]
    assert (rep.repetition_penalty, rep.penalty_last_n, rep.engine, rep.order) == (1.2, 64, "llama.cpp", "llama.cpp")
    assert (rep.top_k, rep.top_p, rep.min_p, rep.ban_ids) == (40, 0.95, 0.05, (0,))
    assert cpp["sample"].temperature == 0.8 and hf["sample"].top_k == 50 and hf["sample"].engine == "hf"
    assert CompareConfig(engine="vllm").engine == "vllm"
