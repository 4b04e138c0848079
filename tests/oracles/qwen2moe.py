"""qwen2moe (llama.cpp src/models/qwen2moe.cpp): qwen2's attention (Q/K/V biases when the
file has them), then softmax-gated experts with raw (unnormalised) top-k weights plus a
shared expert scaled by sigmoid(h . ffn_gate_inp_shexp)."""

import numpy as np

from .common import attention, rms_norm, rope, silu
from .moe import moe_ffn


def forward(m, tokens, n_ctx_seq):
    z = m.sizes()
    T, H, G, D = len(tokens), z["n_head"], z["n_head_kv"], z["head_dim"]
    k = m.key("expert_used_count")
    pos = np.arange(T)

    def proj(h, il, name):
        bias = m.layer(il, f"{name}.bias") if m.has(f"blk.{il}.{name}.bias") else 0.0
        return h @ m.layer(il, f"{name}.weight").T + bias

    x = m.tensor("token_embd.weight")[tokens]
    for il in range(z["n_layer"]):
        h = rms_norm(x, m.layer(il, "attn_norm.weight"), z["eps"])
        q = proj(h, il, "attn_q").reshape(T, H, D)
        kk = proj(h, il, "attn_k").reshape(T, G, D)
        v = proj(h, il, "attn_v").reshape(T, G, -1)
        q = rope(q, pos, z["n_rot"], z["rope_base"], neox=True)
        kk = rope(kk, pos, z["n_rot"], z["rope_base"], neox=True)
        x = x + attention(q, kk, v, D**-0.5) @ m.layer(il, "attn_output.weight").T
        h = rms_norm(x, m.layer(il, "ffn_norm.weight"), z["eps"])
        shared = silu(h @ m.layer(il, "ffn_gate_shexp.weight").T) * (
            h @ m.layer(il, "ffn_up_shexp.weight").T
        )
        shared = shared @ m.layer(il, "ffn_down_shexp.weight").T
        gate = 1.0 / (1.0 + np.exp(-(h @ m.layer(il, "ffn_gate_inp_shexp.weight"))))
        x = x + moe_ffn(m, il, h, k, norm_w=False) + gate[:, None] * shared
    return rms_norm(x, m.tensor("output_norm.weight"), z["eps"]) @ m.output().T
