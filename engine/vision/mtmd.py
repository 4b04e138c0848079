"""Prompts with images (llama.cpp's mtmd): a loaded projector bound to its text model, which
turns text holding media markers plus image bytes into one token list with image spans.

Each image becomes what tools/mtmd/mtmd.cpp makes of it for the projector type (the layout
engine/vision/preprocess.py gives): the begin/end text around it (gemma3's <start_of_image>
... <end_of_image>), or idefics3's grid of slices and overview image with their markers.
An image span's positions hold placeholder ids, negative so they can never be a token, derived
from the image's hash, so two prompts with the same image share a cacheable prefix; the span
itself (MediaSpan) carries the hash and encodes its tile once, on first use.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..gguf_file import GGUFFile
from .clip_file import ClipHParams, open_clip
from .encoder import ClipWeights, encode_tile, load_weights, n_output_tokens
from .errors import MediaError

MEDIA_MARKER = "<__media__>"  # mtmd_default_marker()

# the projectors whose image tokens see each other (mtmd_decode_use_non_causal)
_NON_CAUSAL = frozenset({"gemma3"})


class MediaTokenizer(Protocol):
    """What tokenize() needs of the text model's tokenizer."""

    @property
    def add_bos(self) -> bool: ...
    @property
    def bos_id(self) -> int | None: ...
    @property
    def add_eos(self) -> bool: ...
    @property
    def eos_id(self) -> int | None: ...
    @property
    def n_vocab(self) -> int: ...
    def encode(
        self, text: str, add_special: bool = True, parse_special: bool = False
    ) -> list[int]: ...
    def token_to_piece(self, token_id: int, special: bool = True) -> bytes: ...


@dataclass(eq=False)
class MediaSpan:
    """One encoded unit of an image (the whole image, or one slice / the overview of a
    tiled one) at prompt index `start`: n_tokens embeddings, computed on first embed()."""

    start: int
    n_tokens: int
    id: str  # the image's sha256 over its decoded pixels, plus the tile index
    non_causal: bool
    _encode: Callable[[threading.Event | None], np.ndarray] = field(repr=False)
    _embd: np.ndarray | None = field(default=None, repr=False)
    t_encode_ms: float = 0.0

    @property
    def end(self) -> int:
        return self.start + self.n_tokens

    @property
    def encoded(self) -> bool:
        """Whether embed() has run (its result is kept)."""
        return self._embd is not None

    def embed(self, cancel: threading.Event | None = None) -> np.ndarray:
        """(n_tokens, n_embd) float32 embeddings for the text model (encoded once). cancel:
        when set during the encode, encoder.EncodeCancelled (nothing is kept)."""
        if self._embd is None:
            t0 = time.perf_counter()
            e = self._encode(cancel)
            if e.shape[0] != self.n_tokens:
                raise MediaError(
                    f"the image encoder gave {e.shape[0]} embeddings, expected {self.n_tokens}"
                )
            self._embd = np.ascontiguousarray(e, np.float32)
            self.t_encode_ms = (time.perf_counter() - t0) * 1e3
        return self._embd

    def shifted(self, delta: int) -> MediaSpan:
        return MediaSpan(
            self.start + delta, self.n_tokens, self.id, self.non_causal, self._encode, self._embd
        )


@dataclass(frozen=True)
class MediaPrompt:
    """A tokenized prompt with images: tokens (placeholder ids at image positions) and the
    image spans in order."""

    tokens: list[int]
    media: tuple[MediaSpan, ...]


def placeholder_id(image_id: str, i: int) -> int:
    """The (negative) id at position i of an image span: never a real token, equal for the
    same image, so a prompt cache's common prefix covers a repeated image."""
    return -2 - ((int(image_id[:12], 16) + i) % (1 << 30))  # -1 is LLAMA_TOKEN_NULL


