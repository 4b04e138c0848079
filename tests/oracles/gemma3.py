"""gemma3 (llama.cpp src/models/gemma3.cpp): embeddings times sqrt(n_embd), per-head Q/K
RMSNorm, NEOX RoPE (sliding layers: base rope.freq_base_swa, default 10000), queries scaled
by 1/sqrt(head_dim) (1/sqrt(n_embd/n_head) for the 62-layer 27B), post-attention and
post-FFN norms, GELU FFN; 5 of every 6 layers slide unless sliding_window_pattern says."""

import numpy as np

from .common import attention, gelu, rms_norm, rope, softcap, swa_layers


def forward(m, tokens, n_ctx_seq, embd=None, vis=None):
    """embd: {position: row} of image embeddings entering unscaled (tokens there are
    placeholders); vis: the last position each token sees (an image's tokens see each other)."""
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
    window = m.key("attention.sliding_window", 0)
    swa = swa_layers(m, L, 6) if window else [False] * L
    scale = (E / H if L == 62 else D) ** -0.5
    tokens = np.where(np.asarray(tokens) < 0, 0, tokens)
    x = m.tensor("token_embd.weight")[tokens] * np.sqrt(E)
    for i, row in (embd or {}).items():
        x[i] = row
    for il in range(L):
        W = lambda name, il=il: m.layer(il, name + ".weight")
        base = m.key("rope.freq_base_swa", 10000.0) if swa[il] else z["rope_base"]
        h = rms_norm(x, W("attn_norm"), eps)
        q = rms_norm((h @ W("attn_q").T).reshape(T, H, D), W("attn_q_norm"), eps)
        k = rms_norm((h @ W("attn_k").T).reshape(T, G, D), W("attn_k_norm"), eps)
        v = (h @ W("attn_v").T).reshape(T, G, -1)
        q, k = rope(q, pos, z["n_rot"], base, neox=True), rope(k, pos, z["n_rot"], base, neox=True)
        o = attention(q, k, v, scale, window if swa[il] else 0, vis=vis) @ W("attn_output").T
        x = x + rms_norm(o, W("post_attention_norm"), eps)
        h = rms_norm(x, W("ffn_norm"), eps)
        a = gelu(h @ W("ffn_gate").T) * (h @ W("ffn_up").T)
        x = x + rms_norm(a @ W("ffn_down").T, W("post_ffw_norm"), eps)
    logits = rms_norm(x, m.tensor("output_norm.weight"), eps) @ m.output().T
    return softcap(logits, m.key("final_logit_softcapping", 0.0))
