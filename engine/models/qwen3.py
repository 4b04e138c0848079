"""qwen3: llama with per-head RMSNorm on Q and K before RoPE, NEOX rope, no biases."""

from ..config import ModelConfig, base_config
from ..gguf_file import GGUFFile


def config_from_gguf(f: GGUFFile) -> ModelConfig:
    return base_config(f, rope_neox=True, qk_norm=True)
