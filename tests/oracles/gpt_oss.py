"""gpt-oss (llama.cpp src/models/openai-moe.cpp) in float64: Q/K/V/output biases, NEOX RoPE
with YaRN when rope.scaling.type is "yarn" (tests/oracles/yarn.py, llama.cpp's defaults
ext_factor 1, beta_fast 32, beta_slow 1), scores q.k / sqrt(n_rot), a sink logit per head in
the softmax denominator, sliding window on even layers (pattern 2), post_attention_norm before
a MoE: router logits + bias, top-k of the logits, softmax over the k, experts with biases and
swiglu_oai (alpha 1.702, limit 7), untied output."""

import numpy as np

from . import yarn
from .common import rms_norm, swa_layers


def attention_sinks(q, k, v, scale, window, sinks):
    """Causal attention of one sequence from position 0 (q (T, H, D), k (T, G, D), v (T, G, Dv));
    head h's softmax denominator also holds exp(sinks[h]). Returns (T, H*Dv)."""
    T, H, _ = q.shape
    G = k.shape[1]
    out = np.zeros((T, H, v.shape[-1]))
    for t in range(T):
        lo = max(0, t - window + 1) if window else 0
        for h in range(H):
            g = h // (H // G)
            s = k[lo : t + 1, g] @ q[t, h] * scale
            mx = max(s.max(), sinks[h])
            p = np.exp(s - mx)
            out[t, h] = p @ v[lo : t + 1, g] / (p.sum() + np.exp(sinks[h] - mx))
    return out.reshape(T, -1)


def swiglu_oai(g, u, alpha=1.702, limit=7.0):
    x = np.minimum(g, limit)
    y = np.clip(u, -limit, limit)
    return x / (1.0 + np.exp(-alpha * x)) * (y + 1.0)


def moe(m, il, h, k):
    W = lambda name: m.layer(il, name)
    logits = h @ W("ffn_gate_inp.weight").T + W("ffn_gate_inp.bias")  # (T, n_expert)
    gate, up, down = W("ffn_gate_exps.weight"), W("ffn_up_exps.weight"), W("ffn_down_exps.weight")
    bg, bu, bd = (
        W("ffn_gate_exps.bias"),
        W("ffn_up_exps.bias"),
        W("ffn_down_exps.bias"),
    )  # (n_expert, n)
    out = np.zeros_like(h)
    for t in range(len(h)):
        sel = np.argsort(-logits[t], kind="stable")[:k]
        wts = np.exp(logits[t, sel] - logits[t, sel].max())
        wts /= wts.sum()
        for e, we in zip(sel, wts, strict=True):
            a = swiglu_oai(gate[e] @ h[t] + bg[e], up[e] @ h[t] + bu[e])
            out[t] += we * (down[e] @ a + bd[e])
    return out


def _rope(m, z, x, pos):
    base = z["rope_base"]
    if m.key("rope.scaling.type") != "yarn":
        return yarn.rope(
            x,
            pos,
            z["n_rot"],
            True,
            base=base,
            freq_scale=1.0,
            ext_factor=0.0,
            attn_factor=1.0,
            beta_fast=32.0,
            beta_slow=1.0,
            n_ctx_orig=m.key("context_length"),
        )
    fs = 1.0 / m.key("rope.scaling.factor")
    attn = yarn.context_attn_factor(fs, 1.0, m.key("rope.scaling.attn_factor", 1.0))
    n_orig = m.key("rope.scaling.original_context_length", m.key("context_length"))
    return yarn.rope(
        x,
        pos,
        z["n_rot"],
        True,
        base=base,
        freq_scale=fs,
        ext_factor=1.0,
        attn_factor=attn,
        beta_fast=32.0,
        beta_slow=1.0,
        n_ctx_orig=n_orig,
    )


def forward(m, tokens, n_ctx_seq):
    z = m.sizes()
    T, H, G, D, L = len(tokens), z["n_head"], z["n_head_kv"], z["head_dim"], z["n_layer"]
    pos, eps = np.arange(T), z["eps"]
    window, swa = m.key("attention.sliding_window"), swa_layers(m, L, 2)
    k_used = m.key("expert_used_count")
    x = m.tensor("token_embd.weight")[tokens]
    for il in range(L):
        W = lambda name, il=il: m.layer(il, name)
        h = rms_norm(x, W("attn_norm.weight"), eps)
        q = _rope(m, z, (h @ W("attn_q.weight").T + W("attn_q.bias")).reshape(T, H, D), pos)
        k = _rope(m, z, (h @ W("attn_k.weight").T + W("attn_k.bias")).reshape(T, G, D), pos)
        v = (h @ W("attn_v.weight").T + W("attn_v.bias")).reshape(T, G, -1)
        a = attention_sinks(
            q, k, v, z["n_rot"] ** -0.5, window if swa[il] else 0, W("attn_sinks.weight")
        )
        x = x + a @ W("attn_output.weight").T + W("attn_output.bias")
        x = x + moe(m, il, rms_norm(x, W("post_attention_norm.weight"), eps), k_used)
    return rms_norm(x, m.tensor("output_norm.weight"), eps) @ m.tensor("output.weight").T
