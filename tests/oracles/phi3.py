"""phi3 (llama.cpp src/models/phi3.cpp, llama_model::get_rope_factors): fused attn_qkv
(rows Q | K | V), NEOX RoPE on the first rope.dimension_count dims of each head, LongRoPE
frequency divisors rope_factors_long when the context per sequence exceeds
rope.scaling.original_context_length, else rope_factors_short, cos/sin times
rope.scaling.attn_factor; queries scaled by 1/sqrt(head_dim); SwiGLU of a fused ffn_up
(rows gate | up); no sliding window (llama.cpp disables it for Phi)."""

import numpy as np

from .common import attention, rms_norm, rope, silu


def forward(m, tokens, n_ctx_seq):
    z = m.sizes()
    T, H, G, D = len(tokens), z["n_head"], z["n_head_kv"], z["head_dim"]
    pos = np.arange(T)
    n_ctx_orig = m.key("rope.scaling.original_context_length", m.key("context_length"))
    which = "rope_factors_long.weight" if n_ctx_seq > n_ctx_orig else "rope_factors_short.weight"
    factors = m.tensor(which) if m.has(which) else None
    attn_factor = m.key("rope.scaling.attn_factor", 1.0)
    turn = lambda x: rope(
        x, pos, z["n_rot"], z["rope_base"], neox=True, factors=factors, attn_factor=attn_factor
    )
    x = m.tensor("token_embd.weight")[tokens]
    for il in range(z["n_layer"]):
        h = rms_norm(x, m.layer(il, "attn_norm.weight"), z["eps"])
        qkv = h @ m.layer(il, "attn_qkv.weight").T
        q, k, v = np.split(qkv, [H * D, (H + G) * D], axis=1)
        q, k, v = turn(q.reshape(T, H, D)), turn(k.reshape(T, G, D)), v.reshape(T, G, D)
        x = x + attention(q, k, v, D**-0.5) @ m.layer(il, "attn_output.weight").T
        h = rms_norm(x, m.layer(il, "ffn_norm.weight"), z["eps"])
        gate, up = np.split(h @ m.layer(il, "ffn_up.weight").T, 2, axis=1)
        x = x + (silu(gate) * up) @ m.layer(il, "ffn_down.weight").T
    return rms_norm(x, m.tensor("output_norm.weight"), z["eps"]) @ m.output().T
