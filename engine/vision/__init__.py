"""Images in (llama.cpp's mtmd): multimodal projector files, their vision encoders, image
preprocessing, and prompts whose image spans the scheduler decodes as embeddings.

Public API: load_projector, Projector, MediaPrompt, MediaSpan, MEDIA_MARKER, MediaError,
SUPPORTED_PROJECTORS, UnsupportedProjectorError.
"""

from __future__ import annotations

from .clip_file import SUPPORTED_PROJECTORS, ClipHParams, UnsupportedProjectorError
from .encoder import EncodeCancelled
from .errors import MediaError
from .mtmd import (
    MEDIA_MARKER,
    MediaPrompt,
    MediaSpan,
    Projector,
    estimate_projector,
    load_projector,
)

__all__ = [
    "MEDIA_MARKER",
    "SUPPORTED_PROJECTORS",
    "ClipHParams",
    "EncodeCancelled",
    "MediaError",
    "MediaPrompt",
    "MediaSpan",
    "Projector",
    "UnsupportedProjectorError",
    "estimate_projector",
    "load_projector",
]
