"""granite (llama.cpp src/models/granite.cpp, llama-graph.cpp build_inp_embd): llama's block
with NORM RoPE and four multipliers: embeddings times embedding_scale, attention and FFN
outputs times residual_scale before each residual add, queries scaled by attention.scale
(1/sqrt(head_dim) when 0 or absent), logits divided by logit_scale. No RoPE at all when
rope.scaling.finetuned is false; rope_freqs.weight divides the frequencies when present."""

import numpy as np

from .common import attention, rms_norm, rope, silu


def forward(m, tokens, n_ctx_seq):
    z = m.sizes()
    T, H, G, D = len(tokens), z["n_head"], z["n_head_kv"], z["head_dim"]
    pos = np.arange(T)
    emb_scale = m.key("embedding_scale", 0.0) or 1.0
    res_scale = m.key("residual_scale", 0.0) or 1.0
    kq_scale = m.key("attention.scale", 0.0) or D**-0.5
    use_rope = m.key("rope.scaling.finetuned", True)
    factors = m.tensor("rope_freqs.weight") if m.has("rope_freqs.weight") else None
    turn = lambda a: (
        rope(a, pos, z["n_rot"], z["rope_base"], neox=False, factors=factors) if use_rope else a
    )
    x = m.tensor("token_embd.weight")[tokens] * emb_scale
    for il in range(z["n_layer"]):
        W = lambda name, il=il: m.layer(il, name + ".weight")
        h = rms_norm(x, W("attn_norm"), z["eps"])
        q = turn((h @ W("attn_q").T).reshape(T, H, D))
        k = turn((h @ W("attn_k").T).reshape(T, G, D))
        v = (h @ W("attn_v").T).reshape(T, G, -1)
        x = x + res_scale * (attention(q, k, v, kq_scale) @ W("attn_output").T)
        h = rms_norm(x, W("ffn_norm"), z["eps"])
        x = x + res_scale * ((silu(h @ W("ffn_gate").T) * (h @ W("ffn_up").T)) @ W("ffn_down").T)
    logits = rms_norm(x, m.tensor("output_norm.weight"), z["eps"]) @ m.output().T
    return logits / m.key("logit_scale")
