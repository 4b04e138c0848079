"""The vision tower and its projector: one preprocessed image tile in, the text model's
embeddings out (llama.cpp's clip_image_encode, with tools/mtmd/clip.cpp and its models/
siglip.cpp and llava.cpp as the specification).

The tower is a ViT: patch embedding (a stride-`patch` convolution), learned positions, layers of
LayerNorm -> multi-head attention -> residual -> LayerNorm -> MLP -> residual. Then per projector:
  gemma3    post-LN, k x k average pool of the patch grid, RMSNorm * soft_emb_norm, input_projection
  idefics3  post-LN, pixel shuffle (n_merge^2 neighbouring patches concatenated), mm.model.fc
  mlp       LLaVA 1.5: class token, pre-LN, all layers but the last (or up to the deepest feature
            layer), mm.0 -> GELU -> mm.2

The matrices are the engine's QTensors (any supported weight type) multiplied by quants.matmul
on the engine's thread pool; GELU goes through ggml's float16 table as llama.cpp's CPU backend
computes it.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from .. import ops, parallel
from ..errors import EngineError, GGUFError, MissingTensorError
from ..gguf_file import GGUFFile
from ..jit import kernel
from ..quants import TILE_ROWS, QTensor, matmul, vec_dot_types
from .clip_file import ClipHParams

_VEC_DOT = vec_dot_types()


@dataclass
class VitLayer:
    ln1_w: np.ndarray
    ln1_b: np.ndarray
    q: QTensor
    q_b: np.ndarray | None
    k: QTensor
    k_b: np.ndarray | None
    v: QTensor
    v_b: np.ndarray | None
    o: QTensor
    o_b: np.ndarray | None
    ln2_w: np.ndarray
    ln2_b: np.ndarray
    up: QTensor
    up_b: np.ndarray | None
    down: QTensor
    down_b: np.ndarray | None


@dataclass
class ClipWeights:
    patch_w: np.ndarray  # (n_embd, 3 * patch * patch) float32, channel-major patches
    patch_w_f16: bool  # ggml's im2col rounds the pixels to the kernel's float16
    patch_b: np.ndarray | None
    pos_embd: np.ndarray  # (n_pos, n_embd)
    class_embd: np.ndarray | None
    pre_ln: tuple[np.ndarray, np.ndarray | None] | None
    post_ln: tuple[np.ndarray, np.ndarray | None] | None
    layers: list[VitLayer]
    mm: dict[str, QTensor]  # the projector's matrices by short name ("0", "fc")
    mm_v: dict[str, np.ndarray]  # its vectors and dense arrays ("0_b", "soft_emb_norm")

    def max_cols(self) -> int:
        """The widest matrix input, for the dequantised-tile scratch."""
        cols = [t.n_cols for lw in self.layers for t in (lw.q, lw.up, lw.down)]
        cols += [t.n_cols for t in self.mm.values()]
        return max(cols, default=1)


def _opt_vec(f: GGUFFile, name: str, n: int) -> np.ndarray | None:
    return f.vector(name, n) if name in f.tensors else None


def load_weights(f: GGUFFile, hp: ClipHParams, n_embd_lm: int) -> ClipWeights:
    """Bind the tower's and the projector's tensors (shapes checked); MissingTensorError names
    the first one missing."""
    E, F, P = hp.n_embd, hp.n_ff, hp.patch_size

    def need(name: str) -> None:
        if name not in f.tensors:
            raise MissingTensorError(
                f"{f.path}: missing tensor '{name}' (projector {hp.projector_type})"
            )

    need("v.patch_embd.weight")
    info = f.tensors["v.patch_embd.weight"]
    if int(np.prod(info.shape)) != E * 3 * P * P:
        raise GGUFError(
            f"{f.path}: v.patch_embd.weight has shape {list(info.shape)}, expected "
            f"[{P}, {P}, 3, {E}]"
        )
    patch_w = f.vector("v.patch_embd.weight").reshape(E, 3 * P * P)
    n_side = hp.n_patches_side
    n_pos = n_side * n_side + (1 if "v.class_embd" in f.tensors else 0)
    need("v.position_embd.weight")
    pos = f.vector("v.position_embd.weight")
    if pos.size != n_pos * E:
        raise GGUFError(
            f"{f.path}: v.position_embd.weight has {pos.size} elements, expected {n_pos} x {E}"
        )

    def ln(prefix: str) -> tuple[np.ndarray, np.ndarray | None] | None:
        if f"{prefix}.weight" not in f.tensors:
            return None
        return f.vector(f"{prefix}.weight", E), _opt_vec(f, f"{prefix}.bias", E)

    layers = []
    for il in range(hp.n_layer):
        p = f"v.blk.{il}"
        for t in ("ln1", "ln2", "attn_q", "attn_k", "attn_v", "attn_out", "ffn_up", "ffn_down"):
            need(f"{p}.{t}.weight")
        up, down = f"{p}.ffn_up", f"{p}.ffn_down"
        # llama.cpp's fix for files converted with fc1/fc2 named the other way round
        if f.tensors[f"{down}.weight"].shape[0] == E and f.tensors[f"{up}.weight"].shape[0] != E:
            up, down = down, up
        layers.append(
            VitLayer(
                ln1_w=f.vector(f"{p}.ln1.weight", E),
                ln1_b=f.vector(f"{p}.ln1.bias", E),
                q=f.qtensor(f"{p}.attn_q.weight", (E, E)),
                q_b=_opt_vec(f, f"{p}.attn_q.bias", E),
                k=f.qtensor(f"{p}.attn_k.weight", (E, E)),
                k_b=_opt_vec(f, f"{p}.attn_k.bias", E),
                v=f.qtensor(f"{p}.attn_v.weight", (E, E)),
                v_b=_opt_vec(f, f"{p}.attn_v.bias", E),
                o=f.qtensor(f"{p}.attn_out.weight", (E, E)),
                o_b=_opt_vec(f, f"{p}.attn_out.bias", E),
                ln2_w=f.vector(f"{p}.ln2.weight", E),
                ln2_b=f.vector(f"{p}.ln2.bias", E),
                up=f.qtensor(f"{up}.weight", (E, F)),
                up_b=_opt_vec(f, f"{up}.bias", F),
                down=f.qtensor(f"{down}.weight", (F, E)),
                down_b=_opt_vec(f, f"{down}.bias", E),
            )
        )
    mm: dict[str, QTensor] = {}
    mm_v: dict[str, np.ndarray] = {}
    kind = hp.projector_type
    if kind == "gemma3":
        need("mm.soft_emb_norm.weight")
        need("mm.input_projection.weight")
        mm_v["soft_emb_norm"] = f.vector("mm.soft_emb_norm.weight", E)
        proj = f.vector("mm.input_projection.weight")
        if proj.size != E * n_embd_lm:
            raise GGUFError(
                f"{f.path}: mm.input_projection.weight has {proj.size} elements, expected "
                f"{E} x {n_embd_lm} (the text model's embedding length)"
            )
        # ggml shape (n_embd_lm, E): clip.cpp multiplies by its transpose
        mm_v["input_projection"] = np.ascontiguousarray(proj.reshape(E, n_embd_lm))
        # ggml multiplies a float16 matrix with float16-rounded activations
        mm_v["input_projection_f16"] = np.array(
            f.tensors["mm.input_projection.weight"].qtype == GGMLQuantizationType.F16
        )
    elif kind == "idefics3":
        need("mm.model.fc.weight")
        mm["fc"] = f.qtensor("mm.model.fc.weight", (E * hp.n_merge**2, n_embd_lm))
    elif kind == "mlp":
        need("mm.0.weight")
        w0 = f.qtensor("mm.0.weight")
        if w0.n_cols != E * max(1, len(hp.feature_layers) or 1):
            raise GGUFError(f"{f.path}: mm.0.weight takes {w0.n_cols} inputs, expected {E}")
        mm["0"], mm_v["0_b"] = w0, f.vector("mm.0.bias", w0.n_rows)
        if "mm.2.weight" in f.tensors:
            w2 = f.qtensor("mm.2.weight", (w0.n_rows, n_embd_lm))
            mm["2"], mm_v["2_b"] = w2, f.vector("mm.2.bias", n_embd_lm)
        elif w0.n_rows != n_embd_lm:
            raise GGUFError(f"{f.path}: mm.0 gives {w0.n_rows} outputs, expected {n_embd_lm}")
    return ClipWeights(
        patch_w=patch_w,
        patch_w_f16=info.qtype == GGMLQuantizationType.F16,
        patch_b=_opt_vec(f, "v.patch_embd.bias", E),
        pos_embd=pos.reshape(n_pos, E),
        class_embd=_opt_vec(f, "v.class_embd", E),
        pre_ln=ln("v.pre_ln"),
        post_ln=ln("v.post_ln"),
        layers=layers,
        mm=mm,
        mm_v=mm_v,
    )


# --- the pieces ---------------------------------------------------------------------------


def _f16_rows(x, out):  # float32 rounded to the nearest float16 (ties to even), as float32
    flat, res = x.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint32)
    for i in range(flat.size):
        b = flat[i]
        mag = b & np.uint32(0x7FFFFFFF)
        if mag >= np.uint32(0x477FF000):  # rounds past float16's largest (65504), or nan/inf
            if mag > np.uint32(0x7F800000):
                res[i] = b  # nan
            else:
                res[i] = (b & np.uint32(0x80000000)) | np.uint32(0x7F800000)
        elif mag >= np.uint32(0x38800000):  # float16 normals: keep 10 of 23 mantissa bits
            r = b + np.uint32(0x0FFF) + ((b >> np.uint32(13)) & np.uint32(1))
            res[i] = r & np.uint32(0xFFFFE000)
        else:  # float16 subnormals: multiples of 2^-24
            v = x.reshape(-1)[i]
            out.reshape(-1)[i] = np.float32(np.rint(v * np.float32(16777216.0))) / np.float32(
                16777216.0
            )


_f16_kernel = kernel(_f16_rows)


def _elementwise(x: np.ndarray, fn) -> np.ndarray:
    """fn(rows, out_rows) of a float32 copy-free view of x, the rows spread over the engine's
    workers (ops.by_rows: small inputs stay on the calling thread)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    x2 = x.reshape(x.shape[0] if x.ndim >= 2 else 1, -1)
    ops.by_rows(fn, x2.shape[0], x2, out.reshape(x2.shape))
    return out