class Projector:
    """A loaded mmproj bound to its text model's embedding width.

    Args:
        path: the mmproj GGUF.
        n_embd: the text model's embedding length (the projector's output must match it).
        image_min_tokens / image_max_tokens: bounds for the projectors with dynamic
            resolution (llama-server's --image-min-tokens / --image-max-tokens).
        decode_path: the engine's decode path for the projector's matrices.
    """

    def __init__(
        self,
        path: str,
        n_embd: int,
        *,
        image_min_tokens: int | None = None,
        image_max_tokens: int | None = None,
        decode_path: str | None = None,
    ):
        self.path = path
        self.file: GGUFFile
        self.file, self.hparams = open_clip(path)
        try:
            self.weights: ClipWeights = load_weights(self.file, self.hparams, n_embd)
        except BaseException:
            self.file.close()
            raise
        self.n_embd = n_embd
        self.image_min_tokens = image_min_tokens
        self.image_max_tokens = image_max_tokens
        self.decode_path = decode_path
        self._lock = threading.Lock()  # one encode at a time: the tower uses every core

    @property
    def projector_type(self) -> str:
        return self.hparams.projector_type

    @property
    def non_causal(self) -> bool:
        return self.projector_type in _NON_CAUSAL

    def close(self) -> None:
        self.file.close()

    def weights_bytes(self) -> int:
        return self.file.tensor_data_bytes

    def compute_bytes(self) -> int:
        """The largest activation set of one tile's encode, for the memory report."""
        return encode_bytes(self.hparams, self.weights.max_cols())

    # ---------------------------------------------------------------- images and tokens
    def _encoder(self, tile: np.ndarray) -> Callable[[threading.Event | None], np.ndarray]:
        def run(cancel: threading.Event | None = None) -> np.ndarray:
            with self._lock:
                return encode_tile(self.hparams, self.weights, tile, self.decode_path, cancel)

        return run

    def tokenize(
        self,
        tokenizer: MediaTokenizer,
        text: str,
        images: Sequence[bytes],
        *,
        add_special: bool,
        parse_special: bool = True,
    ) -> MediaPrompt:
        """mtmd_tokenize: text with one MEDIA_MARKER per image, in order. MediaError when the
        markers and the images disagree in number, or an image cannot be decoded."""
        from .preprocess import decode_image, preprocess

        parts = text.split(MEDIA_MARKER)
        n_markers = len(parts) - 1
        if n_markers != len(images):
            raise MediaError(
                f"number of media markers in text ({n_markers}) does not match number of "
                f"bitmaps ({len(images)})"
            )
        tokens: list[int] = []
        media: list[MediaSpan] = []

        def add_text(s: str, special: bool) -> None:
            if s:
                tokens.extend(tokenizer.encode(s, add_special=False, parse_special=special))

        def add_span(tile: np.ndarray, image_id: str) -> None:
            n = n_output_tokens(self.hparams, tile.shape[0], tile.shape[1])
            if n <= 0:
                raise MediaError("the image gives no image tokens (too small for this projector)")
            tokens.extend(placeholder_id(image_id, i) for i in range(n))
            media.append(
                MediaSpan(len(tokens) - n, n, image_id, self.non_causal, self._encoder(tile))
            )

        for i, part in enumerate(parts):
            add_text(part, parse_special)
            if i == n_markers:
                break
            rgb = decode_image(images[i])
            sha = hashlib.sha256(rgb.tobytes()).hexdigest()
            sha = hashlib.sha256(f"{rgb.shape}".encode() + bytes.fromhex(sha)).hexdigest()
            pre = preprocess(
                self.hparams,
                rgb,
                min_tokens=self.image_min_tokens,
                max_tokens=self.image_max_tokens,
            )
            self._add_image(pre, sha, add_text, add_span, tokenizer, tokens)
        if add_special and tokenizer.add_bos and tokenizer.bos_id is not None:
            tokens.insert(0, int(tokenizer.bos_id))
            media = [m.shifted(1) for m in media]
        if add_special and tokenizer.add_eos and tokenizer.eos_id is not None:
            tokens.append(int(tokenizer.eos_id))
        return MediaPrompt(tokens, tuple(media))

    def _add_image(self, pre, sha: str, add_text, add_span, tokenizer, tokens: list[int]) -> None:
        """The image's text and tiles in mtmd.cpp's order (preprocess gives the layout)."""
        for kind, item in pre.layout:
            if kind == "text":
                add_text(item, True)
            elif kind == "piece":
                tokens.extend(self._lookup(tokenizer, item))
            else:
                add_span(pre.tiles[item], f"{sha}:{item}")

    _lookup_cache: dict[str, int]

    def _lookup(self, tokenizer, *pieces: str) -> list[int]:
        """mtmd's lookup_token: the vocabulary entry whose text is exactly the piece."""
        cache = self.__dict__.setdefault("_lookup_cache", {})
        out = []
        for piece in pieces:
            if piece not in cache:
                want = piece.encode()
                found = next(
                    (
                        t
                        for t in range(tokenizer.n_vocab)
                        if tokenizer.token_to_piece(t, True) == want
                    ),
                    None,
                )
                if found is None:
                    raise MediaError(
                        f"the text model's vocabulary has no token {piece!r}, which projector "
                        f"'{self.projector_type}' needs around its images"
                    )
                cache[piece] = found
            out.append(cache[piece])
        return out


def encode_bytes(hp: ClipHParams, max_cols: int) -> int:
    """The largest activation set of one tile's encode: one head's attention scores, the MLP's
    hidden rows, the residual stream and its temporaries, and the dequantised-tile scratch."""
    T = hp.n_patches_side**2 + 1
    return 4 * T * (T + hp.n_ff + 6 * hp.n_embd) + 4 * max_cols * 1024


def estimate_projector(path: str) -> tuple[int, int]:
    """(weights, compute) bytes of an mmproj file without binding it to a model (`info`)."""
    f, hp = open_clip(path)
    try:
        # the widest matrix input, as ClipWeights.max_cols() finds it once bound
        widest = max(
            (
                int(t.shape[0])
                for name, t in f.tensors.items()
                if len(t.shape) == 2
                and name.endswith(".weight")
                and (name.startswith("v.blk.") or name.startswith("mm."))
                and name != "mm.input_projection.weight"  # gemma3's: a dense array, no tiles
            ),
            default=1,
        )
        return f.tensor_data_bytes, encode_bytes(hp, widest)
    finally:
        f.close()


def load_projector(
    path: str,
    model,
    *,
    image_min_tokens: int | None = None,
    image_max_tokens: int | None = None,
) -> Projector:
    """The mmproj at `path` bound to `model` (an engine Model): its vision tower and projector,
    checked against the text model's embedding width."""
    return Projector(
        str(path),
        int(model.cfg.n_embd),
        image_min_tokens=image_min_tokens,
        image_max_tokens=image_max_tokens,
        decode_path=getattr(model, "decode_path", None),
    )


__all__ = [
    "MEDIA_MARKER",
    "ClipHParams",
    "MediaPrompt",
    "MediaSpan",
    "Projector",
    "encode_bytes",
    "estimate_projector",
    "load_projector",
    "placeholder_id",
]
