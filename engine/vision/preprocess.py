"""Image bytes to the float tiles a vision tower encodes, as llama.cpp's mtmd does it.

decode_image: the bytes of a PNG/JPEG/GIF/BMP/WebP/... to (H, W, 3) uint8 RGB, as stb_image
(llama.cpp's decoder, asked for 3 channels) gives them: alpha dropped without compositing,
grey replicated, palettes expanded, 16-bit samples reduced to their high byte, the first frame
of an animation (a GIF's transparent pixels black). PNG, GIF, BMP, TGA and PPM decode to
stb_image's bytes exactly; JPEG decoders differ (libjpeg's IDCT and chroma upsampling against
stb's): about one pixel in ten by up to 3 levels. Unlike stb_image, the EXIF orientation is
applied (a phone photo comes out the way up its owner saw it), unless asked not to.

preprocess: llama.cpp's per-projector preprocessors (tools/mtmd/mtmd-image.cpp) with the
parameters clip.cpp's load_hparams gives each projector, and the order and the text around the
tiles that mtmd.cpp's tokenizer uses (`layout`):
  gemma3    fixed size: fit into image_size^2 keeping the aspect (bilinear), black padding,
            wrapped in "<start_of_image>" ... "<end_of_image>"
  mlp       LLaVA 1.5 (no grid pinpoints): fixed size, bicubic, padded with (122, 116, 104);
            LLaVA 1.6 (pinpoints): llava-uhd slicing - tiles of the best pinpoint resolution
            (bicubic, aspect kept, black padding) row by row, then the overview (image_size^2,
            stretched); an image no larger than image_size gets the overview only
  idefics3  longest edge to preproc_image_size (lanczos), then up to a whole number of
            image_size tiles; tiles row by row, then the global image; with min/max token
            limits, llava-uhd slicing of the smart-resized image instead
"""

from __future__ import annotations

import functools
import io
import math
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image

from .clip_file import ClipHParams
from .errors import MediaError
from .resize import crop, fit_size, resample, resize

MAX_SIDE = 1 << 24  # stb_image's STBI_MAX_DIMENSIONS
LLAVA_PAD_COLOR = (122, 116, 104)  # clip.cpp's pad colour for the llava projectors


def decode_image(
    data: bytes, *, max_pixels: int = 64 * 1024 * 1024, exif_orientation: bool = True
) -> np.ndarray:
    """(H, W, 3) uint8 RGB pixels of an encoded image; MediaError for anything that is not a
    decodable image of at most `max_pixels` pixels. The size is read from the header before
    any pixel is decoded, so a decompression bomb costs no memory."""
    if not data:
        raise MediaError("failed to load image: the image data is empty")
    try:
        with warnings.catch_warnings():
            # size limits are ours (below); Pillow's bomb warning and palette notes are noise
            warnings.simplefilter("ignore")
            im = Image.open(io.BytesIO(data))
            _check_size(im.size, max_pixels)
            im.seek(0)  # animations: the first frame, as stb_image returns
            im.load()
            rgb = _to_rgb(im)
    except MediaError:
        raise
    except Image.DecompressionBombError as e:  # Pillow's own bound, past twice its warning size
        raise MediaError(f"failed to load image: it is too large ({e})") from None
    except MemoryError:
        raise MediaError("failed to load image: not enough memory to decode it") from None
    except Exception as e:  # noqa: BLE001 - Pillow's decoders raise many types on bad bytes
        raise MediaError(f"failed to load image: {_reason(e)}") from None
    if exif_orientation:
        rgb = _exif_transpose(im, rgb)
    return rgb


def _check_size(size: tuple[int, int], max_pixels: int) -> None:
    w, h = size
    if w <= 0 or h <= 0:
        raise MediaError(f"failed to load image: invalid size {w}x{h}")
    if w > MAX_SIDE or h > MAX_SIDE or w * h > max_pixels:
        raise MediaError(
            f"failed to load image: {w}x{h} is too large ({w * h} pixels, the limit is "
            f"{max_pixels})"
        )