def _f16(x: np.ndarray) -> np.ndarray:
    """x rounded to float16 precision, kept as float32 (what ggml's float16 conversions give)."""
    return _elementwise(x, _f16_kernel)


def _f16_table(fn) -> np.ndarray:
    """fn over every float16 value, computed in float32 and rounded to float16, as float32:
    ggml's CPU tables (ggml_table_gelu_f16, ggml_table_gelu_quick_f16)."""
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):
        return fn(h).astype(np.float16).astype(np.float32)


def _gelu_f32(h: np.ndarray) -> np.ndarray:
    c = np.float32(math.sqrt(2.0 / math.pi))
    return (
        np.float32(0.5)
        * h
        * (np.float32(1.0) + np.tanh(c * h * (1 + np.float32(0.044715) * h * h)))
    )


def _gelu_quick_f32(h: np.ndarray) -> np.ndarray:
    return h * (np.float32(1.0) / (np.float32(1.0) + np.exp(np.float32(-1.702) * h)))


_GELU = _f16_table(_gelu_f32)
_GELU_QUICK = _f16_table(_gelu_quick_f32)


def _f16_bits(b):  # float32 bits -> the bits of the nearest float16 (ties to even)
    sign = (b >> np.uint32(16)) & np.uint32(0x8000)
    mag = b & np.uint32(0x7FFFFFFF)
    if mag > np.uint32(0x7F800000):
        return sign | np.uint32(0x7E00)  # nan
    if mag >= np.uint32(0x477FF000):
        return sign | np.uint32(0x7C00)  # inf, or rounds past 65504
    if mag >= np.uint32(0x38800000):  # normal
        r = mag + np.uint32(0x0FFF) + ((mag >> np.uint32(13)) & np.uint32(1))
        return sign | ((r - np.uint32(0x38000000)) >> np.uint32(13))
    if mag < np.uint32(0x33000000):  # below half the smallest subnormal
        return sign
    e = mag >> np.uint32(23)
    m = (mag & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
    shift = np.uint32(126) - e  # 14..24: the subnormal's quantum is 2^-24
    r = m >> shift
    rem = m & ((np.uint32(1) << shift) - np.uint32(1))
    half = np.uint32(1) << (shift - np.uint32(1))
    if rem > half or (rem == half and (r & np.uint32(1))):
        r += np.uint32(1)
    return sign | r


def _table_rows(x, table, lo, hi, out):  # out = table[f16(x)]; x >= hi: x; x <= lo: 0
    flat, res = x.reshape(-1), out.reshape(-1)
    bits = flat.view(np.uint32)
    for i in range(flat.size):
        v = flat[i]
        if v <= lo:
            res[i] = np.float32(0.0)
        elif v >= hi:
            res[i] = v
        else:
            res[i] = table[_f16_bits(bits[i])]


_f16_bits = kernel(_f16_bits)
_table_kernel = kernel(_table_rows)


def _lookup(x: np.ndarray, table: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """table[float16(x)] (ggml's activation tables), x <= lo -> 0 and x >= hi -> x."""
    lo32, hi32 = np.float32(lo), np.float32(hi)
    return _elementwise(x, lambda xs, os: _table_kernel(xs, table, lo32, hi32, os))


def gelu(x: np.ndarray) -> np.ndarray:
    """ggml_gelu on the CPU: the float16-rounded input looked up in GGML_GELU_FP16's table,
    exact outside [-10, 10]."""
    return _lookup(x, _GELU, -10.0, 10.0)


def gelu_quick(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_quick on the CPU: x * sigmoid(1.702 x) through the float16 table (for every
    input: no clamp)."""
    return _lookup(x, _GELU_QUICK, np.nan, np.nan)  # NaN bounds: no comparison holds


def _act(op: str, x: np.ndarray) -> np.ndarray:
    if op == "gelu":
        return gelu(x)
    if op == "gelu_quick":
        return gelu_quick(x)
    return x / (np.float32(1.0) + np.exp(-x))  # silu


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float) -> np.ndarray:
    mu = x.mean(axis=1, keepdims=True, dtype=np.float64).astype(np.float32)
    xc = x - mu
    var = (xc.astype(np.float64) ** 2).mean(axis=1, keepdims=True).astype(np.float32)
    out = xc * (np.float32(1.0) / np.sqrt(var + np.float32(eps))) * w
    return out + b if b is not None else out


class _Mm:
    """x @ W.T for the tower's QTensors with one scratch for the dequantised tiles."""

    def __init__(self, max_cols: int, path: str | None, cancel: threading.Event | None = None):
        self.scratch = np.empty(TILE_ROWS * max_cols, np.float32)
        self.path = path
        self.cancel = cancel  # checked between layers (_one_layer)

    def __call__(self, w: QTensor, x: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        out = np.empty((x.shape[0], w.n_rows), np.float32)
        # ggml's mul_mat first puts the activations on the weight's vec_dot grid (float16 for
        # F16, q8_0 / q8_1 / q8_K blocks for the quantised types): so does the int8 path
        path = self.path
        if w.qtype == GGMLQuantizationType.F16:
            x = _f16(x)
        elif w.qtype in _VEC_DOT:
            path = "int8"
        matmul(w, np.ascontiguousarray(x, np.float32), out, self.scratch, path)
        if b is not None:
            out += b
        return out


def patch_embed(hp: ClipHParams, w: ClipWeights, tile: np.ndarray) -> np.ndarray:
    """(n_patches, n_embd) of a normalised (h, w, 3) tile, patches in row-major order."""
    P = hp.patch_size
    h, wd = tile.shape[0] // P, tile.shape[1] // P
    # (h, P, w, P, 3) -> (h, w, 3, P, P): each patch flattened channel-major, as the kernel
    x = tile[: h * P, : wd * P].reshape(h, P, wd, P, 3).transpose(0, 2, 4, 1, 3)
    x = np.ascontiguousarray(x.reshape(h * wd, 3 * P * P), np.float32)
    if w.patch_w_f16:
        x = _f16(x)
    out = x @ w.patch_w.T
    if w.patch_b is not None:
        out += w.patch_b
    return out


def _attention(hp: ClipHParams, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Full (bidirectional) multi-head attention over the patches: the heads spread over the
    engine's workers, each with one-thread BLAS and its own score matrix (the engine's rule:
    its pool, not BLAS's threads, owns the cores)."""
    T, H, D = q.shape[0], hp.n_head, hp.head_dim
    q3, k3, v3 = q.reshape(T, H, D), k.reshape(T, H, D), v.reshape(T, H, D)
    out = np.empty((T, H, D), np.float32)
    scores = [np.empty((T, T), np.float32) for _ in range(min(H, parallel.pool_size()))]
    scale = np.float32(1.0 / math.sqrt(D))

    def head(h: int, worker: int) -> None:
        s = scores[worker]
        np.matmul(np.ascontiguousarray(q3[:, h, :]), np.ascontiguousarray(k3[:, h, :]).T, out=s)
        ops.softmax_rows(s, scale)
        out[:, h, :] = s @ v3[:, h, :]

    parallel.run_parts(head, H)
    return out.reshape(T, H * D)


def vit(hp: ClipHParams, w: ClipWeights, x: np.ndarray, n_layers: int, mm: _Mm) -> np.ndarray:
    """The tower's first n_layers layers over the embedded patches x (T, n_embd)."""
    if w.pre_ln is not None:
        x = layer_norm(x, w.pre_ln[0], w.pre_ln[1], hp.eps)
    for il in range(n_layers):
        x = _one_layer(hp, w, il, x, mm)
    return x


def pixel_shuffle(x: np.ndarray, height: int, width: int, s: int) -> np.ndarray:
    """clip.cpp's build_patch_merge_permute: each s x s block of the (height, width) patch grid
    becomes one row, features ordered (dy, dx, channel); the grid is zero-padded to multiples
    of s first."""
    E = x.shape[1]
    g = x.reshape(height, width, E)
    ph, pw = -height % s, -width % s
    if ph or pw:
        g = np.pad(g, ((0, ph), (0, pw), (0, 0)))
    H, W = g.shape[0] // s, g.shape[1] // s
    g = g.reshape(H, s, W, s, E).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(g.reshape(H * W, s * s * E))


def n_output_tokens(hp: ClipHParams, tile_h: int, tile_w: int) -> int:
    """Embeddings one tile of (tile_h, tile_w) pixels gives (clip_n_output_tokens)."""
    ph, pw = tile_h // hp.patch_size, tile_w // hp.patch_size
    if hp.projector_type == "gemma3":
        return (ph // hp.n_merge) * (pw // hp.n_merge)
    if hp.projector_type == "idefics3":
        s = hp.n_merge
        return (-(-ph // s)) * (-(-pw // s))
    return ph * pw


class EncodeCancelled(EngineError):
    """An image encode stopped between two layers because its caller asked (the app's Stop)."""


def encode_tile(
    hp: ClipHParams,
    w: ClipWeights,
    tile: np.ndarray,
    path: str | None = None,
    cancel: threading.Event | None = None,
) -> np.ndarray:
    """The text model's embeddings (n_tokens, n_embd_lm) of one normalised (h, w, 3) tile.
    cancel: checked before each layer; when set, EncodeCancelled (a big tower's layer is a
    few seconds on two cores, so a Stop waits at most that)."""
    P = hp.patch_size
    ph, pw = tile.shape[0] // P, tile.shape[1] // P
    mm = _Mm(w.max_cols(), path, cancel)
    x = patch_embed(hp, w, tile)
    kind = hp.projector_type
    if kind == "mlp":
        if w.class_embd is not None:
            x = np.concatenate([x, w.class_embd[None, :]], axis=0)  # ggml_concat: appended
        x = x + w.pos_embd[: x.shape[0]]
        deepest = max(hp.feature_layers) if hp.feature_layers else hp.n_layer - 1
        stack = []
        if w.pre_ln is not None:
            x = layer_norm(x, w.pre_ln[0], w.pre_ln[1], hp.eps)
        for il in range(deepest):
            if il in hp.feature_layers:
                stack.append(x)
            x = _one_layer(hp, w, il, x, mm)
        if w.post_ln is not None:
            x = layer_norm(x, w.post_ln[0], w.post_ln[1], hp.eps)
        if deepest in hp.feature_layers:
            stack.append(x)
        emb = np.concatenate(stack, axis=1) if stack else x
        off = 1 if w.class_embd is not None else 0
        emb = emb[off : off + ph * pw]
        y = gelu(mm(w.mm["0"], emb, w.mm_v["0_b"]))
        if "2" in w.mm:
            y = mm(w.mm["2"], y, w.mm_v["2_b"])
        return y
    x = x + w.pos_embd[: x.shape[0]]
    x = vit(hp, w, x, hp.n_layer, mm)
    if w.post_ln is not None:
        x = layer_norm(x, w.post_ln[0], w.post_ln[1], hp.eps)
    if kind == "gemma3":
        k = hp.n_merge
        g = x.reshape(ph // k, k, pw // k, k, hp.n_embd).mean(axis=(1, 3), dtype=np.float32)
        g = np.ascontiguousarray(g.reshape(-1, hp.n_embd))
        ms = (g.astype(np.float64) ** 2).mean(axis=1, keepdims=True).astype(np.float32)
        g = g / np.sqrt(ms + np.float32(hp.eps)) * w.mm_v["soft_emb_norm"]
        if bool(w.mm_v["input_projection_f16"]):
            g = _f16(g)
        return np.ascontiguousarray(g @ w.mm_v["input_projection"], np.float32)
    # idefics3
    return mm(w.mm["fc"], pixel_shuffle(x, ph, pw, hp.n_merge))


def _one_layer(hp: ClipHParams, w: ClipWeights, il: int, x: np.ndarray, mm: _Mm) -> np.ndarray:
    if mm.cancel is not None and mm.cancel.is_set():
        raise EncodeCancelled("image encoding cancelled")
    lw = w.layers[il]
    h = layer_norm(x, lw.ln1_w, lw.ln1_b, hp.eps)
    a = _attention(hp, mm(lw.q, h, lw.q_b), mm(lw.k, h, lw.k_b), mm(lw.v, h, lw.v_b))
    x = x + mm(lw.o, a, lw.o_b)
    h = layer_norm(x, lw.ln2_w, lw.ln2_b, hp.eps)
    return x + mm(lw.down, _act(hp.ffn_op, mm(lw.up, h, lw.up_b)), lw.down_b)
