"""ModelConfig: the frozen hyper-parameters of a model, read once from GGUF metadata.

It holds what code outside an architecture's block needs: sizes (KV cache, buffers, memory
estimate, info display) and the attention parameters the shared pieces take (RoPE, sliding
windows, query scale). Architecture-only parameters live in the architecture's own subclass
(engine/models/<arch>.py), filled through `base_config(f, cls, ...)`; nothing else reads
"{arch}.*" keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

import numpy as np

from .errors import GGUFError, MetadataError
from .gguf_file import GGUFFile, describe_value


@dataclass(frozen=True)
class Yarn:
    """YaRN scaling (rope.scaling.type "yarn"): each rotated pair turns at a mix of its
    interpolated (position-scaled) and extrapolated (unscaled) frequency, by a ramp over the
    pair index, and cos/sin grow by 1 + 0.1 ln(scale). llama.cpp's cparams.yarn_* and ggml's
    rope_yarn / ggml_rope_yarn_corr_dims.

    llama.cpp reads beta_fast/beta_slow/ext_factor from the GGUF for a few architectures only
    (grok, mistral3); the others, ours included, take these defaults.
    """

    n_ctx_orig: int  # rope.scaling.original_context_length (default: the training context)
    ext_factor: float = 1.0  # weight of the ramp; 0 = plain linear interpolation
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    log_mul: float = 0.0  # rope.scaling.yarn_log_multiplier (DeepSeek's mscale_all_dim)

    def corr_dims(self, n_rot: int, base: float) -> tuple[float, float]:
        """The pair indices where the ramp starts and ends (ggml_rope_yarn_corr_dims): pairs
        below start keep their unscaled angle, pairs above end are fully interpolated."""

        def dim(n_turns: float) -> float:
            return (
                n_rot * math.log(self.n_ctx_orig / (n_turns * 2 * math.pi)) / (2 * math.log(base))
            )

        return max(0.0, math.floor(dim(self.beta_fast))), min(
            n_rot - 1.0, math.ceil(dim(self.beta_slow))
        )

    def context_attn_factor(self, factor: float) -> float:
        """llama_context's yarn_attn_factor before rope.scaling.attn_factor: ggml multiplies
        cos/sin by 1 + 0.1 ln(factor) itself, which this cancels unless log_mul asks for
        DeepSeek's mscale ratio."""
        if not self.ext_factor:
            return 1.0
        mscale = lambda m: 1.0 if factor <= 1.0 else 0.1 * m * math.log(factor) + 1.0
        attn = mscale(1.0) / mscale(self.log_mul) if self.log_mul else mscale(1.0)
        return attn / (1.0 + 0.1 * math.log(factor))


