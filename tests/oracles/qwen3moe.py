"""qwen3moe (llama.cpp src/models/qwen3moe.cpp): qwen3's attention, then a MoE feed-forward
with softmax gating, top-k and the k weights normalised to sum 1."""

import numpy as np

from .common import attention, rms_norm, rope
from .moe import moe_ffn


def forward(m, tokens, n_ctx_seq):
    z = m.sizes()
    T, H, G, D = len(tokens), z["n_head"], z["n_head_kv"], z["head_dim"]
    k = m.key("expert_used_count")
    pos = np.arange(T)
    x = m.tensor("token_embd.weight")[tokens]
    for il in range(z["n_layer"]):
        h = rms_norm(x, m.layer(il, "attn_norm.weight"), z["eps"])
        q = (h @ m.layer(il, "attn_q.weight").T).reshape(T, H, D)
        kk = (h @ m.layer(il, "attn_k.weight").T).reshape(T, G, D)
        v = (h @ m.layer(il, "attn_v.weight").T).reshape(T, G, -1)
        q = rms_norm(q, m.layer(il, "attn_q_norm.weight"), z["eps"])
        kk = rms_norm(kk, m.layer(il, "attn_k_norm.weight"), z["eps"])
        q = rope(q, pos, z["n_rot"], z["rope_base"], neox=True)
        kk = rope(kk, pos, z["n_rot"], z["rope_base"], neox=True)
        x = x + attention(q, kk, v, D**-0.5) @ m.layer(il, "attn_output.weight").T
        h = rms_norm(x, m.layer(il, "ffn_norm.weight"), z["eps"])
        x = x + moe_ffn(m, il, h, k, norm_w=True)
    return rms_norm(x, m.tensor("output_norm.weight"), z["eps"]) @ m.output().T
