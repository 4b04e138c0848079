"""Layer offload to a GL device: the weights of the last -ngl layers (GpuModel, made at load),
and per context their KV cache, the compute scratch and the forward pass over them
(GpuContext.run).

Placement is llama.cpp's (backends.gpu_placement): the output head (output_norm, output)
counts as layer n_layer and the last N of layers 0..n_layer run on the GPU, so -ngl 1 moves
the head alone and -ngl n_layer + 1 everything. The token embeddings stay on the CPU.
Activations cross once per ubatch: the residual stream goes up before the first GPU layer and
comes down after the last (or the logits come down when the head is on the GPU).

A weight whose type has no shader stays on the CPU (logged): its mat-mul downloads its input,
runs the CPU kernel and uploads the result, between two GL submissions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ...buffers import buffer_shapes, compute_buffer_bytes
from ...config import ModelConfig
from ...models.spec import DecoderSpec
from ...quants import QTensor, matmul
from ..base import gpu_placement
from . import shaders
from .context import GLContext
from .device import MAX_GROUPS, NAME, Buffer, GLDevice, groups_1d, n_groups

log = logging.getLogger("ggstation.engine")

Op = Callable[[int], None]  # one GL step of a layer, given the ubatch's token count


@dataclass(frozen=True)
class ArchPlan:
    """What the GL backend needs to know of an architecture it runs: the part of its
    DecoderSpec (models/spec.py) that its shaders implement; gl_plan derives it."""

    act: str  # "silu" or "gelu"
    post_norms: bool  # gemma: attention and FFN outputs normed before the residual add
    head_norms: bool  # per-head Q/K RMSNorm
    final_softcap: Callable[[ModelConfig], float] = lambda cfg: 0.0  # logits soft-cap
    attn_softcap: Callable[[ModelConfig], float] = lambda cfg: 0.0  # attention scores soft-cap
    qkv_bias: bool = False  # attn_q_bias, attn_k_bias, attn_v_bias (qwen2)
    ffn_norm: str = "ffn_norm"  # the layer's norm before the feed-forward


def _final_softcap(cfg) -> float:
    return float(cfg.final_logit_softcap)


def _attn_softcap(cfg) -> float:
    return float(cfg.attn_logit_softcap)


def spec_reason(spec: DecoderSpec) -> str:
    """Which part of the description the GL backend does not implement ("" when none): the
    one place that decides which architectures it runs (the rest is config-level, in
    unsupported_reason)."""
    layer = spec.layer
    missing = [
        name
        for name, used in (
            ("fused Q|K|V and gate|up weights", layer.fused),
            ("a mixture of experts", layer.moe),
            ("residual scaling", layer.residual_scale),
            ("attention sinks", layer.sinks),
            ("an output projection bias", layer.o_bias),
            ("Q/K norms over whole projections", layer.qk_norm == "whole"),
            ("sublayers without pre-norms", not layer.pre_norms),
            ("logit scaling", spec.logit_scale),
        )
        if used
    ]
    return ", ".join(missing)


def gl_plan(spec: DecoderSpec) -> ArchPlan:
    """The GL plan of a description spec_reason accepts."""
    assert not spec_reason(spec), spec
    layer = spec.layer
    caps = dict(final_softcap=_final_softcap) if spec.final_softcap else {}
    caps |= dict(attn_softcap=_attn_softcap) if layer.attn_softcap else {}
    return ArchPlan(
        layer.act,
        layer.post_norms,
        layer.qk_norm == "head",
        qkv_bias=layer.qkv_bias,
        ffn_norm=layer.ffn_norm,
        **caps,
    )


def unsupported_reason(model) -> str:
    """Why this model cannot offload at all ("" when it can)."""
    missing = spec_reason(model.arch.spec)
    if missing:
        return (
            f"architecture {model.arch.name} has no OpenGL implementation (OpenGL lacks {missing})"
        )
    cfg = model.cfg
    if (
        cfg.head_dim % 2
        or cfg.head_dim_v % 2
        or max(cfg.head_dim, cfg.head_dim_v) > shaders.ATTN_MAX_DIM
    ):
        return f"head size {cfg.head_dim} is not supported by the OpenGL attention shader"
    # the RoPE shader turns rope_dim / 2 pairs on every layer (smollm3's NoPE layers turn none)
    if any(cfg.layer_rope(il, cfg.n_ctx_train).n_rot != cfg.rope_dim for il in range(cfg.n_layer)):
        return f"architecture {model.arch.name} has layers without RoPE, which OpenGL does not implement"
    return ""


@dataclass
class GpuTensor:
    """A weight matrix in its packed GGUF blocks in an SSBO."""

    buf: Buffer
    qtype: GGMLQuantizationType
    n_rows: int
    n_cols: int
    row_bytes: int

    @property
    def type_bytes(self) -> int:
        """Bytes of one block (of 32 or 256 weights; 4 or 2 for F32, F16)."""
        return GGML_QUANT_SIZES[self.qtype][1]


def tensor_reason(w: QTensor, max_bytes: int) -> str:
    """Why w cannot be on the GPU ("" when it can)."""
    if w.nbytes > max_bytes:
        return (
            f"its {w.nbytes / 2**20:.0f} MiB exceed the {max_bytes / 2**20:.0f} MiB one shader storage "
            "block may hold"
        )
    if w.qtype not in shaders.MATMUL_TYPES:
        return f"{w.qtype.name} has no OpenGL shader"
    if w.n_cols % 32:
        return f"{w.n_cols} columns are not a multiple of 32"
    return ""


def matmul_gl(
    dev: GLDevice,
    w: GpuTensor,
    T: int,
    scratch: Buffer,
    x_off: int,
    x_stride: int,
    o_off: int,
    o_stride: int,
    acc: bool,
) -> None:
    """out rows (T, n_rows) at o_off (+)= x rows (T, n_cols) at x_off @ w.T. On a GPU
    (dev.cooperative) a workgroup per row and token; on a software rasteriser an invocation
    per row, one token per pass for a few (decode), four from MATMUL4_MIN_TOKENS (prefill)."""
    assert x_off % 4 == 0 and x_stride % 4 == 0, "x rows are read as vec4s"
    q = w.qtype.name.lower() + ("_a" if w.row_bytes % 4 == 0 and w.type_bytes % 4 == 0 else "")
    if dev.cooperative:
        name, groups = f"matmulcoop_{q}", (min(w.n_rows, MAX_GROUPS), T, -(-w.n_rows // MAX_GROUPS))
    elif T >= shaders.MATMUL4_MIN_TOKENS:
        name, groups = f"matmul4_{q}", (n_groups(w.n_rows), -(-T // 4), 1)
    else:
        name, groups = f"matmul_{q}", (n_groups(w.n_rows), n_groups(T, shaders.MATMUL_TOKENS), 1)
    dev.dispatch(
        name,
        groups,
        (scratch, w.buf),
        (w.n_rows, w.n_cols, w.row_bytes, T, x_off, x_stride, o_off, o_stride, int(acc)),
    )


class GpuModel:
    """The offloaded layers' (and head's) weights on a GL device.

    Raises (from the constructor, on the GL thread's behalf): GLOutOfMemoryError,
    GLContextLostError; what was allocated is freed first.
    """

    def __init__(self, ctx: GLContext, dev: GLDevice, model, n_gpu_layers: int):
        cfg = model.cfg
        self.ctx, self.dev, self.cfg = ctx, dev, cfg
        self.plan = gl_plan(model.arch.spec)
        self.first_layer, self.head = gpu_placement(cfg.n_layer, n_gpu_layers)
        self.n_layers = cfg.n_layer - self.first_layer
        self.host_bytes = 0  # bytes of the file now served from the GPU
        self._buffers: list[Buffer] = []
        self.layers: list[dict[str, GpuTensor | QTensor | Buffer]] = []
        w = model.weights
        try:
            for il in range(self.first_layer, cfg.n_layer):
                lw = w.layers[il]
                self.layers.append({f.name: self._place(getattr(lw, f.name)) for f in fields(lw)})
            if self.head:
                tied = w.output is w.token_embd  # the CPU still reads it for the embeddings
                before = self.host_bytes
                self.output = self._place(w.output)
                if tied:
                    self.host_bytes = before
                if isinstance(self.output, GpuTensor):
                    self.output_norm = self._place(w.output_norm)
                else:  # the whole head stays then
                    log.warning("OpenGL: the output head stays on the CPU")
                    self.head = False
        except Exception:
            self.close()
            raise
        ctx.call(dev.gl.glFinish)

    def _place(self, v):
        if isinstance(v, np.ndarray):  # a norm vector
            buf = self.ctx.call(
                self.dev.alloc, v.nbytes, "weights", np.ascontiguousarray(v, np.float32)
            )
            self._buffers.append(buf)
            self.host_bytes += v.nbytes
            return buf
        reason = tensor_reason(v, self.dev.max_block_bytes)
        if reason:
            log.warning("OpenGL: %s stays on the CPU: %s", v.name, reason)
            return v
        raw = np.ascontiguousarray(v.raw).reshape(v.n_rows, -1).view(np.uint8)
        # + 4: the shaders read the uint after the last one they need (shaders.join)
        buf = self.ctx.call(self.dev.alloc, raw.nbytes + 4, "weights", raw)
        self._buffers.append(buf)
        self.host_bytes += v.nbytes
        return GpuTensor(buf, v.qtype, v.n_rows, v.n_cols, raw.shape[1])

    @property
    def weights_bytes(self) -> int:
        return sum(b.nbytes for b in self._buffers)

    def close(self) -> None:
        bufs, self._buffers = self._buffers, []
        if bufs and self.ctx.usable:
            self.ctx.call(_free_all, self.dev, bufs)


class GpuContext:
    """A context's share of the GPU: the KV cache of the offloaded layers (KVCache's
    DeviceKV), one compute scratch of buffers.compute_buffer_bytes, and the forward pass.

    Scratch layout (floats): the arrays of buffers.buffer_shapes in order; inside `tile`, int
    arrays pos, stream, cell, base and sel (n_ubatch each), then cos/sin tables per distinct
    RoPE, then rows of logits when the head is on the GPU.
    """

    def __init__(
        self,
        gm: GpuModel,
        cfg: ModelConfig,
        n_ubatch: int,
        n_ctx_seq: int,
        n_stream: int,
        type_k: str,
        type_v: str,
    ):
        self.gm, self.cfg, self.ctx, self.dev = gm, cfg, gm.ctx, gm.dev
        self.U, self.n_cells, self.n_stream = n_ubatch, n_ctx_seq, n_stream
        self.layers = frozenset(range(gm.first_layer, cfg.n_layer))
        self.kf16, self.vf16 = type_k == "f16", type_v == "f16"
        self._k: dict[int, Buffer] = {}
        self._v: dict[int, Buffer] = {}
        self._host: np.ndarray | None = None  # the CPU context's tile (fallback mat-muls)
        self._path: str | None = None  # and its decode path
        self.scratch = Buffer(0, 0, "compute")  # allocated below
        G = cfg.n_head_kv
        kbytes = n_stream * n_ctx_seq * G * cfg.head_dim * (2 if self.kf16 else 4)
        vbytes = n_stream * n_ctx_seq * G * cfg.head_dim_v * (2 if self.vf16 else 4)
        self._layout(n_ctx_seq)  # (raises before anything is allocated)
        try:
            self.scratch = self.ctx.call(
                self.dev.alloc, compute_buffer_bytes(cfg, n_ubatch, n_ctx_seq), "compute"
            )
            for il in sorted(self.layers):
                self._k[il] = self.ctx.call(self.dev.alloc, kbytes, "kv")
                self._v[il] = self.ctx.call(self.dev.alloc, vbytes, "kv")
        except Exception:
            self.close()
            raise
        self.plan = self._build_plan()

    # layout --------------------------------------------------------------------------------
    def _layout(self, n_ctx_seq: int) -> None:
        cfg, U = self.cfg, self.U
        self.off: dict[str, int] = {}
        self.width: dict[str, int] = {}
        at = 0
        for name, shape in buffer_shapes(cfg, U, n_ctx_seq).items():
            self.off[name], self.width[name] = at, shape[-1]
            at += int(np.prod(shape))
        t = self.off["tile"]
        self.i_pos, self.i_stream, self.i_cell, self.i_base, self.i_sel = (
            t + i * U for i in range(5)
        )
        ropes: dict[tuple, int] = {}
        self.rope_of: dict[int, int] = {}
        for il in sorted(self.layers):
            r = cfg.layer_rope(il, n_ctx_seq)
            key = (r.inv_freq.tobytes(), r.neox, r.attn_factor)
            self.rope_of[il] = ropes.setdefault(key, len(ropes))
        self.ropes = [
            next(
                cfg.layer_rope(il, n_ctx_seq) for il in sorted(self.layers) if self.rope_of[il] == i
            )
            for i in range(len(ropes))
        ]
        self.half = cfg.rope_dim // 2
        self.t_rope = t + 5 * U
        self.t_logits = self.t_rope + len(ropes) * 2 * U * self.half
        room = self.width["tile"] - (self.t_logits - t)
        self.logit_rows = room // cfg.n_vocab if self.gm.head else 0
        if room < 0 or (self.gm.head and self.logit_rows < 1):
            raise ValueError(
                "the compute scratch has no room for the RoPE tables and a row of logits"
            )

    @property
    def device_name(self) -> str:
        return NAME

    @property
    def scratch_bytes(self) -> int:
        return self.scratch.nbytes

    def cos_off(self, il: int) -> int:
        return self.t_rope + self.rope_of[il] * 2 * self.U * self.half

    # DeviceKV -------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in (*self._k.values(), *self._v.values()))

    def _geom(self, kind: str) -> tuple[dict[int, Buffer], np.dtype, int]:
        f16 = self.kf16 if kind == "k" else self.vf16
        D = self.cfg.head_dim if kind == "k" else self.cfg.head_dim_v
        return (self._k if kind == "k" else self._v), np.dtype(np.uint16 if f16 else np.float32), D

    def read(self, il: int, kind: str, stream: int, c0: int, c1: int) -> np.ndarray:
        bufs, dt, D = self._geom(kind)
        G = self.cfg.n_head_kv
        out = np.empty((max(0, c1 - c0), G, D), dt)
        off = (stream * self.n_cells + c0) * G * D * dt.itemsize
        if out.size:
            self.ctx.call(self.dev.download, bufs[il], off, out)
        return out

    def write(self, il: int, kind: str, stream: int, c0: int, data: np.ndarray) -> None:
        bufs, dt, D = self._geom(kind)
        G = self.cfg.n_head_kv
        off = (stream * self.n_cells + c0) * G * D * dt.itemsize
        if data.size:
            self.ctx.call(self.dev.upload, bufs[il], off, np.ascontiguousarray(data, dt))

    # the forward pass ------------------------------------------------------------------------
    def run(self, s, out: np.ndarray, embeddings: bool) -> bool:
        """Run the offloaded layers on s.x (UbatchState); with the head on the GPU also the
        head into out and return True; else bring s.x back and return False."""
        T = s.n_tokens
        stream, base = s.kv.token_cells(s.seq_id)
        sel = np.flatnonzero(s.logits)
        # (offset, values) for the scratch: per token its position, stream, cell and the cell
        # of its sequence's position 0; the rows that want output; cos and sin of each RoPE
        inputs = [
            (self.i_pos, s.pos),
            (self.i_stream, stream),
            (self.i_cell, base + s.pos),
            (self.i_base, base),
            (self.i_sel, sel),
        ]
        inputs = [(o, np.asarray(v, np.int32).view(np.float32)) for o, v in inputs]
        for i, r in enumerate(self.ropes):
            theta = s.pos[:, None].astype(np.float64) * r.inv_freq[None, :]
            co = self.t_rope + i * 2 * self.U * self.half
            inputs += [
                (co, (np.cos(theta) * r.attn_factor).astype(np.float32)),
                (co + self.U * self.half, (np.sin(theta) * r.attn_factor).astype(np.float32)),
            ]
        self._host, self._path = s.tile, s.path
        x = np.ascontiguousarray(s.x)
        inputs.append((self.off["x"], x))
        for on_gpu, ops in self.plan:
            if on_gpu:
                self.ctx.call(self._submit, ops, T, inputs)
                inputs = []  # up once, before the first GPU op
            else:
                for op in ops:
                    op(T)
        if self.gm.head:
            if len(sel):
                self.ctx.call(
                    self._submit, [lambda T: self._head(T, sel, out, embeddings)], T, inputs
                )
            return True
        self.ctx.call(self.dev.download, self.scratch, 4 * self.off["x"], x)
        s.x[:] = x
        return False

    def _submit(self, ops: list[Op], T: int, inputs: list[tuple[int, np.ndarray]]) -> None:
        self.ctx.check_lost()
        for off, values in inputs:
            if values.size:
                self.dev.upload(self.scratch, 4 * off, values)
        for op in ops:
            op(T)
        self.ctx.check_lost()

    def _head(self, T: int, sel: np.ndarray, out: np.ndarray, embeddings: bool) -> None:
        gm, E, V, n = self.gm, self.cfg.n_embd, self.cfg.n_vocab, len(sel)
        self._norm_rows(n, "x", "h", gm.output_norm, gather=self.i_sel)
        if embeddings:
            self.dev.download(self.scratch, 4 * self.off["h"], out[:n])
            return
        rows = np.empty((min(n, self.logit_rows), V), np.float32)
        for j0 in range(0, n, self.logit_rows):
            j1 = min(n, j0 + self.logit_rows)
            self._matmul_at(gm.output, j1 - j0, self.off["h"] + j0 * E, E, self.t_logits, V, False)
            self.dev.download(self.scratch, 4 * self.t_logits, rows[: j1 - j0])
            out[j0:j1] = rows[: j1 - j0]
        softcap = self.gm.plan.final_softcap(self.cfg)
        if softcap:
            c = np.float32(softcap)
            out[:n] /= c
            np.tanh(out[:n], out=out[:n])
            out[:n] *= c

    # ops -------------------------------------------------------------------------------------
    def _matmul_at(
        self, w: GpuTensor, T: int, x_off: int, x_stride: int, o_off: int, o_stride: int, acc: bool
    ) -> None:
        matmul_gl(self.dev, w, T, self.scratch, x_off, x_stride, o_off, o_stride, acc)

    def _norm_rows(
        self,
        rows: int,
        src: str | int,
        dst: str | int,
        w: Buffer,
        n: int = 0,
        mode: int = 0,
        gather: int = -1,
    ) -> None:
        n = n or self.cfg.n_embd
        so = self.off[src] if isinstance(src, str) else src
        do = self.off[dst] if isinstance(dst, str) else dst
        self.dev.dispatch(
            "rmsnorm",
            groups_1d(rows),
            (self.scratch, w),
            (rows, n, so, n, do, n, mode, gather),
            (self.cfg.norm_eps,),
        )

    def _build_plan(self) -> list[tuple[bool, list[Op]]]:
        """The ops of every offloaded layer, grouped into runs that stay on the GL thread."""
        plan: list[tuple[bool, list[Op]]] = []
        for il, lw in zip(sorted(self.layers), self.gm.layers, strict=True):
            for on_gpu, op in self._layer_ops(il, lw):
                if plan and plan[-1][0] == on_gpu:
                    plan[-1][1].append(op)
                else:
                    plan.append((on_gpu, [op]))
        return plan

    def _mm(self, w, src: str, dst: str, acc: bool = False) -> tuple[bool, Op]:
        """out[dst] (+)= w @ src rows, on the GPU, or through the CPU for a CPU tensor."""
        if isinstance(w, GpuTensor):
            xo, xs, oo, os_ = self.off[src], self.width[src], self.off[dst], self.width[dst]
            return True, lambda T: self._matmul_at(w, T, xo, xs, oo, os_, acc)
        return False, lambda T: self._cpu_matmul(w, src, dst, acc, T)

    def _cpu_matmul(self, w: QTensor, src: str, dst: str, acc: bool, T: int) -> None:
        x = np.empty((T, self.width[src]), np.float32)
        self.ctx.call(self.dev.download, self.scratch, 4 * self.off[src], x)
        y = np.empty((T, self.width[dst]), np.float32)
        matmul(w, x, y, self._host, self._path)
        if acc:
            prev = np.empty_like(y)
            self.ctx.call(self.dev.download, self.scratch, 4 * self.off[dst], prev)
            y += prev
        self.ctx.call(self.dev.upload, self.scratch, 4 * self.off[dst], y)

    def _gpu(self, fn: Callable[[int], None]) -> tuple[bool, Op]:
        return True, fn

    def _bias_op(self, name: str, b: Buffer) -> Op:
        o, w = self.off[name], self.width[name]
        return lambda T: self.dev.dispatch(
            "add_rows", groups_1d(T * w), (self.scratch, b), (o, T * w, w)
        )

    def _layer_ops(self, il: int, lw: dict) -> list[tuple[bool, Op]]:
        cfg, plan = self.cfg, self.gm.plan
        H, G, D, Dv = cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v
        off, dev, sc = self.off, self.dev, self.scratch
        kb, vb = self._k[il], self._v[il]
        window, co = cfg.layer_window(il), self.cos_off(il)
        half, neox = self.half, int(self.ropes[self.rope_of[il]].neox)
        ops: list[tuple[bool, Op]] = []
        g = self._gpu
        ops.append(g(lambda T: self._norm_rows(T, "x", "h", lw["attn_norm"])))
        ops += [
            self._mm(lw["attn_q"], "h", "q"),
            self._mm(lw["attn_k"], "h", "k"),
            self._mm(lw["attn_v"], "h", "v"),
        ]
        if plan.qkv_bias:
            for name in ("q", "k", "v"):
                ops.append(g(self._bias_op(name, lw[f"attn_{name}_bias"])))
        if plan.head_norms:
            ops.append(g(lambda T: self._norm_rows(T * H, "q", "q", lw["attn_q_norm"], n=D)))
            ops.append(g(lambda T: self._norm_rows(T * G, "k", "k", lw["attn_k_norm"], n=D)))

        def rope(T: int) -> None:
            for name, heads in (("q", H), ("k", G)):
                dev.dispatch(
                    "rope",
                    groups_1d(T * heads * half),
                    (sc,),
                    (off[name], T, heads, D, half, neox, co, co + self.U * half),
                )
            kw, vw = G * D, G * Dv
            dev.dispatch(
                "kv_store",
                groups_1d(T * (kw + vw) // 2),
                (sc, kb, vb),
                (
                    off["k"],
                    off["v"],
                    T,
                    kw,
                    vw,
                    self.i_stream,
                    self.i_cell,
                    self.n_cells,
                    int(self.kf16),
                    int(self.vf16),
                ),
            )
            dev.dispatch(
                "attention",
                (H, T),
                (sc, kb, vb),
                (
                    off["q"],
                    off["attn"],
                    H,
                    G,
                    D,
                    Dv,
                    self.i_pos,
                    self.i_stream,
                    self.i_base,
                    self.n_cells,
                    window,
                    int(self.kf16),
                    int(self.vf16),
                ),
                (cfg.kq_scale, plan.attn_softcap(cfg)),
            )

        ops.append(g(rope))
        if plan.post_norms:
            ops.append(self._mm(lw["attn_output"], "attn", "o"))
            ops.append(g(lambda T: self._norm_rows(T, "o", "x", lw["post_attention_norm"], mode=1)))
        else:
            ops.append(self._mm(lw["attn_output"], "attn", "x", acc=True))
        ops.append(g(lambda T: self._norm_rows(T, "x", "h", lw[plan.ffn_norm])))
        ops += [self._mm(lw["ffn_gate"], "h", "gate"), self._mm(lw["ffn_up"], "h", "up")]
        F, kind = cfg.n_ff, 0 if plan.act == "silu" else 1
        ops.append(
            g(
                lambda T: dev.dispatch(
                    "gated_act",
                    groups_1d(T * F),
                    (sc,),
                    (off["gate"], off["up"], T * F, kind, F, F, F),
                )
            )
        )
        if plan.post_norms:
            ops.append(self._mm(lw["ffn_down"], "gate", "o"))
            ops.append(g(lambda T: self._norm_rows(T, "o", "x", lw["post_ffw_norm"], mode=1)))
        else:
            ops.append(self._mm(lw["ffn_down"], "gate", "x", acc=True))
        return ops

    def close(self) -> None:
        bufs = [*self._k.values(), *self._v.values()]
        if self.scratch.id:
            bufs.append(self.scratch)
        self._k, self._v = {}, {}
        if bufs and self.ctx.usable:
            self.ctx.call(_free_all, self.dev, bufs)


def _free_all(dev: GLDevice, bufs: list[Buffer]) -> None:
    for b in bufs:
        dev.free(b)
