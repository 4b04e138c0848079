"""The decoder forward pass over one ubatch, shared by every architecture.

Architectures differ only through ModelConfig flags (bias, Q/K norm, post-norms, activation,
sliding windows, embedding scale). Projections go through quants.matmul: quantised mat-vecs
for a few tokens (decode), dequantised tiles + BLAS for many (prefill).
"""

from __future__ import annotations

import numba
import numpy as np

from . import ops, parallel
from .batch import Batch
from .errors import ContextOverflowError, EngineError
from .memory import DECODE_TOKENS
from .quants import MATVEC_MAX_TOKENS, get_rows, matmul, matmul_many



def validate_batch(ctx, batch: Batch) -> None:
    if len(batch) == 0:
        raise EngineError("empty batch")
    V = ctx.cfg.n_vocab
    if batch.tokens.min() < 0 or batch.tokens.max() >= V:
        bad = int(batch.tokens[(batch.tokens < 0) | (batch.tokens >= V)][0])
        raise EngineError(f"token id {bad} out of range [0, {V})")
    if batch.seq_id.min() < 0 or batch.seq_id.max() >= ctx.n_seq_max:
        raise EngineError(f"sequence id out of range [0, {ctx.n_seq_max})")
    for s in np.unique(batch.seq_id):
        pos = batch.pos[batch.seq_id == s]
        p0 = ctx.kv.seq_len(int(s))
        if pos[0] != p0 or np.any(np.diff(pos) != 1):
            raise EngineError(
                f"sequence {int(s)}: positions must continue the sequence from {p0} in order "
                f"(got {int(pos[0])}..{int(pos[-1])})"
            )
        if pos[-1] >= ctx.n_ctx_seq:
            raise ContextOverflowError(
                f"sequence {int(s)}: {int(pos[-1]) + 1} tokens exceed the context size of "
                f"{ctx.n_ctx_seq} per sequence"
            )


def forward_ubatch(ctx, ub: Batch, out: np.ndarray, embeddings: bool) -> None:
    if len(ub) <= MATVEC_MAX_TOKENS:
        _forward(ctx, ub, out, embeddings)
        return
    # Batch path: BLAS owns the cores. numba's own workers would only fight OpenBLAS's
    # spinning threads for them (measured: pp512 swung 104-274 tok/s), so numba runs
    # single-threaded on the calling thread until the ubatch is done.
    n_threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        _forward(ctx, ub, out, embeddings)
    finally:
        numba.set_num_threads(n_threads)


def _forward(ctx, ub: Batch, out: np.ndarray, embeddings: bool) -> None:
    cfg, w, b, kv = ctx.cfg, ctx.model.weights, ctx.buf, ctx.kv
    T = len(ub)
    x, h = b.x[:T], b.h[:T]
    get_rows(w.token_embd, ub.tokens, x)
    if cfg.embed_scale != 1.0:
        x *= np.float32(cfg.embed_scale)
    groups = _seq_groups(ub)
    for il, lw in enumerate(w.layers):
        ops.rmsnorm(x, lw.attn_norm, cfg.norm_eps, h)
        _attention(ctx, il, lw, ub, groups, h, b.o[:T])
        if lw.post_attention_norm is not None:
            ops.rmsnorm(b.o[:T], lw.post_attention_norm, cfg.norm_eps, b.o[:T])
        x += b.o[:T]
        ops.rmsnorm(x, lw.ffn_norm, cfg.norm_eps, h)
        _ffn(ctx, lw, h, b.o[:T])
        if lw.post_ffw_norm is not None:
            ops.rmsnorm(b.o[:T], lw.post_ffw_norm, cfg.norm_eps, b.o[:T])
        x += b.o[:T]
    for s, idx in groups:
        kv.commit(s, int(ub.pos[idx[-1]]) + 1)
    sel = np.flatnonzero(ub.logits)
    if len(sel) == 0:
        return
    hs = h[: len(sel)]
    ops.rmsnorm(np.ascontiguousarray(x[sel]), w.output_norm, cfg.norm_eps, hs)
    if embeddings:
        out[:] = hs
        return
    matmul(w.output, hs, out, b.tile)
    if cfg.final_logit_softcap:
        c = np.float32(cfg.final_logit_softcap)
        np.tanh(out / c, out=out)
        out *= c