def _reason(e: Exception) -> str:
    if isinstance(e, Image.UnidentifiedImageError):
        return "the data is not an image in a supported format"
    text = str(e) or type(e).__name__
    return text[:200]


def _to_rgb(im: Image.Image) -> np.ndarray:
    """stb_image's 3-channel result for each of Pillow's modes."""
    mode = im.mode
    if im.format == "GIF" and "transparency" in im.info:
        # stb_image leaves a GIF's transparent pixels unwritten on a zeroed canvas: black
        rgba = np.array(im.convert("RGBA"), np.uint8)
        rgb = np.ascontiguousarray(rgba[..., :3])
        rgb[rgba[..., 3] == 0] = 0
        return rgb
    if mode == "RGB":
        return np.array(im, np.uint8)
    if mode.startswith("I;16") or mode == "I":
        # 16-bit grey: stb keeps the high byte of each sample (stbi__convert_16_to_8)
        grey = (np.asarray(im).astype(np.int64) >> 8).clip(0, 255).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    if mode == "F":
        grey = np.asarray(im).clip(0, 255).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    # RGBA/LA/PA/RGBa drop alpha with no compositing; L/1/P expand; CMYK/YCbCr/LAB convert
    if mode in ("LA", "La", "PA"):
        im = im.convert("L" if mode != "PA" else "RGBA")
    return np.array(im.convert("RGB"), np.uint8)


def _exif_transpose(im: Image.Image, rgb: np.ndarray) -> np.ndarray:
    try:
        orientation = im.getexif().get(0x0112, 1)
    except Exception:  # noqa: BLE001 - a broken EXIF block leaves the pixels as they are
        return rgb
    ops = {
        2: lambda a: a[:, ::-1],
        3: lambda a: a[::-1, ::-1],
        4: lambda a: a[::-1],
        5: lambda a: a.transpose(1, 0, 2),
        6: lambda a: a.transpose(1, 0, 2)[:, ::-1],
        7: lambda a: a.transpose(1, 0, 2)[::-1, ::-1],
        8: lambda a: a.transpose(1, 0, 2)[::-1],
    }
    op = ops.get(orientation)
    return np.ascontiguousarray(op(rgb)) if op else rgb


# Layout items: ("text", s) tokenized with special tokens parsed (mtmd's add_text(s, true)),
# ("piece", s) the one token whose piece is exactly s (mtmd's lookup_token), ("tile", i).
LayoutItem = tuple[str, str] | tuple[str, int]


@dataclass(frozen=True)
class PreprocessedImage:
    """One image ready for the vision tower.

    tiles: (h, w, 3) float32, (x / 255 - mean) / std, in the order their embeddings go into
    the prompt; sizes: each tile's (width, height); grid: (rows, cols) of the slices for the
    sliced projectors (None when there is no grid); overview: the index in `tiles` of the
    overview / global image, if there is one; layout: the prompt text and tiles for this image
    in order (see LayoutItem).
    """

    tiles: list[np.ndarray]
    sizes: list[tuple[int, int]]
    grid: tuple[int, int] | None
    overview: int | None
    layout: tuple[LayoutItem, ...]


def normalize(hp: ClipHParams, img: np.ndarray) -> np.ndarray:
    """clip_image_f32::from_u8 then normalize: float32 x / 255, then (x - mean) / std."""
    return _norm_table(hp.image_mean, hp.image_std)[img, _CHANNELS]


_CHANNELS = np.arange(3)