@dataclass(frozen=True, eq=False)
class Rope:
    """How one layer rotates queries and keys (ggml_rope_ext's parameters, precomputed)."""

    inv_freq: np.ndarray  # (n_rot/2,) float64: angle per position of rotated pair i
    neox: bool  # NEOX (pairs i, i+n_rot/2) vs NORM (pairs 2i, 2i+1)
    attn_factor: float = 1.0  # multiplies cos and sin (LongRoPE)

    @classmethod
    def make(
        cls,
        n_rot: int,
        base: float,
        neox: bool,
        scale: float = 1.0,
        factors: Sequence[float] = (),
        attn_factor: float = 1.0,
        yarn: Yarn | None = None,
    ) -> Rope:
        """Pair i turns by pos * base^(-2i/n_rot) / (scale * factors[i]): `scale` is linear
        position scaling, `factors` per-pair frequency divisors (LongRoPE, Llama 3). With
        YaRN the 1/scale becomes a mix of 1/scale and 1 (still linear in the position, so an
        angle per position holds it exactly) and cos/sin grow by 1 + 0.1 ln(scale)."""
        i = np.arange(n_rot // 2, dtype=np.float64)
        inv = float(base) ** (-i * 2.0 / n_rot)
        if len(factors):
            inv /= np.asarray(factors, np.float64)
        freq_scale = 1.0 / float(scale)
        if yarn is not None and yarn.ext_factor:
            lo, hi = yarn.corr_dims(n_rot, base)
            ramp = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)  # 1: keep unscaled
            mix = ramp * yarn.ext_factor
            inv *= freq_scale * (1.0 - mix) + mix
            attn_factor *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
        else:
            inv *= freq_scale
        return cls(inv, neox, float(attn_factor))

    @property
    def n_rot(self) -> int:
        return 2 * len(self.inv_freq)


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int  # n_embd_head_k
    head_dim_v: int  # n_embd_head_v
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    norm_eps: float
    rope_base: float
    rope_dim: int  # n_rot: leading dims of each head that are rotated
    rope_neox: bool  # NEOX (halves) vs NORM (adjacent pairs) rotation
    rope_scale: float = 1.0  # linear position scaling (positions divided by this)
    rope_base_swa: float = 0.0  # 0 = same as rope_base
    rope_scale_swa: float = 0.0  # sliding-window layers; 0 = same as rope_scale
    rope_attn_factor: float = 1.0  # rope.scaling.attn_factor: multiplies cos/sin
    rope_yarn: Yarn | None = None  # rope.scaling.type "yarn"
    sliding_window: int = 0  # 0 = every layer is global
    swa_layers: tuple[bool, ...] = field(default_factory=tuple)
    attn_scale: float = 0.0  # 0 = 1/sqrt(head_dim)
    # Per-token activations of an architecture, as (name, width), added to or replacing the
    # shared ones of buffers.buffer_shapes (e.g. a fused QKV output; width 0: one it does not
    # use). Buffers allocates them and the memory estimate counts them.
    extra_acts: tuple[tuple[str, int], ...] = ()
    name: str = ""

    @property
    def kq_scale(self) -> float:
        return self.attn_scale or self.head_dim**-0.5

    def is_swa(self, il: int) -> bool:
        return bool(self.sliding_window) and bool(self.swa_layers) and self.swa_layers[il]

    def layer_window(self, il: int) -> int:
        return self.sliding_window if self.is_swa(il) else 0

    def layer_rope(self, il: int, n_ctx_seq: int) -> Rope:
        """Layer il's rotation in a context of n_ctx_seq positions per sequence."""
        swa = self.is_swa(il)
        base = self.rope_base_swa if swa and self.rope_base_swa else self.rope_base
        scale = self.rope_scale_swa if swa and self.rope_scale_swa else self.rope_scale
        attn = self.rope_attn_factor
        if self.rope_yarn is not None:  # from the model's scale, not the layer's (llama_context)
            attn *= self.rope_yarn.context_attn_factor(self.rope_scale)
        return Rope.make(
            self.rope_dim,
            base,
            self.rope_neox,
            scale,
            self.rope_factors(n_ctx_seq),
            attn,
            self.rope_yarn,
        )

    def rope_factors(self, n_ctx_seq: int) -> tuple[float, ...]:
        """Per-pair frequency divisors (none by default; LongRoPE picks by context size)."""
        return ()


ConfigT = TypeVar("ConfigT", bound=ModelConfig)


