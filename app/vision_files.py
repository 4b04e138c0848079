"""Image attachments and the model -> mmproj pairing: the app's files for vision, Qt-free.

Pairing is the engine's, the rule llama.cpp's `-hf` downloads by (engine/hub/siblings.py,
common/download.cpp find_best_mmproj): among the GGUFs whose name contains "mmproj" in the
model's folder, the one whose quantisation bits are closest to the model's wins, the first by
name on a tie. So `gemma-3-4b-it-Q4_K_M.gguf` with `mmproj-F16.gguf` and `mmproj-Q8_0.gguf`
beside it pairs with the Q8_0 one, and says so.

An attachment is kept as its bytes, named by their sha256: the conversation store holds the
bytes (not the path), so moving or deleting the original never empties a bubble.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

from engine.hub.siblings import best_mmproj, is_sibling, quant_tag

from .dto import LlmFileInfo

__all__ = ["quant_tag"]  # re-exported: the engine's rule is the app's

# the marker llama.cpp's mtmd_default_marker() returns; engine.vision.MEDIA_MARKER is the same
# string (tests/gui/test_chat_images.py checks it once the engine has it)
MEDIA_MARKER = "<__media__>"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")
IMAGE_FILTER = "Images (" + " ".join(f"*{s}" for s in IMAGE_SUFFIXES) + ")"
MAX_IMAGE_BYTES = 32 * 1024 * 1024  # a photo is a few MB; bounds what one attachment holds


@dataclass(frozen=True)
class ImageAttachment:
    """One image of a message: its bytes, their sha256 (hex) and the name it was attached as."""

    data: bytes
    sha256: str
    name: str = "image"

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "image") -> ImageAttachment:
        return cls(bytes(data), hashlib.sha256(data).hexdigest(), name)


class AttachmentError(ValueError):
    """A file that cannot be attached; the words say why."""


def is_image_path(path: str) -> bool:
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


def read_image_file(path: str) -> ImageAttachment:
    """The file's bytes as an attachment (decoding is the engine's job, at send time)."""
    p = Path(path)
    if not is_image_path(path):
        raise AttachmentError(f"{p.name} is not an image ({', '.join(IMAGE_SUFFIXES)})")
    try:
        size = p.stat().st_size
        if size > MAX_IMAGE_BYTES:
            raise AttachmentError(f"{p.name} is larger than {MAX_IMAGE_BYTES >> 20} MiB")
        data = p.read_bytes()
    except OSError as e:
        raise AttachmentError(f"{p.name} could not be read: {e.strerror or e}") from None
    if not data:
        raise AttachmentError(f"{p.name} is empty")
    return ImageAttachment.from_bytes(data, p.name)


def with_markers(text: str, n_images: int) -> str:
    """The user message the chat template sees: one marker per image, then the text, as
    llama-server joins [image_url..., text] content parts (no newline after a marker)."""
    return MEDIA_MARKER * n_images + text


# pairing ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pairing:
    mmproj: str  # the projector's path, '' when none was found
    note: str  # why this one, or why none, in words


def find_mmproj(model_path: str) -> Pairing:
    """The projector for the model at `model_path`: a `*mmproj*.gguf` in the same folder."""
    model = Path(model_path)
    if "mmproj" in model.name.lower():
        return Pairing("", "this file is a projector (mmproj), not a model")
    try:
        names = sorted(p.name for p in model.parent.iterdir() if p.is_file())
    except OSError:
        names = []
    found = [n for n in names if is_sibling(n)]  # the engine's candidates
    chosen = best_mmproj(found, model.name)
    if chosen is None:
        return Pairing("", f"no projector file (mmproj*.gguf) beside {model.name}")
    if len(found) == 1:
        return Pairing(str(model.parent / chosen), f"projector: {chosen}")
    others = ", ".join(n for n in found if n != chosen)
    tag = quant_tag(model.name) or "no tag"
    return Pairing(
        str(model.parent / chosen),
        f"projector: {chosen} (closest to the model's {tag}; also there: {others})",
    )


def with_projector(info: LlmFileInfo) -> LlmFileInfo:
    """`info` with its paired projector (or why there is none) filled in."""
    if info.error:
        return info
    pairing = find_mmproj(info.path)
    return replace(info, mmproj=pairing.mmproj, mmproj_note=pairing.note)


def is_projector_file(path: str) -> bool:
    """An mmproj GGUF: a model's companion, not a model (llama.cpp's gguf_filename_is_model)."""
    return "mmproj" in Path(path).name.lower()
