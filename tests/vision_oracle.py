"""A float64 numpy oracle of llama.cpp's vision encoders (tools/mtmd/clip.cpp, models/siglip.cpp,
models/llava.cpp), written from the specification and independent of engine/vision: it reads
the mmproj with gguf.GGUFReader and computes in float64 with exact GELU (no float16 table), so
agreeing with it within a tolerance checks the engine's layout, order and arithmetic.
"""

from __future__ import annotations

import math

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def _read(path) -> tuple[dict, dict]:
    r = GGUFReader(str(path))
    meta = {}
    for f in r.fields.values():
        if not f.types:
            continue
        if f.types[0].name == "STRING":
            meta[f.name] = bytes(f.parts[f.data[0]]).decode()
        elif f.types[0].name == "ARRAY":
            meta[f.name] = [f.parts[i].tolist()[0] for i in f.data]
        else:
            meta[f.name] = f.parts[f.data[0]].tolist()[0]
    tensors = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        tensors[t.name] = a.reshape([int(x) for x in reversed(t.shape)])
    return meta, tensors


def _ln(x, w, b, eps):
    mu = x.mean(axis=1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * w
    return y + b if b is not None else y


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _gelu_quick(x):
    return x / (1 + np.exp(-1.702 * x))


def encode(path, tile: np.ndarray) -> np.ndarray:
    """The embeddings (n_tokens, n_embd_lm) of a normalised (h, w, 3) tile."""
    meta, t = _read(path)
    kind = meta["clip.projector_type"]
    P = meta["clip.vision.patch_size"]
    E = meta["clip.vision.embedding_length"]
    H = meta["clip.vision.attention.head_count"]
    L = meta["clip.vision.block_count"]
    eps = meta["clip.vision.attention.layer_norm_epsilon"]
    act = _gelu if meta.get("clip.use_gelu") else _gelu_quick
    h, w = tile.shape[0] // P, tile.shape[1] // P
    x = np.zeros((h * w, E))
    kern = t["v.patch_embd.weight"]  # (E, 3, P, P)
    img = tile.astype(np.float64)
    for y in range(h):
        for xx in range(w):
            patch = img[y * P : (y + 1) * P, xx * P : (xx + 1) * P, :].transpose(2, 0, 1)
            x[y * w + xx] = np.tensordot(kern, patch, axes=([1, 2, 3], [0, 1, 2]))
    if "v.patch_embd.bias" in t:
        x += t["v.patch_embd.bias"]

    def lin(name, v):
        out = v @ t[name + ".weight"].T
        return out + t[name + ".bias"] if name + ".bias" in t else out

    def layer(il, x):
        p = f"v.blk.{il}."
        hh = _ln(x, t[p + "ln1.weight"], t[p + "ln1.bias"], eps)
        q, k, v = lin(p + "attn_q", hh), lin(p + "attn_k", hh), lin(p + "attn_v", hh)
        D = E // H
        att = np.zeros_like(q)
        for hd in range(H):
            sl = slice(hd * D, (hd + 1) * D)
            s = q[:, sl] @ k[:, sl].T / math.sqrt(D)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            att[:, sl] = s @ v[:, sl]
        x = x + lin(p + "attn_out", att)
        hh = _ln(x, t[p + "ln2.weight"], t[p + "ln2.bias"], eps)
        return x + lin(p + "ffn_down", act(lin(p + "ffn_up", hh)))

    if kind == "mlp":
        # clip.cpp (this llama.cpp) appends the class token after the patches, adds positions
        # 0..n, and reads rows 1..n_patches of the second-to-last layer's output
        x = np.concatenate([x, t["v.class_embd"][None, :]])
        x = x + t["v.position_embd.weight"][: len(x)]
        x = _ln(x, t["v.pre_ln.weight"], t["v.pre_ln.bias"], eps)
        for il in range(L - 1):
            x = layer(il, x)
        emb = x[1 : 1 + h * w]
        y = _gelu(lin("mm.0", emb))
        return lin("mm.2", y)
    x = x + t["v.position_embd.weight"][: len(x)]
    for il in range(L):
        x = layer(il, x)
    x = _ln(x, t["v.post_ln.weight"], t["v.post_ln.bias"], eps)
    s = meta["clip.vision.projector.scale_factor"]
    if kind == "gemma3":
        g = np.zeros((h // s, w // s, E))
        grid = x.reshape(h, w, E)
        for by in range(h // s):
            for bx in range(w // s):
                g[by, bx] = grid[by * s : (by + 1) * s, bx * s : (bx + 1) * s].mean(axis=(0, 1))
        g = g.reshape(-1, E)
        g = g / np.sqrt((g**2).mean(axis=1, keepdims=True) + eps) * t["mm.soft_emb_norm.weight"]
        return g @ t["mm.input_projection.weight"]  # stored (E, n_embd_lm)
    # idefics3: each s x s block -> one row, features ordered (dy, dx, channel)
    grid = x.reshape(h, w, E)
    rows = []
    for by in range(h // s):
        for bx in range(w // s):
            feats = [grid[by * s + dy, bx * s + dx] for dy in range(s) for dx in range(s)]
            rows.append(np.concatenate(feats))
    return np.array(rows) @ t["mm.model.fc.weight"].T
