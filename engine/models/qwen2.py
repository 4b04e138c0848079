"""qwen2: llama with biases on Q/K/V and NEOX rope (rotate halves)."""

from ..config import ModelConfig, base_config
from ..gguf_file import GGUFFile


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    return base_config(f, rope_neox=True, qkv_bias=True)