@overload
def base_config(f: GGUFFile, **overrides: Any) -> ModelConfig: ...
@overload
def base_config(f: GGUFFile, cls: type[ConfigT], **overrides: Any) -> ConfigT: ...
def base_config(f: GGUFFile, cls: type[ModelConfig] = ModelConfig, **overrides: Any) -> ModelConfig:
    """Read the keys every decoder-only architecture shares into `cls`; `overrides` wins."""
    arch = f.arch
    k = lambda s: f"{arch}.{s}"
    n_embd = f.get_int(k("embedding_length"))
    n_head = f.get_int(k("attention.head_count"))
    n_head_kv = f.get_int(k("attention.head_count_kv"), n_head)
    if not f.has(k("attention.key_length")) and n_embd % n_head:
        raise GGUFError(
            f"{f.path}: embedding_length {n_embd} is not a multiple of head_count {n_head} "
            f"(and the file has no attention.key_length)"
        )
    head_dim = f.get_int(k("attention.key_length"), n_embd // n_head)
    head_dim_v = f.get_int(k("attention.value_length"), head_dim)
    n_layer = f.get_int(k("block_count"))
    tok_embd = f.tensors.get("token_embd.weight")
    n_vocab = f.get_int(k("vocab_size"), 0) or (tok_embd.shape[1] if tok_embd else 0)
    if not n_vocab:
        tokens = f.get("tokenizer.ggml.tokens")
        n_vocab = len(tokens) if tokens else 0
    # llama.cpp: no type means linear; the factor divides positions for linear and YaRN
    scaling = f.get_str(k("rope.scaling.type"), "linear")
    rope_scale, yarn = 1.0, None
    if scaling in ("linear", "yarn"):
        rope_scale = f.get_float(k("rope.scaling.factor"), 1.0) or 1.0
    n_ctx_train = f.get_int(k("context_length"), 2048)
    if scaling == "yarn":
        yarn = Yarn(
            f.get_int(k("rope.scaling.original_context_length"), n_ctx_train, lo=0, hi=1 << 30)
            or n_ctx_train
        )
        if f.get_float(k("rope.freq_base"), 10000.0) <= 1.0:  # corr_dims divides by ln(base)
            raise GGUFError(
                f"{f.path}: YaRN needs rope.freq_base above 1, found "
                f"{f.get_float(k('rope.freq_base'), 10000.0):g}"
            )
    values: dict[str, Any] = dict(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        n_ff=f.get_int(k("feed_forward_length")),
        n_vocab=n_vocab,
        n_ctx_train=n_ctx_train,
        norm_eps=f.get_float(k("attention.layer_norm_rms_epsilon"), 1e-5),
        rope_base=f.get_float(k("rope.freq_base"), 10000.0),
        rope_dim=f.get_int(k("rope.dimension_count"), head_dim),
        rope_neox=True,
        rope_scale=rope_scale,
        rope_attn_factor=f.get_float(k("rope.scaling.attn_factor"), 1.0) or 1.0,
        rope_yarn=yarn,
        name=f.get_str("general.name", "") or "",
    )
    values.update(overrides)
    cfg = cls(**values)
    _check(f, cfg)
    return cfg


def swa_layers(f: GGUFFile, default_period: int) -> tuple[bool, ...]:
    """Which layers use the sliding window: attention.sliding_window_pattern as a per-layer
    array, or a period p (layer il slides unless il % p == p - 1; llama.cpp set_swa_pattern)."""
    n_layer = f.get_int(f"{f.arch}.block_count")
    key = f"{f.arch}.attention.sliding_window_pattern"
    if f.array_len(key) is not None:
        pattern = f.get_array(key)
        if not all(isinstance(x, (bool, int)) for x in pattern):
            raise MetadataError(
                f"{f.path}: metadata key '{key}' should be an integer or an array of booleans, "
                f"found {describe_value(f.metadata, key)}"
            )
        if len(pattern) == n_layer:
            return tuple(bool(x) for x in pattern)
        period = default_period
    else:
        period = f.get_int(key, default_period, lo=0, hi=1 << 24) or default_period
    return tuple(il % period < period - 1 for il in range(n_layer))


def require_whole_head_rope(f: GGUFFile, cfg: ModelConfig) -> None:
    """For architectures whose llama.cpp graph asserts n_rot == head size == value head size
    (smollm3, olmo2, granite): a file breaking that is rejected here, not run differently."""
    if cfg.rope_dim != cfg.head_dim or cfg.head_dim_v != cfg.head_dim:
        raise GGUFError(
            f"{f.path}: architecture {cfg.arch} rotates whole heads: rope.dimension_count "
            f"{cfg.rope_dim}, key_length {cfg.head_dim} and value_length {cfg.head_dim_v} must be equal"
        )


def _check(f: GGUFFile, cfg: ModelConfig) -> None:
    """What must hold between the hyper-parameters, and between them and the vocabulary."""
    for name in (
        "n_layer",
        "n_embd",
        "n_head",
        "n_head_kv",
        "head_dim",
        "head_dim_v",
        "n_ff",
        "n_vocab",
        "n_ctx_train",
    ):
        v = getattr(cfg, name)
        if not isinstance(v, int) or v <= 0 or v > 1 << 24:
            raise GGUFError(f"{f.path}: invalid hyper-parameter {name} = {v}")
    if cfg.n_head % cfg.n_head_kv:
        raise GGUFError(
            f"{f.path}: head_count {cfg.n_head} is not a multiple of head_count_kv {cfg.n_head_kv}"
        )
    if not 0 <= cfg.rope_dim <= cfg.head_dim or cfg.rope_dim % 2:
        raise GGUFError(
            f"{f.path}: invalid rope.dimension_count {cfg.rope_dim} (an even number up to the "
            f"head size {cfg.head_dim})"
        )
    if cfg.sliding_window < 0 or len(cfg.swa_layers) not in (0, cfg.n_layer):
        raise GGUFError(
            f"{f.path}: invalid sliding window {cfg.sliding_window} over {len(cfg.swa_layers)} layers"
        )
    for name in ("norm_eps", "rope_base", "rope_scale", "rope_attn_factor", "attn_scale"):
        v = getattr(cfg, name)
        if not math.isfinite(v) or v < 0:
            raise GGUFError(f"{f.path}: invalid hyper-parameter {name} = {v}")
    n_tokens = f.array_len("tokenizer.ggml.tokens")
    if (
        n_tokens is not None and n_tokens != cfg.n_vocab
    ):  # llama.cpp: token_embd has one row per token
        raise GGUFError(
            f"{f.path}: the vocabulary has {n_tokens} tokens but the model has {cfg.n_vocab} "
            "(rows of token_embd.weight or vocab_size)"
        )