@functools.lru_cache(maxsize=16)
def _norm_table(mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """(256, 3) float32: every uint8 value normalised per channel by the same float32 steps
    (a gather from it is 5x quicker than the arithmetic on each pixel, and the same bits)."""
    x = np.arange(256, dtype=np.float32)[:, None] / np.float32(255.0)
    return (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)


def preprocess(
    hp: ClipHParams,
    rgb: np.ndarray,
    *,
    min_tokens: int | None = None,
    max_tokens: int | None = None,
) -> PreprocessedImage:
    """llama.cpp's preprocessing of one decoded image for the projector `hp` describes.

    min_tokens / max_tokens are llama.cpp's --image-min-tokens / --image-max-tokens; of the
    projectors here only idefics3 reads them (as clip.cpp does)."""
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8 or 0 in rgb.shape:
        raise ValueError(f"expected a non-empty (H, W, 3) uint8 image, got {rgb.shape} {rgb.dtype}")
    ptype = hp.projector_type
    if ptype == "gemma3":
        return _fixed_size(hp, rgb, "bilinear", (0, 0, 0), "<start_of_image>", "<end_of_image>")
    if ptype == "mlp":
        if hp.grid_pinpoints:
            return _llava_uhd(hp, rgb)
        return _fixed_size(hp, rgb, "bicubic", LLAVA_PAD_COLOR, "", "")
    if ptype == "idefics3":
        return _idefics3(hp, rgb, min_tokens, max_tokens)
    raise ValueError(f"no preprocessing for projector type {ptype!r}")


def _fixed_size(
    hp: ClipHParams, rgb: np.ndarray, algo: str, pad_color: tuple[int, int, int], beg: str, end: str
) -> PreprocessedImage:
    sz = hp.image_size
    tile = normalize(hp, resize(rgb, sz, sz, algo, "ceil", pad_color))
    layout: list[LayoutItem] = [("text", beg)] if beg else []
    layout.append(("tile", 0))
    if end:
        layout.append(("text", end))
    return PreprocessedImage([tile], [(sz, sz)], None, None, tuple(layout))


def _sliced(
    hp: ClipHParams,
    slices: list[np.ndarray],
    overview: np.ndarray,
    grid: tuple[int, int] | None,
    layout: list[LayoutItem],
) -> PreprocessedImage:
    """Slices row by row then the overview (mtmd's ov_img_first is false for both projectors
    here that slice)."""
    tiles = [normalize(hp, s) for s in slices] + [normalize(hp, overview)]
    sizes = [(t.shape[1], t.shape[0]) for t in tiles]
    return PreprocessedImage(tiles, sizes, grid, len(tiles) - 1, tuple(layout))


def _llava_uhd(hp: ClipHParams, rgb: np.ndarray) -> PreprocessedImage:
    """mtmd_image_preprocessor_llava_uhd with pinpoints: the overview (image_size^2, bicubic,
    stretched) and, for an image larger than image_size, the slices of its best pinpoint
    resolution (bicubic, aspect kept, black padding). No text around the tiles."""
    sz = hp.image_size
    h, w = rgb.shape[:2]
    overview = resize(rgb, sz, sz, "bicubic", "none")
    if w <= sz and h <= sz:
        return _sliced(hp, [], overview, None, [("tile", 0)])
    rw, rh = select_best_resolution(w, h, hp.grid_pinpoints)
    refined = resize(rgb, rw, rh, "bicubic", "ceil", (0, 0, 0))
    slices = [
        crop(refined, x, y, min(sz, rw - x), min(sz, rh - y))
        for y in range(0, rh, sz)
        for x in range(0, rw, sz)
    ]
    grid = (rh // sz, rw // sz)
    layout: list[LayoutItem] = [("tile", i) for i in range(len(slices) + 1)]
    return _sliced(hp, slices, overview, grid, layout)


def select_best_resolution(
    width: int, height: int, candidates: tuple[tuple[int, int], ...]
) -> tuple[int, int]:
    """The (w, h) pinpoint that keeps the most of the image's resolution, then wastes the
    least (llama.cpp's select_best_resolution, float32 scale and truncation as there)."""
    best, best_eff, best_waste = (0, 0), 0, 1 << 62
    for cw, ch in candidates:
        scale = min(np.float32(cw) / np.float32(width), np.float32(ch) / np.float32(height))
        tw, th = int(np.float32(width) * scale), int(np.float32(height) * scale)
        eff = min(tw * th, width * height)
        waste = cw * ch - eff
        if eff > best_eff or (eff == best_eff and waste < best_waste):
            best, best_eff, best_waste = (cw, ch), eff, waste
    return best


def _idefics3(
    hp: ClipHParams, rgb: np.ndarray, min_tokens: int | None, max_tokens: int | None
) -> PreprocessedImage:
    """mtmd_image_preprocessor_idefics3. clip.cpp sets min/max pixels for idefics3 only from
    the caller's token limits (the file's own pixel keys are not read for it)."""
    sz = hp.image_size
    h, w = rgb.shape[:2]
    patch_area = hp.patch_size * hp.patch_size * hp.n_merge * hp.n_merge
    min_px = min_tokens * patch_area if min_tokens and min_tokens > 0 else 0
    max_px = max_tokens * patch_area if max_tokens and max_tokens > 0 else 0
    algo = hp.resize_algo
    if hp.image_longest_edge > 0 and min_px <= 0 and max_px <= 0:
        longest = hp.image_longest_edge
        aspect = w / h  # a double in llama.cpp
        if w >= h:
            rw, rh = longest, int(longest / aspect)
            rh += rh % 2
        else:
            rw, rh = int(longest * aspect), longest
            rw += rw % 2
        cols, rows = -(-rw // sz), -(-rh // sz)
        resized = resize(rgb, rw, rh, algo, "none")
        refined = resize(resized, cols * sz, rows * sz, algo, "none")
        overview = resize(refined, sz, sz, algo, "none")
        slices = [crop(refined, x * sz, y * sz, sz, sz) for y in range(rows) for x in range(cols)]
    else:
        # the generic llava-uhd slicing of the smart-resized image; the overview and the
        # refined image use llava-uhd's defaults (bicubic; the refined one padded, black)
        rw, rh = fit_size(
            w, h, align=sz, min_pixels=min_px, max_pixels=max_px, longest_edge=hp.image_longest_edge
        )
        cols, rows = math.ceil(rw / sz), math.ceil(rh / sz)
        overview = resize(rgb, sz, sz, "bicubic", "none")
        refined = resize(rgb, rw, rh, "bicubic", "ceil", (0, 0, 0))
        slices = [
            crop(refined, x, y, min(sz, rw - x), min(sz, rh - y))
            for y in range(0, rh, sz)
            for x in range(0, rw, sz)
        ]
    return _sliced(hp, slices, overview, (rows, cols), idefics3_layout(rows, cols))


def idefics3_layout(rows: int, cols: int) -> list[LayoutItem]:
    """mtmd.cpp's text around idefics3's tiles: each slice after
    "<fake_token_around_image><row_R_col_C>" (1-based), "\\n" between rows (none after the
    last), then "\\n\\n" "<fake_token_around_image>" "<global-img>" (looked up as single
    tokens), the global image, "<fake_token_around_image>"."""
    out: list[LayoutItem] = []
    for y in range(rows):
        for x in range(cols):
            out.append(("text", f"<fake_token_around_image><row_{y + 1}_col_{x + 1}>"))
            out.append(("tile", y * cols + x))
        if y != rows - 1:
            out.append(("piece", "\n"))
    out += [("piece", "\n\n"), ("piece", "<fake_token_around_image>"), ("piece", "<global-img>")]
    out += [("tile", rows * cols), ("piece", "<fake_token_around_image>")]
    return out


__all__ = [
    "LayoutItem",
    "PreprocessedImage",
    "decode_image",
    "idefics3_layout",
    "normalize",
    "preprocess",
    "resample",
    "select_best_resolution",
]
