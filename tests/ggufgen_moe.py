"""Tiny random mixture-of-experts GGUF models (qwen3moe, qwen2moe) for fast tests.

`write_tiny_moe(path, arch=...)` writes the keys and tensors llama.cpp's loader requires for
the architecture (so llama-perplexity can load the file too): expert_count,
expert_used_count, expert_feed_forward_length, the router ffn_gate_inp and the 3-D experts
ffn_{gate,up,down}_exps (numpy shape (n_expert, rows, cols)); qwen2moe adds Q/K/V biases,
a separate output.weight and the shared expert (ffn_*_shexp, ffn_gate_inp_shexp,
expert_shared_feed_forward_length). The vocabulary and chat template are tests/ggufgen.py's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from ggufgen import CHATML, _add_vocab

T = GGMLQuantizationType
# byte offsets of the f16 super-scales (d, dmin) in a block (gguf-py cannot quantise K-quants:
# random blocks with small scales stand in for real ones)
_KQ_F16 = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
MOE_ARCHS = ("qwen3moe", "qwen2moe")


def write_tiny_moe(
    path,
    arch: str = "qwen3moe",
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 96,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 32,
    n_ff_shexp: int = 64,
    qtype: T = T.Q8_0,
    expert_qtype: T | None = None,
    seed: int = 0,
    n_ctx_train: int = 256,
    omit: tuple[str, ...] = (),
    keys: dict | None = None,
) -> Path:
    """Write a random tiny MoE model; returns the path.

    expert_qtype: type of the expert tensors (default qtype; K-quants get random blocks).
    omit: tensor names (e.g. "blk.0.ffn_up_exps.weight") left out, to test errors.
    keys: metadata overrides by key suffix ("expert_count": 0 ...), to test errors.
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    keys = keys or {}
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    counts = {
        "expert_count": n_expert,
        "expert_used_count": n_expert_used,
        "expert_feed_forward_length": n_ff_exp,
    } | keys
    for k, v in counts.items():
        if v is not None:
            w.add_uint32(f"{arch}.{k}", v)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(n_ff_shexp)
    n_vocab = _add_vocab(w, False, arch)
    w.add_vocab_size(n_vocab)
    w.add_chat_template(CHATML)

    def add(name, data, qt=qtype):
        if name in omit:
            return
        data = data.astype(np.float32)
        if qt == T.F32:
            w.add_tensor(name, data)
        elif qt in _KQ_F16:
            w.add_tensor(name, _random_kquant(rng, data.shape, qt), raw_dtype=qt)
        else:
            w.add_tensor(name, quantize(data, qt), raw_dtype=qt)

    def mat(name, *shape, scale=0.08, qt=qtype):
        add(name, rng.standard_normal(shape) * scale, qt)

    def vec(name, n, base=1.0, spread=0.05):
        add(name, base + spread * rng.standard_normal(n), T.F32)

    eq = qtype if expert_qtype is None else expert_qtype  # F32 is 0
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    mat("token_embd.weight", n_vocab, n_embd, scale=0.5)
    vec("output_norm.weight", n_embd)
    if arch == "qwen2moe":  # llama.cpp requires it for qwen2moe (no tied embeddings)
        mat("output.weight", n_vocab, n_embd, scale=0.5)
    for il in range(n_layer):
        p = f"blk.{il}."
        vec(p + "attn_norm.weight", n_embd)
        mat(p + "attn_q.weight", q_dim, n_embd)
        mat(p + "attn_k.weight", kv_dim, n_embd)
        mat(p + "attn_v.weight", kv_dim, n_embd)
        mat(p + "attn_output.weight", n_embd, q_dim)
        if arch == "qwen3moe":
            vec(p + "attn_q_norm.weight", head_dim)
            vec(p + "attn_k_norm.weight", head_dim)
        else:
            for t, n in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
                vec(p + t + ".bias", n, 0.0)
        vec(p + "ffn_norm.weight", n_embd)
        # a wide spread of router logits, so that top-k is far from ties
        mat(p + "ffn_gate_inp.weight", n_expert, n_embd, scale=0.5, qt=T.F32)
        # experts strong enough that routing mistakes show in the logits
        mat(p + "ffn_gate_exps.weight", n_expert, n_ff_exp, n_embd, scale=0.25, qt=eq)
        mat(p + "ffn_up_exps.weight", n_expert, n_ff_exp, n_embd, scale=0.25, qt=eq)
        mat(p + "ffn_down_exps.weight", n_expert, n_embd, n_ff_exp, scale=0.25, qt=eq)
        if arch == "qwen2moe":
            vec(p + "ffn_gate_inp_shexp.weight", n_embd, 0.0, 0.3)
            mat(p + "ffn_gate_shexp.weight", n_ff_shexp, n_embd)
            mat(p + "ffn_up_shexp.weight", n_ff_shexp, n_embd)
            mat(p + "ffn_down_shexp.weight", n_embd, n_ff_shexp)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _random_kquant(rng, shape: tuple[int, ...], qt: T) -> np.ndarray:
    """Random K-quant blocks (shape[..., -1] weights per row) with small f16 super-scales:
    weights of magnitude ~0.1, like the float ones."""
    block, size = GGML_QUANT_SIZES[qt]
    rows, nb = int(np.prod(shape[:-1])), shape[-1] // block
    raw = rng.integers(0, 256, (rows, nb, size), dtype=np.uint8)
    for off in _KQ_F16[qt]:
        scale = rng.uniform(0.0002, 0.0006, (rows, nb)).astype(np.float16)
        raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(rows, nb, 2)
    return raw.reshape(*shape[:-1], nb * size)
