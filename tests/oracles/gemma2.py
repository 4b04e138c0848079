"""gemma2 (llama.cpp src/models/gemma2.cpp): embeddings times sqrt(n_embd), NEOX RoPE,
queries scaled by 1/sqrt(head_dim) (1/sqrt(n_embd/n_head) for the 46-layer 27B), attention
scores soft-capped (attn_logit_softcapping, default 50), post-attention and post-FFN norms,
GELU FFN, final logits soft-capped (final_logit_softcapping, default 30). Layers alternate
sliding (window default 4096) and global, layer 0 sliding (pattern default 2)."""

import numpy as np

from .common import attention, gelu, rms_norm, rope, softcap, swa_layers


def forward(m, tokens, n_ctx_seq):
    z = m.sizes()
    T, H, G, D, L, E = (
        len(tokens),
        z["n_head"],
        z["n_head_kv"],
        z["head_dim"],
        z["n_layer"],
        z["n_embd"],
    )
    pos, eps = np.arange(T), z["eps"]
    window = m.key("attention.sliding_window", 4096)
    swa = swa_layers(m, L, 2)
    scale = (E / H if L == 46 else D) ** -0.5
    cap = m.key("attn_logit_softcapping", 50.0)
    x = m.tensor("token_embd.weight")[tokens] * np.sqrt(E)
    for il in range(L):
        W = lambda name, il=il: m.layer(il, name + ".weight")
        base = m.key("rope.freq_base_swa", z["rope_base"]) if swa[il] else z["rope_base"]
        h = rms_norm(x, W("attn_norm"), eps)
        q = rope((h @ W("attn_q").T).reshape(T, H, D), pos, z["n_rot"], base, neox=True)
        k = rope((h @ W("attn_k").T).reshape(T, G, D), pos, z["n_rot"], base, neox=True)
        v = (h @ W("attn_v").T).reshape(T, G, -1)
        o = attention(q, k, v, scale, window if swa[il] else 0, cap) @ W("attn_output").T
        x = x + rms_norm(o, W("post_attention_norm"), eps)
        h = rms_norm(x, W("ffn_norm"), eps)
        a = gelu(h @ W("ffn_gate").T) * (h @ W("ffn_up").T)
        x = x + rms_norm(a @ W("ffn_down").T, W("post_ffw_norm"), eps)
    logits = rms_norm(x, m.tensor("output_norm.weight"), eps) @ m.tensor("token_embd.weight").T
    return softcap(logits, m.key("final_logit_softcapping", 30.0))
