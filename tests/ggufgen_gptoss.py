"""Tiny random gpt-oss GGUF models (architecture "gpt-oss") for fast tests.

`write_tiny_gptoss(path, ...)` writes every metadata key and tensor llama.cpp's loader
requires for LLM_ARCH_OPENAI_MOE (src/models/openai-moe.cpp: attention.sliding_window,
expert_feed_forward_length, the RMS epsilon; output.weight, attn_sinks, post_attention_norm,
the attention and expert biases), YaRN keys as the converter writes them, the gpt2 BPE
vocabulary of tests/ggufgen.py with harmony's control tokens, and llama.cpp's gpt-oss chat
template. The features that make gpt-oss differ can be switched off one
at a time (same weights otherwise) so tests can show each one matters.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, RopeScalingType
from gguf.quants import quantize

from ggufgen import _bpe_vocab

SLIDING_WINDOW = 4
# o200k_harmony's special tokens (control), as gpt-oss files have them
HARMONY_SPECIALS = (
    "<|startoftext|>",
    "<|return|>",
    "<|constrain|>",
    "<|channel|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|call|>",
)
TEMPLATE = Path(__file__).resolve().parent / "data" / "templates" / "openai-gpt-oss-120b.jinja"
YARN_FACTOR, YARN_ORIG_CTX = 4.0, 16


def write_tiny_gptoss(
    path,
    *,
    n_layer: int = 4,
    n_embd: int = 64,
    n_head: int = 8,
    n_head_kv: int = 2,
    head_dim: int = 16,
    n_expert: int = 4,
    n_expert_used: int = 2,
    n_ff_exp: int = 32,
    qtype: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
    seed: int = 0,
    sinks: bool = True,
    yarn: bool = True,
    sliding_window: int = SLIDING_WINDOW,
    rope_base: float = 10000.0,
    n_ctx_train: int = 256,
    skip: tuple[str, ...] = (),
) -> Path:
    """Write the model to `path` and return it. sinks=False writes sink logits of -1e4 (no
    effect); yarn=False leaves out the rope scaling keys; sliding_window as written; `skip`:
    metadata keys (without the "gpt-oss." prefix) and tensor names to leave out."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "gpt-oss")
    w.add_name("tiny-gpt-oss")
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff_exp)  # the converter writes intermediate_size here too
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(rope_base)
    if yarn:
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(YARN_FACTOR)
        w.add_rope_scaling_orig_ctx_len(YARN_ORIG_CTX)
    if "attention.sliding_window" not in skip:
        w.add_sliding_window(sliding_window)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(n_expert_used)
    if "expert_feed_forward_length" not in skip:
        w.add_expert_feed_forward_length(n_ff_exp)
    n_vocab = _add_vocab(w)
    w.add_vocab_size(n_vocab)

    def tensor(name, data):
        if name in skip:
            return
        data = data.astype(np.float32)
        if qtype == GGMLQuantizationType.F32 or data.ndim == 1 or name.endswith(".bias"):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)

    def normal(*shape, scale=0.08, base=0.0):
        return base + scale * rng.standard_normal(shape)

    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    tensor("token_embd.weight", normal(n_vocab, n_embd, scale=0.5))
    tensor("output_norm.weight", normal(n_embd, scale=0.05, base=1.0))
    tensor("output.weight", normal(n_vocab, n_embd))
    for il in range(n_layer):
        p = f"blk.{il}."
        tensor(p + "attn_norm.weight", normal(n_embd, scale=0.05, base=1.0))
        for name, rows in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
            tensor(p + name + ".weight", normal(rows, n_embd, scale=0.15))
            tensor(p + name + ".bias", normal(rows, scale=0.1))
        tensor(p + "attn_output.weight", normal(n_embd, q_dim))
        tensor(p + "attn_output.bias", normal(n_embd, scale=0.1))
        # sinks around the scores' size, so some heads give the sink most of the mass
        tensor(
            p + "attn_sinks.weight", normal(n_head, scale=1.5) if sinks else np.full(n_head, -1e4)
        )
        tensor(p + "post_attention_norm.weight", normal(n_embd, scale=0.05, base=1.0))
        tensor(p + "ffn_gate_inp.weight", normal(n_expert, n_embd, scale=0.3))
        tensor(p + "ffn_gate_inp.bias", normal(n_expert, scale=0.5))
        # gate/up large enough that swiglu_oai's clamps at +-7 act on some entries
        tensor(p + "ffn_gate_exps.weight", normal(n_expert, n_ff_exp, n_embd, scale=0.5))
        tensor(p + "ffn_up_exps.weight", normal(n_expert, n_ff_exp, n_embd, scale=0.5))
        tensor(p + "ffn_down_exps.weight", normal(n_expert, n_embd, n_ff_exp, scale=0.02))
        tensor(p + "ffn_gate_exps.bias", normal(n_expert, n_ff_exp, scale=0.5))
        tensor(p + "ffn_up_exps.bias", normal(n_expert, n_ff_exp, scale=0.5))
        tensor(p + "ffn_down_exps.bias", normal(n_expert, n_embd, scale=0.1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_vocab(w: GGUFWriter) -> int:
    """tests/ggufgen.py's byte-level BPE vocabulary plus harmony's control tokens, BOS/EOS as
    gpt-oss has them, and llama.cpp's gpt-oss chat template; returns the vocabulary size."""
    tokens, types, merges = _bpe_vocab()
    tokens, types = tokens + list(HARMONY_SPECIALS), types + [3] * len(HARMONY_SPECIALS)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")  # as real gpt-oss files
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|startoftext|>"))
    w.add_eos_token_id(tokens.index("<|return|>"))
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE.read_text(encoding="utf-8"))
    return len(tokens)
