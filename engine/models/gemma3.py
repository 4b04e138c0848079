"""gemma3: sqrt(n_embd) embedding scale, Q/K norms, post-attention and post-FFN norms,
GELU-gated FFN, sliding-window layers (5 of every 6) with their own RoPE base.

The GGUF converter already adds Gemma's +1 to every norm weight, so plain RMSNorm applies.
"""

import math

from ..config import ModelConfig, base_config
from ..gguf_file import GGUFFile

SWA_PATTERN = 6  # llama.cpp: every 6th layer is global, the others slide
ROPE_BASE_SWA = 10000.0  # llama.cpp's default when the GGUF has no rope.freq_base_swa


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    arch = f.arch
    n_layer = f.get_int(f"{arch}.block_count")
    window = f.get_int(f"{arch}.attention.sliding_window", 0) or 0
    pattern = f.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list) and len(pattern) == n_layer:
        swa = tuple(bool(x) for x in pattern)
    else:
        period = int(pattern) if isinstance(pattern, int) and pattern > 0 else SWA_PATTERN
        swa = tuple((il + 1) % period != 0 for il in range(n_layer))
    n_embd = f.get_int(f"{arch}.embedding_length")
    n_head = f.get_int(f"{arch}.attention.head_count")
    head_dim = f.get_int(f"{arch}.attention.key_length", n_embd // max(n_head, 1))
    # 27B scales queries by 1/sqrt(n_embd/n_head); the others by 1/sqrt(head_dim).
    attn_scale = 1.0 / math.sqrt(n_embd / n_head if n_layer == 62 else head_dim)
    return base_config(
        f,
        rope_neox=True,
        rope_base_swa=f.get_float(f"{arch}.rope.freq_base_swa", ROPE_BASE_SWA),
        sliding_window=window,
        swa_layers=swa if window else (),
        attn_scale=attn_scale,
        embed_scale=math.sqrt(n_embd),
        act="gelu",
        qk_norm=True,
        post_norms=True,
        final_logit_softcap=f.get_float(f"{arch}.final_logit_softcapping", 0.0) or 0.0,
    )
