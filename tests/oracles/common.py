"""Float64 building blocks of the oracles, and GGUF access through gguf-py alone.

Nothing here imports the engine: metadata and tensors are read with gguf.GGUFReader and
gguf.quants.dequantize, so an engine bug in reading a file cannot hide in its own oracle.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize


class GGUFModel:
    """Metadata and float64 tensors of one GGUF file."""

    def __init__(self, path):
        self.reader = GGUFReader(str(path))
        self.fields = self.reader.fields
        self.arch = self.fields["general.architecture"].contents()
        self._tensors = {t.name: t for t in self.reader.tensors}

    def key(self, name: str, default=None):
        """Value of "{arch}.name" (or of a full key), default when absent."""
        full = name if name.startswith(("general.", "tokenizer.")) else f"{self.arch}.{name}"
        return self.fields[full].contents() if full in self.fields else default

    def has(self, name: str) -> bool:
        return name in self._tensors

    def tensor(self, name: str) -> np.ndarray:
        """float64 in numpy order: (n_rows, n_cols) for a matrix, (n,) for a vector."""
        t = self._tensors[name]
        data = np.asarray(t.data)
        if t.tensor_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            data = dequantize(data, t.tensor_type)
        shape = [int(d) for d in reversed(t.shape)]
        return data.astype(np.float64).reshape(shape)

    def layer(self, il: int, name: str) -> np.ndarray:
        return self.tensor(f"blk.{il}.{name}")

    def sizes(self) -> dict:
        """The sizes every decoder reads, with llama.cpp's defaults."""
        n_embd, n_head = self.key("embedding_length"), self.key("attention.head_count")
        head_dim = self.key("attention.key_length", n_embd // n_head)
        return dict(
            n_layer=self.key("block_count"),
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=self.key("attention.head_count_kv", n_head),
            head_dim=head_dim,
            n_rot=self.key("rope.dimension_count", head_dim),
            eps=self.key("attention.layer_norm_rms_epsilon", 1e-5),
            rope_base=self.key("rope.freq_base", 10000.0),
        )

    def output(self) -> np.ndarray:
        """The output projection, or the token embedding when they are tied."""
        return self.tensor("output.weight" if self.has("output.weight") else "token_embd.weight")


def swa_layers(m: GGUFModel, n_layer: int, default_period: int) -> list[bool]:
    """llama.cpp's set_swa_pattern: sliding_window_pattern as a per-layer array, or a period p
    where layer il slides unless il % p == p - 1."""
    pattern = m.key("attention.sliding_window_pattern", default_period)
    if isinstance(pattern, list):
        return [bool(p) for p in pattern]
    return [il % pattern < pattern - 1 for il in range(n_layer)]


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (ggml_gelu)."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    return cap * np.tanh(x / cap) if cap else x


def rope(
    x: np.ndarray,
    pos: np.ndarray,
    n_rot: int,
    base: float,
    neox: bool,
    freq_scale: float = 1.0,
    factors: np.ndarray | None = None,
    attn_factor: float = 1.0,
) -> np.ndarray:
    """ggml_rope_ext without YaRN: x (T, heads, D); pair i of the first n_rot dims turns by
    pos * freq_scale * base^(-2i/n_rot) / factors[i]; cos and sin are scaled by attn_factor.
    NEOX pairs are (i, i + n_rot/2), NORM pairs (2i, 2i+1)."""
    x = x.copy()
    half = n_rot // 2
    theta = base ** (-np.arange(half) * 2.0 / n_rot) * freq_scale
    if factors is not None:
        theta = theta / factors
    ang = pos[:, None].astype(np.float64) * theta[None]  # (T, half)
    c, s = np.cos(ang)[:, None] * attn_factor, np.sin(ang)[:, None] * attn_factor
    i0 = np.arange(half) if neox else np.arange(half) * 2
    i1 = i0 + half if neox else i0 + 1
    a, b = x[:, :, i0].copy(), x[:, :, i1].copy()
    x[:, :, i0], x[:, :, i1] = a * c - b * s, a * s + b * c
    return x


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    window: int = 0,
    cap: float = 0.0,
    vis: np.ndarray | None = None,
) -> np.ndarray:
    """Causal softmax attention of one sequence from position 0: q (T, H, D), k (T, G, D),
    v (T, G, Dv); query head h reads KV head h // (H/G). Scores q.k * scale, soft-capped
    when cap > 0; with a window, token t sees positions t-window+1..t. vis (T,): the last
    position each token sees when not its own (an image's tokens see the whole image).
    Returns (T, H*Dv)."""
    T, H, _ = q.shape
    G = k.shape[1]
    out = np.zeros((T, H, v.shape[-1]))
    for t in range(T):
        lo = max(0, t - window + 1) if window else 0
        hi = t + 1 if vis is None else int(vis[t]) + 1
        for h in range(H):
            g = h // (H // G)
            s = softcap(k[lo:hi, g] @ q[t, h] * scale, cap)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ v[lo:hi, g]
    return out.reshape(T, -1)
