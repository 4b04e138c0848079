"""llama: Llama 1/2/3, SmolLM2, TinyLlama, Mistral. RMSNorm, SwiGLU, RoPE on adjacent pairs.

The GGUF converter permutes Q/K rows so that llama.cpp's NORM rope (pairs 2i, 2i+1) applies.
"""

from ..config import ModelConfig, base_config
from ..gguf_file import GGUFFile


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    return base_config(f, rope_neox=False)
