"""llama (llama.cpp src/models/llama.cpp): RMSNorm, NORM RoPE (adjacent pairs, optional
linear scaling, rope_freqs.weight frequency divisors when present: Llama 3.1+), SwiGLU FFN,
output tied to token_embd when absent."""

import numpy as np

from .common import attention, rms_norm, rope, silu


def forward(m, tokens, n_ctx_seq, embd=None, vis=None):
    """embd: {position: row} of image embeddings (tokens there are placeholders); vis: the
    last position each token sees, when not its own."""
    z = m.sizes()
    T, H, G, D = len(tokens), z["n_head"], z["n_head_kv"], z["head_dim"]
    pos = np.arange(T)
    scaling = m.key("rope.scaling.type", "none")
    freq_scale = 1.0 / m.key("rope.scaling.factor", 1.0) if scaling == "linear" else 1.0
    factors = m.tensor("rope_freqs.weight") if m.has("rope_freqs.weight") else None
    turn = lambda x: rope(
        x, pos, z["n_rot"], z["rope_base"], neox=False, freq_scale=freq_scale, factors=factors
    )
    x = m.tensor("token_embd.weight")[np.where(np.asarray(tokens) < 0, 0, tokens)]
    for i, row in (embd or {}).items():
        x[i] = row
    for il in range(z["n_layer"]):
        h = rms_norm(x, m.layer(il, "attn_norm.weight"), z["eps"])
        q = turn((h @ m.layer(il, "attn_q.weight").T).reshape(T, H, D))
        k = turn((h @ m.layer(il, "attn_k.weight").T).reshape(T, G, D))
        v = (h @ m.layer(il, "attn_v.weight").T).reshape(T, G, -1)
        x = x + attention(q, k, v, D**-0.5, vis=vis) @ m.layer(il, "attn_output.weight").T
        h = rms_norm(x, m.layer(il, "ffn_norm.weight"), z["eps"])
        a = silu(h @ m.layer(il, "ffn_gate.weight").T) * (h @ m.layer(il, "ffn_up.weight").T)
        x = x + a @ m.layer(il, "ffn_down.weight").T
    return rms_norm(x, m.tensor("output_norm.weight"), z["eps"]) @ m.output().T
