"""Images in requests: where their bytes come from, and how a content array becomes prompt text.

llama-server's rules (tools/server/server-common.cpp handle_media and
oaicompat_content_load_media, common/chat.cpp):

- an image is a `data:image/...;base64,` URI, raw base64, an http(s) URL (downloaded: at most
  10 MB, 10 s), or a `file://` path, read only under --media-path and never outside it;
- each image or audio part of a message becomes the media marker in the text the chat template
  sees, the images kept in order; text parts join with a newline, but never next to a marker;
- the projector (engine.vision) tokenizes the rendered text with its images.

A server without a projector answers an image with llama-server's 500 "image input is not
supported"; bytes that are not an image are the projector's MediaError, a 400.
"""

from __future__ import annotations

import base64
import binascii
import os
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from ..errors import APIError
from .errors import invalid

if TYPE_CHECKING:
    from ..vision import MediaPrompt
    from .state import ServerState

MEDIA_MARKER = "<__media__>"  # llama.cpp's mtmd_default_marker(); engine.vision has the same
MAX_DOWNLOAD_BYTES = 10 * 1024 * 1024  # llama-server's limits for a remote image
DOWNLOAD_TIMEOUT_S = 10.0

_HINT = "hint: if this is unexpected, you may need to provide the mmproj"
NO_IMAGES = f"image input is not supported - {_HINT}"
NO_AUDIO = f"audio input is not supported - {_HINT}"
NO_VIDEO = f"video input is not supported - {_HINT}"
NO_MULTIMODAL_DATA = "Multimodal data provided, but model does not support multimodal requests."

# content part type -> (the key holding its URL, the error without support for it)
_MEDIA_PARTS = {
    "image_url": ("image_url", NO_IMAGES),
    "input_audio": ("input_audio", NO_AUDIO),
    "input_video": ("input_video", NO_VIDEO),
    "video_url": ("video_url", NO_VIDEO),
}


def has_vision(state: ServerState) -> bool:
    return state.projector is not None


def load_media(url: str, media_path: str | None) -> bytes:
    """The bytes an image part names (llama-server's handle_media)."""
    if url.startswith(("http://", "https://")):
        return _download(url)
    if url.startswith("file://"):
        return _local_file(url[len("file://") :], media_path)
    if url.startswith("data:"):
        return _data_uri(url)
    data = _b64decode(url)
    if not data:
        raise invalid("Invalid base64 value")
    return data


