"""Float64 mixture-of-experts feed-forward (llama.cpp build_moe_ffn), for the MoE oracles."""

import numpy as np

from .common import silu


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def moe_ffn(m, il: int, h: np.ndarray, k: int, norm_w: bool) -> np.ndarray:
    """h (T, n_embd): softmax over the router logits, the k most probable experts (stable
    order among ties), their weights optionally normalised to sum 1, then the weighted sum of
    down(silu(gate h) * up h) over those experts."""
    probs = softmax(h @ m.layer(il, "ffn_gate_inp.weight").T)  # (T, n_expert)
    gate = m.layer(il, "ffn_gate_exps.weight")  # (n_expert, n_ff_exp, n_embd)
    up = m.layer(il, "ffn_up_exps.weight")
    down = m.layer(il, "ffn_down_exps.weight")  # (n_expert, n_embd, n_ff_exp)
    out = np.zeros_like(h)
    for t in range(len(h)):
        sel = np.argsort(-probs[t], kind="stable")[:k]
        w = probs[t, sel]
        if norm_w:
            w = w / w.sum()
        for e, we in zip(sel, w, strict=True):
            out[t] += we * (down[e] @ (silu(gate[e] @ h[t]) * (up[e] @ h[t])))
    return out
