"""smollm3: SmolLM3. llama's block (RMSNorm, SwiGLU, NORM RoPE on adjacent pairs), except that
every 4th layer (il + 1 divisible by 4: layers 3, 7, 11, ...) attends without RoPE ("NoPE").

As llama.cpp (src/models/smollm3.cpp): the step 4 is fixed, not read from the GGUF; queries are
scaled by 1/sqrt(head_dim); no rope_freqs divisors; output tied to token_embd when the file has
no output.weight. Its converter is llama's, so Q/K rows are permuted for NORM rope.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig, Rope, base_config, require_whole_head_rope
from ..gguf_file import GGUFFile
from .base import Architecture
from .llama import load_layer

NO_ROPE_LAYER_STEP = 4  # llama.cpp hparams.n_no_rope_layer_step for smollm3


@dataclass(frozen=True)
class SmolLM3Config(ModelConfig):
    no_rope_layer_step: int = NO_ROPE_LAYER_STEP

    def uses_rope(self, il: int) -> bool:
        return (il + 1) % self.no_rope_layer_step != 0

    def layer_rope(self, il: int, n_ctx_seq: int) -> Rope:
        # No pair turns on a NoPE layer: the forward pass and the context shift leave its
        # queries and keys as projected.
        if not self.uses_rope(il):
            return Rope.make(0, self.rope_base, self.rope_neox)
        return super().layer_rope(il, n_ctx_seq)


def config_from_gguf(f: GGUFFile) -> SmolLM3Config:
    cfg = base_config(f, SmolLM3Config, rope_neox=False)
    require_whole_head_rope(f, cfg)
    return cfg


# llama's layer (a NoPE layer's Rope has no pairs to turn)
ARCH = Architecture("smollm3", config_from_gguf, load_layer)
