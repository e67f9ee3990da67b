"""A tiny random Llama written as a GGUF file the way llama.cpp's converter writes one (test helper).

llama.cpp's ``convert_hf_to_gguf.py`` (``LlamaModel.permute``) reorders the rows of ``q_proj`` and
``k_proj`` from the Hugging Face rotary layout (halves) to its own (interleaved pairs); transformers'
GGUF loader undoes it. Writing the file through the same permutation makes "the GGUF loads back to the
model it came from" an exact, checkable statement.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "A tiny model writes tiny sentences about foxes, dogs and the weather.",
    "Rain fell on the town while the fire crews waited for the wind to ease.",
]


def tiny_bpe():
    """A byte-level BPE (GPT-2 style) with the chat specials at ids 0, 1, 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TEXT * 4, trainer)
    return tok


def tiny_llama(vocab_size: int, seed: int = 0, heads: tuple[int, int] = (4, 2)):
    """A random 2-layer LlamaForCausalLM with grouped-query attention (``heads``: query and key/value heads, of width
    64 / query heads) and tied embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=heads[0],
        num_key_value_heads=heads[1],
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1 so that a wrong norm mapping shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF rotary halves -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensors(model) -> dict[str, np.ndarray]:
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        out[f"blk.{i}.attn_q.weight"] = llamacpp_permute(sd[pre + "self_attn.q_proj.weight"], cfg.num_attention_heads)
        out[f"blk.{i}.attn_k.weight"] = llamacpp_permute(sd[pre + "self_attn.k_proj.weight"], cfg.num_key_value_heads)
        for hf, gg in names.items():
            out[f"blk.{i}.{gg}.weight"] = sd[pre + hf + ".weight"]
    return out


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    q8_names: tuple[str, ...] = (),
    seed: int = 0,
    heads: tuple[int, int] = (4, 2),
    planted: dict | None = None,
    quant: dict[str, str] | None = None,
):
    """Write a tiny random Llama + byte-level BPE as GGUF; returns the HF model whose weights the file holds.

    Tensors named in ``q8_names`` are stored as Q8_0, those in ``quant`` (name -> ggml type name: Q4_0, Q5_1, …) as
    that type (by gguf-py's own quantizer); the returned model then holds their dequantized
    values (what any reader of the file must get back). ``planted`` overrides what the header says (the doctor's
    audit tests): ``bos_token_id``, ``eos_token_id``, ``chat_template``, ``file_type`` (a llama.cpp file type; by
    default none is written), ``head_count``.
    """
    planted = planted or {}
    import gguf

    bpe = tiny_bpe()
    model = tiny_llama(bpe.get_vocab_size(), seed, heads)
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama-test")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(planted.get("head_count", cfg.num_attention_heads))
    if "file_type" in planted:
        w.add_file_type(planted["file_type"])
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)
    _add_tokenizer(w, bpe, planted)
    tensors = _tensors(model)
    for name, arr in tensors.items():
        kind = "Q8_0" if name in q8_names else (quant or {}).get(name)
        if kind is not None:
            qtype = gguf.GGMLQuantizationType[kind]
            q = gguf.quants.quantize(arr, qtype)
            w.add_tensor(name, q, raw_dtype=qtype)
            tensors[name] = gguf.quants.dequantize(q, qtype)
        else:
            w.add_tensor(name, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _load_back_expected(model, tensors)
    return model, bpe


def _add_tokenizer(w, bpe, planted: dict) -> None:
    import json

    vocab = bpe.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = json.loads(bpe.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])  # 3 = control, 1 = normal
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(planted.get("bos_token_id", 1))
    w.add_eos_token_id(planted.get("eos_token_id", 2))
    w.add_pad_token_id(2)
    w.add_chat_template(planted.get("chat_template", CHAT_TEMPLATE))


def _load_back_expected(model, tensors: dict[str, np.ndarray]) -> None:
    """Put the (possibly dequantized) stored values back into the HF model, un-permuting q and k."""
    cfg = model.config

    def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
        return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    sd = model.state_dict()
    with torch.no_grad():
        sd["model.embed_tokens.weight"].copy_(torch.from_numpy(tensors["token_embd.weight"]))
        for i in range(cfg.num_hidden_layers):
            q = unpermute(tensors[f"blk.{i}.attn_q.weight"], cfg.num_attention_heads)
            k = unpermute(tensors[f"blk.{i}.attn_k.weight"], cfg.num_key_value_heads)
            sd[f"model.layers.{i}.self_attn.q_proj.weight"].copy_(torch.from_numpy(q))
            sd[f"model.layers.{i}.self_attn.k_proj.weight"].copy_(torch.from_numpy(k))
            sd[f"model.layers.{i}.mlp.down_proj.weight"].copy_(torch.from_numpy(tensors[f"blk.{i}.ffn_down.weight"]))
