"""ModelConfig: the frozen hyper-parameters of a model, read once from GGUF metadata.

Architecture modules (engine/models/*.py) fill it through `base_config()` plus their own
overrides; everything downstream receives `cfg: ModelConfig` and never reads "{arch}.*" keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .gguf_file import GGUFFile


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
    sliding_window: int = 0  # 0 = every layer is global
    swa_layers: tuple[bool, ...] = field(default_factory=tuple)
    attn_scale: float = 0.0  # 0 = 1/sqrt(head_dim)
    embed_scale: float = 1.0  # multiply token embeddings (gemma: sqrt(n_embd))
    act: str = "silu"  # gated FFN activation: silu | gelu
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False  # post-attention and post-FFN norms (gemma3)
    final_logit_softcap: float = 0.0
    name: str = ""

    @property
    def kq_scale(self) -> float:
        return self.attn_scale or self.head_dim**-0.5

    def is_swa(self, il: int) -> bool:
        return bool(self.sliding_window) and bool(self.swa_layers) and self.swa_layers[il]

    def layer_rope_base(self, il: int) -> float:
        return self.rope_base_swa if self.is_swa(il) and self.rope_base_swa else self.rope_base

    def layer_rope_scale(self, il: int) -> float:
        # Sliding-window layers keep unscaled positions (llama.cpp freq_scale_swa = 1).
        return 1.0 if self.is_swa(il) else self.rope_scale

    def layer_window(self, il: int) -> int:
        return self.sliding_window if self.is_swa(il) else 0


def base_config(f: GGUFFile, **overrides) -> ModelConfig:
    """Read the keys every decoder-only architecture shares; `overrides` wins."""
    arch = f.arch
    k = lambda s: f"{arch}.{s}"
    n_embd = f.get_int(k("embedding_length"))
    n_head = f.get_int(k("attention.head_count"))
    n_head_kv = f.get_int(k("attention.head_count_kv"), n_head)
    head_dim = f.get_int(k("attention.key_length"), n_embd // max(n_head, 1))
    head_dim_v = f.get_int(k("attention.value_length"), head_dim)
    n_layer = f.get_int(k("block_count"))
    tok_embd = f.tensors.get("token_embd.weight")
    n_vocab = f.get_int(k("vocab_size"), 0) or (tok_embd.shape[1] if tok_embd else 0)
    if not n_vocab:
        tokens = f.get("tokenizer.ggml.tokens")
        n_vocab = len(tokens) if tokens else 0
    scaling = f.get_str(k("rope.scaling.type"), "none")
    rope_scale = 1.0
    if scaling == "linear":
        rope_scale = f.get_float(k("rope.scaling.factor"), 1.0) or 1.0
    values = dict(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        n_ff=f.get_int(k("feed_forward_length")),
        n_vocab=n_vocab,
        n_ctx_train=f.get_int(k("context_length"), 2048),
        norm_eps=f.get_float(k("attention.layer_norm_rms_epsilon"), 1e-5),
        rope_base=f.get_float(k("rope.freq_base"), 10000.0),
        rope_dim=f.get_int(k("rope.dimension_count"), head_dim),
        rope_neox=True,
        rope_scale=rope_scale,
        name=f.get_str("general.name", "") or "",
    )
    values.update(overrides)
    cfg = ModelConfig(**values)
    _check(f, cfg)
    return cfg


def _check(f: GGUFFile, cfg: ModelConfig) -> None:
    from .errors import GGUFError

    for name in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_ff", "n_vocab"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or v <= 0 or v > 1 << 24:
            raise GGUFError(f"{f.path}: invalid hyper-parameter {name} = {v}")
    if cfg.n_head % cfg.n_head_kv:
        raise GGUFError(f"{f.path}: head_count {cfg.n_head} is not a multiple of head_count_kv {cfg.n_head_kv}")
    if cfg.rope_dim > cfg.head_dim or cfg.rope_dim % 2:
        raise GGUFError(f"{f.path}: invalid rope.dimension_count {cfg.rope_dim}")
