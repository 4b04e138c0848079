"""The vision errors a request can cause: an image that cannot be decoded or preprocessed."""

from __future__ import annotations

from ..errors import InvalidRequestError


class MediaError(InvalidRequestError):
    """A corrupt, truncated, unsupported or oversized image (HTTP 400). The message starts
    with "failed to load image", as llama-server's "Failed to load image or audio file" does,
    and then says what was wrong with it."""
