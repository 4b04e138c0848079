"""The shared pieces every architecture's block is built from (llama.cpp's build_norm,
build_qkv, build_attn, build_ffn): RMSNorm, Q/K/V projections, attention over the KV cache,
gated feed-forward, and the model's embedding and head.

Each piece works on one ubatch through its `UbatchState`: preallocated buffer views sized to
the ubatch, its positions and sequences, and the KV cache. A piece writes into the state's
buffers and returns the view it wrote, so a block reads as a short chain of calls, e.g.

    q, k, v = qkv(s, norm(s, s.x, lw.attn_norm), lw.attn_q, lw.attn_k, lw.attn_v)
    s.x += attention(s, il, q, k, v, lw.attn_output)
    s.x += ffn(s, norm(s, s.x, lw.ffn_norm), lw.ffn_gate, lw.ffn_up, lw.ffn_down, "silu")

Projections go through quants.matmul on the context's decode path (UbatchState.path):
quantised mat-vecs for a few tokens (decode), dequantised tiles + BLAS for many (prefill).
"""

from __future__ import annotations

import numpy as np

from .. import ops, parallel
from ..batch import Batch
from ..quants import QTensor, get_rows, matmul, matmul_many

# Sequences with at most this many tokens in a ubatch use the per-token attention kernel
# (attention below); longer chunks use BLAS.
DECODE_TOKENS = 16
# From this many tokens a ubatch computes each RoPE's cos/sin table once, for every layer.
ROPE_TABLE_MIN_TOKENS = 16
# Query rows per prefill attention part (BLAS stays efficient; causal prefixes get trimmed).
PREFILL_QUERY_CHUNK = 64


class UbatchState:
    """One ubatch's inputs, the KV cache and (T, width) views of the context's buffers."""

    def __init__(self, ctx, ub: Batch):
        cfg, b = ctx.cfg, ctx.buf
        T = len(ub)
        self.cfg, self.kv, self.buf, self.tile = cfg, ctx.kv, b, b.tile
        self.path: str = ctx.decode_path  # the context's decode path, passed to every mat-mul
        self.n_tokens, self.tokens, self.pos, self.seq_id = T, ub.tokens, ub.pos, ub.seq_id
        self.logits = ub.logits  # (T,) bool: entries that want output
        self.embd = ub.embd  # (T, n_embd) rows for the entries with a negative token, or None
        # the last position each entry sees (image spans that see each other), or None: causal
        self.attn_end = ub.attn_end
        self.noncausal: set[int] = (
            set()
            if ub.attn_end is None
            else {int(q) for q in np.unique(ub.seq_id[ub.attn_end > ub.pos])}
        )
        self.x, self.h, self.o = b.x[:T], b.h[:T], b.o[:T]  # residual, normed input, block output
        self.q, self.k, self.v, self.attn = b.q[:T], b.k[:T], b.v[:T], b.attn[:T]
        self.gate, self.up = b.gate[:T], b.up[:T]
        # per-head views (T, n_head, head_dim), (T, n_head_kv, head_dim), (T, n_head_kv, head_dim_v)
        self.q3 = self.q.reshape(T, cfg.n_head, cfg.head_dim)
        self.k3 = self.k.reshape(T, cfg.n_head_kv, cfg.head_dim)
        self.v3 = self.v.reshape(T, cfg.n_head_kv, cfg.head_dim_v)
        # (seq_id, indices into the ubatch) per sequence, in order of first appearance
        seqs, first = np.unique(ub.seq_id, return_index=True)
        self.groups = [(int(q), np.flatnonzero(ub.seq_id == q)) for q in seqs[np.argsort(first)]]
        # tokens of sequences with few tokens here: the per-token attention kernel serves them
        small = [
            idx for q, idx in self.groups if len(idx) <= DECODE_TOKENS and q not in self.noncausal
        ]
        self.small = np.concatenate(small) if small else None
        # (tokens, kv.token_cells of them) per attention-kernel call, made at the first layer
        # (after the cells are reserved) and kept for the others
        self.small_groups: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        self._rope_tables: dict[tuple[bytes, float], np.ndarray] = {}

    def rope_table(self, rope) -> np.ndarray:
        """ops.rope_table of this ubatch's positions for a layer's Rope, made once per distinct
        RoPE (gemma3: one for its sliding layers, one for its global ones)."""
        key = (rope.inv_freq.tobytes(), float(rope.attn_factor))
        cs = self._rope_tables.get(key)
        if cs is None:
            cs = self._rope_tables[key] = ops.rope_table(self.pos, rope.inv_freq, rope.attn_factor)
        return cs


