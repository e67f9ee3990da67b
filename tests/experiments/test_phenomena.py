"""The chapter's phenomena on any model (genprobe.experiments.phenomena): exact numbers on hand-built models.

A "copy" GPT (one-hot embeddings, every block's output zeroed) predicts the token it reads, with a probability
known in closed form, so teacher forcing, free running, the shadow and the divergence have exact expected values.
The order trap runs on a hand-made distribution with ties; a tiny random Llama checks the subword path.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from genprobe._io import json_safe
from genprobe.corpus.inputs import corpus_of
from genprobe.corpus.tokenizer import CharTokenizer
from genprobe.experiments.phenomena import (
    PhenomenaConfig,
    _Scores,
    chapter_phenomena,
    distribution,
)
from genprobe.model.config import GPTConfig
from genprobe.model.gpt import GPT
from genprobe.model.load import Model, SubwordTokenizer
from genprobe.report.claims import markdown_table, phenomena_claims

ALPHABET = list("abcdef")  # ids 2..7 after <pad>, <unk>
SCALE = 1.0  # one-hot embedding scale: the copy probability stays well below 1, so sampling varies


def copy_gpt(block_size: int = 32) -> Model:
    """A GPT whose next-token logits are c·sqrt(d-1) on the token it reads and -c/sqrt(d-1) elsewhere."""
    tok = CharTokenizer(ALPHABET)
    V = tok.vocab_size
    gpt = GPT(GPTConfig(vocab_size=V, n_layer=1, n_head=2, d_model=V, d_ff=8, block_size=block_size)).eval()
    with torch.no_grad():
        for p in gpt.parameters():
            p.zero_()
        gpt.wte.weight.copy_(SCALE * torch.eye(V))  # tied: the head reads the same one-hot rows
        gpt.ln_f.weight.fill_(1.0)
        for block in gpt.h:
            block.ln_1.weight.fill_(1.0)
            block.ln_2.weight.fill_(1.0)
    return Model.from_module(gpt, tok)


def copy_nll(V: int, banned: int = 0) -> tuple[float, float]:
    """(NLL of the copied token, NLL of any other token) of :func:`copy_gpt`: the final LayerNorm turns c·e_i into
    (e_i − 1/V)·c/σ, σ² = c²(V−1)/V² + eps, and the tied head reads it back, so the logit gap is c/σ. ``banned``
    ids (never the copied one) are removed from the distribution."""
    gap = SCALE / math.sqrt(SCALE**2 * (V - 1) / V**2 + 1e-5)
    z = math.log1p((V - 1 - banned) * math.exp(-gap))
    return z, gap + z


def small_cfg(**kw) -> PhenomenaConfig:
    base = dict(
        max_new_tokens=48,
        prefix_tokens=16,
        perturb_back=8,
        max_texts=2,
        shadow_texts=2,
        shadow_positions=(4, 8),
        shadow_window=6,
        batch_size=4,
        timing_batches=(1,),
        timing_reps=1,
        timing_budget_s=0.0,
        match_rows=2,
    )
    return PhenomenaConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def copy_result():
    model = copy_gpt()
    texts = ["a" * 40, "ab" * 20]
    return model, chapter_phenomena(model, ["ab", "cafe"], texts, config=small_cfg())


def test_the_context_shortens_the_continuation(copy_result):
    _, res = copy_result
    assert res.continuation_tokens == 16  # block 32 - 16 prefix tokens, not the 48 asked for
    assert res.new_tokens == 28  # 32 - the 4-token prompt


def test_teacher_forcing_on_a_copy_model_is_exact(copy_result):
    model, res = copy_result
    hit, miss = copy_nll(model.vocab_size, banned=1)  # scored with <unk> removed, as the generations sample
    tf = res.reading("teacher forcing")
    assert tf.positions == 32
    assert tf.accuracy == 0.5  # every "a" after "a" is copied, no "b" after "a" (or "a" after "b") is
    assert tf.truth_nll == pytest.approx((hit + miss) / 2, abs=1e-4)
    assert tf.own_nll == pytest.approx(hit, abs=1e-4)  # the argmax is always the copy
    assert tf.accuracy_by_step == [0.5] * 16


def test_free_running_greedy_on_a_copy_model_is_exact(copy_result):
    model, res = copy_result
    hit, miss = copy_nll(model.vocab_size, banned=1)
    fr = res.reading("free running, greedy")
    # "aaa…": "a" forever, all right. "abab…" ends its prefix on "b": "b" forever, right every other step.
    assert fr.accuracy == 0.75
    assert fr.accuracy_by_step == [0.5, 1.0] * 8
    assert fr.truth_nll == pytest.approx(0.75 * hit + 0.25 * miss, abs=1e-4)
    assert fr.own_nll == pytest.approx(hit, abs=1e-4)


def test_a_changed_token_casts_a_one_step_shadow_on_a_copy_model(copy_result):
    model, res = copy_result
    hit, miss = copy_nll(model.vocab_size)  # the chapter's shadow reads the raw distribution
    sh = res.shadow.shadows
    assert [(s.k, s.argmax_was_truth) for s in sh] == [(4, True), (8, True), (4, False), (8, False)]
    for s in sh:
        # Only the row that reads the changed token sees it: "a" → its runner-up costs miss − hit, "b" → "a" in
        # "abab" turns a miss into a hit.
        expected = miss - hit if s.argmax_was_truth else hit - miss
        assert s.curve[0] == pytest.approx(expected, abs=1e-4)
        assert s.curve[1:] == pytest.approx([0.0] * 5, abs=1e-6)
    assert json_safe(res.shadow)["mean_next_dloss"] == pytest.approx(0.0, abs=1e-4)


def test_greedy_continuations_never_diverge_when_only_the_last_token_matters(copy_result):
    _, res = copy_result
    d = json_safe(res.divergence)
    assert d["changed_at"] == 8 and d["never_diverged"] == 1.0 and d["tail_agreement"] == 1.0
    assert d["median_first_divergence"] is None


def test_the_copy_models_greedy_loops_and_the_claims_say_so(copy_result):
    _, res = copy_result
    greedy = json_safe(res)["diversity"][0]
    assert greedy["strategy"] == "greedy" and greedy["loop_share"] == 1.0
    assert greedy["distinct_2"] == pytest.approx(1 / 27, abs=1e-4)  # one bigram among 27
    verdicts = {c.claim: c.holds for c in phenomena_claims(json_safe(res))}
    assert verdicts[
        "§3.3 greedy decoding loops (exact loop, near loop or repetitive tail in at least half the continuations)"
    ]
    assert not verdicts["§3.5 every sampling strategy has distinct-2 >= 0.9"]  # the copy model's samples repeat too


def test_cached_and_naive_tokens_agree(copy_result):
    _, res = copy_result
    assert res.timing is not None and res.timing.tokens_match == {"rows": 2, "identical": 2}


def test_order_trap_kept_sets_on_a_distribution_with_ties():
    # 0.28 ×3, 0.08 ×2. top-p 0.9 keeps the crossing token, and only ONE of the two tied 0.08s at τ = 1.
    logits = torch.tensor([0.28, 0.28, 0.28, 0.08, 0.08]).log()
    res = distribution(torch.stack([logits, logits]), taus=(0.5, 1.0, 2.0), trap_taus=(0.5, 1.0, 1.5, 2.0))
    trunc = [row["trunc_then_temp"] for row in res.order_trap]
    temp = [row["temp_then_trunc"] for row in res.order_trap]
    assert trunc == [4, 4, 4, 4]  # truncating first freezes the kept set
    assert temp == [3, 4, 5, 5]  # p² crosses 0.9 after 3 tokens; √p never reaches 0.9 before the last
    ent = [row.entropy for row in res.entropy_vs_temperature]
    assert ent[0] < ent[1] < ent[2] <= math.log(5)


def test_banned_tokens_are_neither_scored_nor_counted_in_the_distribution():
    s = _Scores(bans=(1,))
    logits = torch.zeros(1, 3, 4)
    logits[0, :, 1] = 9.0  # <unk> (id 1) is the raw argmax everywhere
    logits[0, :, 2] = 5.0
    truth = torch.tensor([[2, 1, 2]])  # the middle truth is <unk>
    s.add(logits, truth)
    r = s.reading("teacher forcing")
    assert r.positions == 2 and r.accuracy == 1.0  # the argmax with <unk> removed is token 2
    assert r.accuracy_by_step == [1.0, 0.0, 1.0]
    p2 = math.exp(5.0) / (math.exp(5.0) + 2.0)  # renormalised over ids 0, 2, 3
    assert r.truth_nll == pytest.approx(-math.log(p2)) and r.own_prob == pytest.approx(p2)


def tiny_llama() -> Model:
    """A tiny random Llama with a byte-level BPE trained on a few English sentences."""
    import transformers as T
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = "the cat sat on the mat and the dog ran in the park while the sun shone on the town. " * 3
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([text], trainer)
    fast = T.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    cfg = T.LlamaConfig(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=fast.eos_token_id,
    )
    torch.manual_seed(0)
    return Model.from_module(T.LlamaForCausalLM(cfg), SubwordTokenizer(fast))


def test_a_subword_transformers_model_runs_every_phenomenon():
    model = tiny_llama()
    assert corpus_of(model) == "english"  # its BPE spends several tokens per Chinese character
    texts = ["the cat sat on the mat and the dog ran in the park while the sun shone on the town " * 2] * 3
    res = chapter_phenomena(model, ["the cat", "a dog ran"], texts, config=small_cfg(max_new_tokens=12, max_texts=3))
    d = json.loads(json.dumps(json_safe(res)))
    assert res.continuation_tokens == 12 and d["inputs"]["texts"] == 3
    assert [r["positions"] for r in d["free_running"]["readings"]] == [36, 36, 36]
    assert d["distribution"]["vocab_size"] == model.vocab_size
    assert d["timing"]["tokens_match"] == {"rows": 2, "identical": 2}
    eos = model.eos_id
    assert all(eos in row["sampler"]["ban_ids"] for row in d["diversity"])  # every row has all its tokens
    table = markdown_table({"llama": d, "again": d})
    assert table.splitlines()[0] == "|  | llama | again |"


def test_too_short_texts_and_bad_sizes_are_refused():
    model = copy_gpt()
    with pytest.raises(ValueError, match="no text holds 32 tokens"):
        chapter_phenomena(model, ["ab"], ["abc"], config=small_cfg())
    with pytest.raises(ValueError, match="prefix_tokens must exceed perturb_back"):
        PhenomenaConfig(prefix_tokens=8, perturb_back=8)
    with pytest.raises(ValueError, match="shadow_window must be >= 5"):
        PhenomenaConfig(shadow_window=4)


def test_cli_writes_phenomena_json_and_refuses_bad_sizes(tmp_path, capsys):
    from genprobe.cli import main
    from genprobe.model.checkpoint import save_checkpoint

    model = copy_gpt()
    ckpt = save_checkpoint(tmp_path / "ckpt", model.module, model.tokenizer)
    (tmp_path / "p.txt").write_text("ab\ncafe\n", encoding="utf-8")
    (tmp_path / "t.txt").write_text("a" * 40 + "\n" + "ab" * 20 + "\n", encoding="utf-8")
    args = [str(ckpt), "--prompts", str(tmp_path / "p.txt"), "--val-text", str(tmp_path / "t.txt")]
    out = tmp_path / "out"
    assert main(["phenomena", *args, "--max-new-tokens", "16", "--no-timing", "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads((out / "phenomena.json").read_text(encoding="utf-8")) == printed
    assert printed["inputs"]["prompts"] == 2 and printed["timing"] is None
    assert main(["phenomena", *args, "--count", "0"]) == 2
    assert "--count must be >= 1, got 0" in capsys.readouterr().err
