"""plain_error: engine errors get plain words by class (not by class name), then their message."""

from __future__ import annotations

from app.errors import AppError, LoadCancelled, plain_error
from engine.errors import (
    GGUFError,
    InsufficientMemoryError,
    MetadataError,
    MissingTensorError,
    UnsupportedQuantError,
)


def test_plain_error_names_the_problem_and_keeps_engine_message():
    text = plain_error(UnsupportedQuantError("tensor blk.0.attn_q uses IQ2_XS"))
    assert text.startswith("This model uses a quantisation type") and "IQ2_XS" in text
    assert plain_error(MemoryError("x")).startswith("Not enough memory")
    assert plain_error(FileNotFoundError("/a.gguf")).startswith("File not found")


def test_plain_error_prefers_the_most_specific_class():
    assert plain_error(MissingTensorError("blk.0.attn_q")).startswith("The model file is missing")
    assert plain_error(GGUFError("bad magic")).startswith("This file is not a usable GGUF")
    assert plain_error(MetadataError("key 'llama.block_count'")).startswith(
        "The model file's metadata"
    )
    assert plain_error(InsufficientMemoryError("needs 800 GiB")).startswith(
        "This model does not fit"
    )


def test_plain_error_ignores_look_alike_class_names():
    class UnsupportedQuantError(Exception):  # same name, not the engine's class
        pass

    assert plain_error(UnsupportedQuantError("x")) == "UnsupportedQuantError: x"


def test_plain_error_shows_app_errors_as_they_are():
    assert plain_error(AppError("Load a model first.")) == "Load a model first."
    assert plain_error(LoadCancelled("Loading cancelled")) == "Loading cancelled"