def norm(s: UbatchState, x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """RMSNorm of the rows of x, times w, into out (default s.h, may be x); returns out."""
    out = s.h if out is None else out
    ops.rmsnorm(x, w, s.cfg.norm_eps, out)
    return out


def norm_heads(s: UbatchState, x: np.ndarray, w: np.ndarray) -> None:
    """RMSNorm of every head of x (T, heads, head_dim) in place (Q/K norm: qwen3, gemma3)."""
    rows = x.reshape(-1, x.shape[2])
    ops.rmsnorm(rows, w, s.cfg.norm_eps, rows)


def qkv(
    s: UbatchState,
    h: np.ndarray,
    wq: QTensor,
    wk: QTensor,
    wv: QTensor,
    bq: np.ndarray | None = None,
    bk: np.ndarray | None = None,
    bv: np.ndarray | None = None,
):
    """Queries (T, n_head, head_dim), keys and values (T, n_head_kv, .) of h (T, n_embd),
    plus optional biases. One fused kernel launch for a single token."""
    matmul_many([wq, wk, wv], h, [s.q, s.k, s.v], s.tile, s.path)
    if bq is not None:
        s.q += bq
        s.k += bk
        s.v += bv
    return s.q3, s.k3, s.v3


def qkv_fused(s: UbatchState, h: np.ndarray, wqkv: QTensor):
    """As qkv, from one weight whose output rows are Q | K | V (attn_qkv); needs the
    architecture's extra activation "qkv" (width q_dim + 2 kv_dim)."""
    out = s.buf.qkv[: s.n_tokens]
    matmul(wqkv, h, out, s.tile, s.path)
    qd, kd = s.q.shape[1], s.k.shape[1]
    np.copyto(s.q, out[:, :qd])
    np.copyto(s.k, out[:, qd : qd + kd])
    np.copyto(s.v, out[:, qd + kd :])
    return s.q3, s.k3, s.v3


def attention(
    s: UbatchState,
    il: int,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    wo: QTensor,
    softcap: float = 0.0,
    sinks: np.ndarray | None = None,
    bo: np.ndarray | None = None,
) -> np.ndarray:
    """Self-attention of layer il; returns the output projection (T, n_embd) in s.o.

    RoPE on q and k (the cache's rotation for this layer), k and v stored in the KV cache, then
    each token attends to its own sequence's cached positions: causal, within the layer's
    sliding window, scores q.k * cfg.kq_scale, capped to softcap * tanh(score / softcap) when
    softcap > 0, grouped-query heads sharing KV heads. sinks (n_head,): a learned logit per
    head in its softmax denominator (attn_sinks, gpt-oss); bo: the output projection's bias.
    """
    kv, rope = s.kv, s.kv.rope[il]
    if s.n_tokens >= ROPE_TABLE_MIN_TOKENS:
        cs = s.rope_table(rope)
        ops.rope_apply(q, cs, rope.neox)
        ops.rope_apply(k, cs, rope.neox)
    else:
        ops.rope(q, s.pos, rope.inv_freq, rope.neox, rope.attn_factor)
        ops.rope(k, s.pos, rope.inv_freq, rope.neox, rope.attn_factor)
    kv.store(il, s.seq_id, s.pos, k, v)
    window, scale = kv.window[il], s.cfg.kq_scale
    T, H, Dv = s.n_tokens, q.shape[1], v.shape[2]
    attn = s.attn.reshape(T, H, Dv)
    for seq, idx in s.groups:
        # a prompt chunk (or an image span that sees itself): BLAS over the sequence's cache
        if len(idx) > DECODE_TOKENS or seq in s.noncausal:
            qs, ps = q[idx], s.pos[idx]
            vis = ps if s.attn_end is None else s.attn_end[idx]
            kf, vf = kv.read_f32(il, seq, int(vis.max()) + 1)
            res = np.empty((len(idx), H, Dv), np.float32)
            # Chunks of queries, each against only the keys it can see (its causal prefix,
            # within the window): half the score matrix of a causal prompt is never computed.
            n_parts = max(parallel.pool_size(), -(-len(idx) // PREFILL_QUERY_CHUNK))
            parts = parallel.split(len(idx), n_parts)

            def rows(p, _w, qs=qs, ps=ps, vis=vis, res=res, kf=kf, vf=vf, parts=parts):
                a, e = parts[p]
                hi = int(vis[a:e].max()) + 1  # the last key any of these queries sees
                lo = max(0, int(ps[a]) - window + 1) if window > 0 else 0
                ops.attention_chunk(
                    qs[a:e],
                    kf[lo:hi],
                    vf[lo:hi],
                    ps[a:e],
                    window,
                    scale,
                    softcap,
                    res[a:e],
                    sinks,
                    lo,
                    None if vis is ps else vis[a:e],
                )

            parallel.run_parts(rows, len(parts))
            attn[idx] = res
    if s.small is not None:  # decode tokens (of any sequences): one kernel call per 16
        if s.small_groups is None:
            s.small_groups = [
                (sel, *kv.token_cells(s.seq_id[sel]))
                for sel in (
                    s.small[c0 : c0 + DECODE_TOKENS] for c0 in range(0, len(s.small), DECODE_TOKENS)
                )
            ]
        for sel, kv_rows, kv_base in s.small_groups:
            res = np.empty((len(sel), H, Dv), np.float32)
            ops.attention_tokens(
                np.ascontiguousarray(q[sel]),
                kv.k[il],
                kv.v[il],
                kv_rows,
                s.pos[sel],
                window,
                scale,
                softcap,
                res,
                sinks,
                kv_base,
            )
            attn[sel] = res
    matmul(wo, s.attn, s.o, s.tile, s.path)
    if bo is not None:
        s.o += bo
    return s.o


def ffn(
    s: UbatchState, h: np.ndarray, gate: QTensor, up: QTensor, down: QTensor, act: str
) -> np.ndarray:
    """Gated feed-forward down(act(gate h) * up h), act "silu" or "gelu"; returns s.o."""
    matmul_many([gate, up], h, [s.gate, s.up], s.tile, s.path)
    ops.gated_act(act, s.gate, s.up, s.gate)
    matmul(down, s.gate, s.o, s.tile, s.path)
    return s.o


def ffn_fused(s: UbatchState, h: np.ndarray, gate_up: QTensor, down: QTensor) -> np.ndarray:
    """SwiGLU feed-forward from one weight whose output rows are gate | up (phi3's ffn_up);
    needs the architecture's extra activation "gate_up" (width 2 n_ff). Returns s.o."""
    gu = s.buf.gate_up[: s.n_tokens]
    matmul(gate_up, h, gu, s.tile, s.path)
    ops.swiglu_fused(gu, s.gate)
    matmul(down, s.gate, s.o, s.tile, s.path)
    return s.o


def embed(s: UbatchState, w, scale: float = 1.0) -> None:
    """s.x = token embeddings of the ubatch, times scale (gemma: sqrt(n_embd)); the entries
    with a negative token take their row of s.embd, unscaled (llama.cpp scales token inputs
    only: an image's embeddings enter as the projector made them)."""
    tokens, embd = s.tokens, s.embd
    if embd is not None:
        tokens = np.where(tokens < 0, 0, tokens).astype(np.int32)
    get_rows(w.token_embd, tokens, s.x)
    if scale != 1.0:
        s.x *= np.float32(scale)
    if embd is not None:
        rows = np.flatnonzero(s.tokens < 0)
        s.x[rows] = embd[rows]


def head(s: UbatchState, w, out: np.ndarray, embeddings: bool, softcap: float = 0.0) -> None:
    """For the ubatch entries that want output: final norm, then logits (n_out, n_vocab) into
    out, capped to softcap * tanh(logit / softcap) when softcap > 0; with embeddings=True
    the normed hidden states (n_out, n_embd) instead."""
    sel = np.flatnonzero(s.logits)
    if len(sel) == 0:
        return
    hs = s.h[: len(sel)]
    ops.rmsnorm(np.ascontiguousarray(s.x[sel]), w.output_norm, s.cfg.norm_eps, hs)
    if embeddings:
        out[:] = hs
        return
    matmul(w.output, hs, out, s.tile, s.path)
    if softcap:
        c = np.float32(softcap)
        out /= c
        np.tanh(out, out=out)
        out *= c
