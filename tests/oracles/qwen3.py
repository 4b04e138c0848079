"""qwen3 (llama.cpp src/models/qwen3.cpp): per-head RMSNorm of Q and K before NEOX RoPE."""

import numpy as np

from .common import attention, rms_norm, rope, silu


def forward(m, tokens, n_ctx_seq):
    z = m.sizes()
    T, H, G, D = len(tokens), z["n_head"], z["n_head_kv"], z["head_dim"]
    pos = np.arange(T)
    x = m.tensor("token_embd.weight")[tokens]
    for il in range(z["n_layer"]):
        h = rms_norm(x, m.layer(il, "attn_norm.weight"), z["eps"])
        q = (h @ m.layer(il, "attn_q.weight").T).reshape(T, H, D)
        k = (h @ m.layer(il, "attn_k.weight").T).reshape(T, G, D)
        v = (h @ m.layer(il, "attn_v.weight").T).reshape(T, G, -1)
        q = rms_norm(q, m.layer(il, "attn_q_norm.weight"), z["eps"])
        k = rms_norm(k, m.layer(il, "attn_k_norm.weight"), z["eps"])
        q = rope(q, pos, z["n_rot"], z["rope_base"], neox=True)
        k = rope(k, pos, z["n_rot"], z["rope_base"], neox=True)
        x = x + attention(q, k, v, D**-0.5) @ m.layer(il, "attn_output.weight").T
        h = rms_norm(x, m.layer(il, "ffn_norm.weight"), z["eps"])
        a = silu(h @ m.layer(il, "ffn_gate.weight").T) * (h @ m.layer(il, "ffn_up.weight").T)
        x = x + a @ m.layer(il, "ffn_down.weight").T
    return rms_norm(x, m.tensor("output_norm.weight"), z["eps"]) @ m.output().T