def _seq_groups(ub: Batch) -> list[tuple[int, np.ndarray]]:
    """(seq_id, indices into the ubatch) per sequence, in order of first appearance."""
    seqs, first = np.unique(ub.seq_id, return_index=True)
    return [(int(s), np.flatnonzero(ub.seq_id == s)) for s in seqs[np.argsort(first)]]


def _attention(ctx, il, lw, ub, groups, h, out) -> None:
    cfg, b, kv = ctx.cfg, ctx.buf, ctx.kv
    T = len(ub)
    H, G, D, Dv = cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v
    q, k, v = b.q[:T], b.k[:T], b.v[:T]
    matmul_many([lw.attn_q, lw.attn_k, lw.attn_v], h, [q, k, v], b.tile)
    if lw.attn_q_bias is not None:
        q += lw.attn_q_bias
        k += lw.attn_k_bias
        v += lw.attn_v_bias
    q3, k3, v3 = q.reshape(T, H, D), k.reshape(T, G, D), v.reshape(T, G, Dv)
    if lw.attn_q_norm is not None:
        ops.rmsnorm(q3.reshape(T * H, D), lw.attn_q_norm, cfg.norm_eps, q3.reshape(T * H, D))
        ops.rmsnorm(k3.reshape(T * G, D), lw.attn_k_norm, cfg.norm_eps, k3.reshape(T * G, D))
    base, scale = cfg.layer_rope_base(il), cfg.layer_rope_scale(il)
    ops.rope(q3, ub.pos, cfg.rope_dim, base, scale, cfg.rope_neox)
    ops.rope(k3, ub.pos, cfg.rope_dim, base, scale, cfg.rope_neox)
    kv.store(il, ub.seq_id, ub.pos, k3, v3)
    window = cfg.layer_window(il)
    attn = b.attn[:T].reshape(T, H, Dv)
    small = [idx for _, idx in groups if len(idx) <= DECODE_TOKENS]
    for s, idx in groups:
        if len(idx) > DECODE_TOKENS:
            L = int(ub.pos[idx[-1]]) + 1
            kf, vf = kv.read_f32(il, s, L)
            qs, ps = q3[idx], ub.pos[idx]
            res = np.empty((len(idx), H, Dv), np.float32)
            parts = parallel.split(len(idx), parallel.pool_size())

            def rows(p, _w, qs=qs, ps=ps, res=res, kf=kf, vf=vf, parts=parts):
                a, e = parts[p]
                ops.attention_chunk(qs[a:e], kf, vf, ps[a:e], window, cfg.kq_scale, res[a:e])

            parallel.run_parts(rows, len(parts))
            attn[idx] = res
    if small:
        tok = np.concatenate(small)
        for c0 in range(0, len(tok), DECODE_TOKENS):
            sel = tok[c0 : c0 + DECODE_TOKENS]
            res = np.empty((len(sel), H, Dv), np.float32)
            ops.attention_tokens(
                np.ascontiguousarray(q3[sel]), kv.k[il], kv.v[il], ub.seq_id[sel], ub.pos[sel],
                window, cfg.kq_scale, res, b.scores,
            )
            attn[sel] = res
    matmul(lw.attn_output, b.attn[:T], out, b.tile)


def _ffn(ctx, lw, h, out) -> None:
    b = ctx.buf
    T = h.shape[0]
    g, u = b.gate[:T], b.up[:T]
    matmul_many([lw.ffn_gate, lw.ffn_up], h, [g, u], b.tile)
    ops.gated_act(ctx.cfg.act, g, u, g)
    matmul(lw.ffn_down, g, out, b.tile)
