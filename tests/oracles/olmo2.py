"""olmo2 (llama.cpp src/models/olmo2.cpp, llama_model_olmo2::load_arch_hparams): no pre-norms;
Q and K RMSNorm over the whole projection width, NEOX RoPE, attention (1/sqrt(head_dim)),
post_attention_norm on its output before the residual add, SwiGLU on the residual stream,
post_ffw_norm before the second add. With attention.sliding_window > 0 (OLMo 3), the layers of
sliding_window_pattern (array, or period default 4: il % 4 < 3) see only the window and turn
by rope.freq_base (the graph's freq_base, not rope.freq_base_swa) without position scaling or
attention factor; the other layers use the rope scaling: linear, or YaRN as ggml_rope_ext runs
it with ext_factor 1, beta_fast 32, beta_slow 1 and llama_context's attention factor."""

import math

import numpy as np

from .common import attention, rms_norm, rope, silu, swa_layers


def yarn(n_rot, base, factor, n_ctx_orig, beta_fast=32.0, beta_slow=1.0):
    """(per-pair frequency divisors, cos/sin multiplier) of YaRN: ggml's rope_yarn with
    freq_scale 1/factor; llama_context's attention factor get_mscale(factor) / (1 + 0.1 ln
    factor) times ggml's own (1 + 0.1 ln factor)."""
    corr = lambda beta: n_rot * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = max(0, math.floor(corr(beta_fast))), min(n_rot - 1, math.ceil(corr(beta_slow)))
    divisors = []
    for i in range(n_rot // 2):
        ramp = 1 - min(1.0, max(0.0, (i - lo) / max(0.001, hi - lo)))
        divisors.append(1.0 / ((1 - ramp) / factor + ramp))  # theta_interp mixed with theta_extrap
    mscale = 1 + 0.1 * math.log(factor) if factor > 1 else 1.0
    return np.array(divisors), mscale


def forward(m, tokens, n_ctx_seq):
    z = m.sizes()
    T, H, G, D, L, eps = (
        len(tokens),
        z["n_head"],
        z["n_head_kv"],
        z["head_dim"],
        z["n_layer"],
        z["eps"],
    )
    pos = np.arange(T)
    window = m.key("attention.sliding_window", 0)
    swa = swa_layers(m, L, 4) if window > 0 else [False] * L
    scaling = m.key("rope.scaling.type", "none")
    freq_scale, factors, attn_factor = 1.0, None, m.key("rope.scaling.attn_factor", 1.0)
    if scaling == "linear":
        freq_scale = 1.0 / m.key("rope.scaling.factor", 1.0)
    if scaling == "yarn":
        n_ctx_orig = m.key("rope.scaling.original_context_length", m.key("context_length"))
        factors, mscale = yarn(
            z["n_rot"], z["rope_base"], m.key("rope.scaling.factor", 1.0), n_ctx_orig
        )
        attn_factor *= mscale
    x = m.tensor("token_embd.weight")[tokens]
    for il in range(L):
        W = lambda name, il=il: m.layer(il, name + ".weight")
        if swa[il]:
            turn = lambda a: rope(a, pos, z["n_rot"], z["rope_base"], neox=True)
        else:
            turn = lambda a: rope(
                a,
                pos,
                z["n_rot"],
                z["rope_base"],
                neox=True,
                freq_scale=freq_scale,
                factors=factors,
                attn_factor=attn_factor,
            )
        q = rms_norm(x @ W("attn_q").T, W("attn_q_norm"), eps)
        k = rms_norm(x @ W("attn_k").T, W("attn_k_norm"), eps)
        v = (x @ W("attn_v").T).reshape(T, G, -1)
        q, k = turn(q.reshape(T, H, D)), turn(k.reshape(T, G, D))
        o = attention(q, k, v, D**-0.5, window if swa[il] else 0) @ W("attn_output").T
        x = x + rms_norm(o, W("post_attention_norm"), eps)
        a = silu(x @ W("ffn_gate").T) * (x @ W("ffn_up").T)
        x = x + rms_norm(a @ W("ffn_down").T, W("post_ffw_norm"), eps)
    return rms_norm(x, m.tensor("output_norm.weight"), eps) @ m.output().T