def _b64decode(text: str) -> bytes:
    """Lenient base64, as llama.cpp's base64_decode: whitespace ignored, padding optional,
    both alphabets; anything else is not base64."""
    s = "".join(text.split()).replace("-", "+").replace("_", "/").rstrip("=")
    try:
        return base64.b64decode(s + "=" * (-len(s) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise invalid("Invalid base64 value") from None


def _data_uri(url: str) -> bytes:
    head, sep, data = url.partition(",")
    if not sep or "," in data:
        raise invalid("Invalid uri-encoded base64 value")
    if not head.startswith(("data:image/", "data:video/", "data:audio/")):
        raise invalid(f"Invalid uri format: {head[:100]}")
    if not head.endswith("base64"):
        raise invalid("uri must be base64 encoded")
    return _b64decode(data)


def _local_file(rel: str, media_path: str | None) -> bytes:
    """A file under --media-path: a relative path with no `..`, whose real path (symlinks
    followed) stays inside the folder."""
    if not media_path:
        raise invalid("file:// URLs are not allowed unless --media-path is specified")
    parts = rel.split("/")
    if (
        not rel
        or len(rel) > 4096
        or rel.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
        or any(ord(c) < 0x20 or c in "\\:*\x7f" for c in rel)
    ):
        raise invalid(f"file path is not allowed: {rel[:200]}")
    root = os.path.realpath(media_path)
    path = os.path.realpath(os.path.join(root, rel))
    if os.path.commonpath([root, path]) != root:  # a symlink pointing out of the folder
        raise invalid(f"file path is not allowed: {rel[:200]}")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        raise invalid(f"file does not exist or cannot be opened: {rel[:200]}") from None


def _opener() -> urllib.request.OpenerDirector:
    # http(s) and their redirects only: build_opener would also follow a redirect to ftp
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.HTTPHandler(),
        urllib.request.HTTPSHandler(),
        urllib.request.HTTPRedirectHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


def _download(url: str) -> bytes:
    """A remote image, as llama-server fetches it: 10 MB and 10 s at most; any failure is
    its 500 "Failed to download image" (with the reason, which llama-server only logs)."""
    deadline = time.monotonic() + DOWNLOAD_TIMEOUT_S
    try:
        with _opener().open(url, timeout=DOWNLOAD_TIMEOUT_S) as res:
            chunks: list[bytes] = []
            n = 0
            while chunk := res.read(64 * 1024):
                n += len(chunk)
                if n > MAX_DOWNLOAD_BYTES:
                    raise _download_error(f"larger than {MAX_DOWNLOAD_BYTES} bytes")
                if time.monotonic() > deadline:
                    raise _download_error(f"took longer than {DOWNLOAD_TIMEOUT_S:g} s")
                chunks.append(chunk)
            return b"".join(chunks)
    except urllib.error.HTTPError as e:
        raise _download_error(f"HTTP {e.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise _download_error(str(getattr(e, "reason", e))) from None


def _download_error(reason: str) -> APIError:
    return APIError(500, f"Failed to download image: {reason}", "server_error")


def _check_supported(state: ServerState, kind: str) -> None:
    if kind == "image_url" and has_vision(state):
        return
    # audio and video: no projector of ours has them
    raise APIError(500, _MEDIA_PARTS[kind][1], "server_error")


def content_with_markers(
    state: ServerState, parts: list[dict[str, Any]], images: list[bytes], where: str
) -> str | list[dict[str, Any]]:
    """A message's content parts as the template sees them: with no media, the parts as they
    are; with media, one string where each media part is the marker (its bytes appended to
    `images`), text parts joined by newlines except next to a marker (common/chat.cpp)."""
    if not any(isinstance(p, dict) and p.get("type") in _MEDIA_PARTS for p in parts):
        for p in parts:
            if p.get("type") not in (None, "text"):
                raise invalid(f"{where}: unsupported content[].type {str(p.get('type'))[:40]!r}")
        return parts
    text = ""
    after_marker = False
    for p in parts:
        kind = p.get("type")
        if kind in _MEDIA_PARTS:
            _check_supported(state, kind)
            images.append(load_media(_part_url(p, kind, where), state.options.media_path))
            text += MEDIA_MARKER
            after_marker = True
        elif kind in (None, "text"):
            t = p.get("text") or ""
            if not after_marker and text and t:
                text += "\n"
            text += str(t)
            after_marker = False
        else:
            raise invalid(f"{where}: unsupported content[].type {str(kind)[:40]!r}")
    return text


def _part_url(part: dict[str, Any], kind: str, where: str) -> str:
    inner = part.get(_MEDIA_PARTS[kind][0])
    if isinstance(inner, str):  # the Responses API's input_image carries the URL itself
        return inner
    if not isinstance(inner, dict):
        raise invalid(f"{where}: a {kind} part must have a {_MEDIA_PARTS[kind][0]!r} object")
    url = inner.get("url", inner.get("data", ""))
    if not isinstance(url, str):
        raise invalid(f"{where}: the {kind} part's url must be a string")
    return url


def tokenize(
    state: ServerState, text: str, images: list[bytes], add_special: bool = True
) -> MediaPrompt:
    """The prompt of a text with one marker per image (mtmd_tokenize); the projector raises
    MediaError (a 400) for a count that does not match or bytes that are not an image."""
    projector = state.projector
    if projector is None:
        raise APIError(500, NO_IMAGES, "server_error")
    return projector.tokenize(
        state.tokenizer, text, images, add_special=add_special, parse_special=True
    )


def multimodal_data(state: ServerState, data: Any) -> list[bytes]:
    """A /completion prompt object's `multimodal_data`: base64 strings (no URLs), one a marker."""
    if not has_vision(state):
        raise invalid(NO_MULTIMODAL_DATA)
    if not isinstance(data, list) or not all(isinstance(x, str) for x in data):
        raise invalid("'multimodal_data' must be a list of base64 strings")
    return [_b64decode(x) for x in data]
