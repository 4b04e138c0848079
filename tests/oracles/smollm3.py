"""smollm3 (llama.cpp src/models/smollm3.cpp): llama's block with NORM RoPE, except that the
layers il with (il + 1) % 4 == 0 (n_no_rope_layer_step, fixed at 4) skip RoPE; queries scaled
by 1/sqrt(head_dim); output tied to token_embd when absent."""

import numpy as np

from .common import attention, rms_norm, rope, silu

NO_ROPE_LAYER_STEP = 4


def forward(m, tokens, n_ctx_seq):
    z = m.sizes()
    T, H, G, D = len(tokens), z["n_head"], z["n_head_kv"], z["head_dim"]
    pos = np.arange(T)
    x = m.tensor("token_embd.weight")[tokens]
    for il in range(z["n_layer"]):
        W = lambda name, il=il: m.layer(il, name + ".weight")
        h = rms_norm(x, W("attn_norm"), z["eps"])
        q = (h @ W("attn_q").T).reshape(T, H, D)
        k = (h @ W("attn_k").T).reshape(T, G, D)
        v = (h @ W("attn_v").T).reshape(T, G, -1)
        if (il + 1) % NO_ROPE_LAYER_STEP != 0:
            q = rope(q, pos, z["n_rot"], z["rope_base"], neox=False)
            k = rope(k, pos, z["n_rot"], z["rope_base"], neox=False)
        x = x + attention(q, k, v, D**-0.5) @ W("attn_output").T
        h = rms_norm(x, W("ffn_norm"), z["eps"])
        x = x + (silu(h @ W("ffn_gate").T) * (h @ W("ffn_up").T)) @ W("ffn_down").T
    return rms_norm(x, m.tensor("output_norm.weight"), z["eps"]) @ m.output().T
