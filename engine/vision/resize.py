"""llama.cpp's image resizing (tools/mtmd/mtmd-image.cpp, `img_tool`): Pillow-compatible
separable resampling, aspect-preserving resize with padding, crop, and the aspect-preserving
target size ("smart resize").

llama.cpp's `resize_pillow` is Pillow's libImaging/Resample.c adapted: the same filters
(bilinear, bicubic with a = -0.5, lanczos-3), the same double-precision coefficients rounded
to 22-bit fixed point, the same one-axis passes over uint8 with a rounding bias and clamp.
Pillow's C resampler, asked for one axis at a time in llama.cpp's order (horizontal, then
vertical), therefore gives llama.cpp's bytes exactly, and fast; tests/test_vision_preprocess.py checks it against a
line-by-line numpy port of llama.cpp's code and against llama.cpp's own output.

Images are (height, width, 3) uint8 RGB arrays; sizes are given as (width, height) as in
llama.cpp's clip_image_size.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from .. import parallel
from .errors import MediaError

RESIZE_ALGOS = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
PAD_STYLES = ("none", "ceil", "nearest")  # llama.cpp's PAD_NONE, PAD_CEIL, PAD_NEAREST
MAX_RESIZE_SIDE = 65536  # resize_pillow's sanity bound on a target side

BAND_ROWS = 64  # the fewest rows worth a pool task
PARALLEL_MIN_BYTES = 1 << 20

_f32 = np.float32


def resample(img: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """`img` resampled to width x height with no aspect keeping (llama.cpp's resize_pillow)."""
    if not (0 < width <= MAX_RESIZE_SIDE and 0 < height <= MAX_RESIZE_SIDE):
        raise MediaError(
            f"failed to load image: resize target {width}x{height} is out of range "
            f"(the image is too thin or too large for this projector)"
        )
    if img.shape[:2] == (height, width):
        return img.copy()
    # one pass per call: Pillow picks the order of its two passes itself (vertical first for
    # some shapes), llama.cpp always runs the horizontal one first, and the uint8 rounding
    # between them makes the order show
    method = RESIZE_ALGOS[algo]
    if width != img.shape[1]:
        img = _horizontal(np.ascontiguousarray(img), width, method)
    if height == img.shape[0]:
        return img
    return np.asarray(Image.fromarray(img, "RGB").resize((width, height), method))


def _horizontal(img: np.ndarray, width: int, method: Image.Resampling) -> np.ndarray:
    """The horizontal pass, in bands of rows on the engine's pool (rows are independent, and
    Pillow lets go of the GIL while it resamples): the costly pass of a big photo."""
    h = img.shape[0]
    n = min(parallel.pool_size(), h // BAND_ROWS) if img.size >= PARALLEL_MIN_BYTES else 1
    if n <= 1:
        return np.asarray(Image.fromarray(img, "RGB").resize((width, h), method))
    out = np.empty((h, width, 3), np.uint8)
    bands = parallel.split(h, n)

    def part(p: int, _worker: int) -> None:
        a, b = bands[p]
        out[a:b] = np.asarray(Image.fromarray(img[a:b], "RGB").resize((width, b - a), method))

    parallel.run_parts(part, n)
    return out


def resize(
    img: np.ndarray,
    width: int,
    height: int,
    algo: str,
    pad: str = "ceil",
    pad_color: tuple[int, int, int] = (0, 0, 0),
) -> np.ndarray:
    """llama.cpp's img_tool::resize: a straight resample for pad "none"; otherwise scaled to
    fit inside width x height keeping the aspect ratio, centred on a `pad_color` canvas."""
    src_h, src_w = img.shape[:2]
    if (src_w, src_h) == (width, height):
        return img.copy()
    if pad == "none":
        return resample(img, width, height, algo)
    # float32 as llama.cpp computes it: the scale is a float, the sides are rounded from it
    scale = min(_f32(width) / _f32(src_w), _f32(height) / _f32(src_h))
    rnd = round_half_away if pad == "nearest" else math.ceil
    new_w = min(int(rnd(float(_f32(src_w) * scale))), width)
    new_h = min(int(rnd(float(_f32(src_h) * scale))), height)
    inner = resample(img, new_w, new_h, algo)
    if pad == "nearest":
        off_x = int(round_half_away(float(_f32(width - new_w) / _f32(2.0))))
        off_y = int(round_half_away(float(_f32(height - new_h) / _f32(2.0))))
    else:
        off_x, off_y = (width - new_w) // 2, (height - new_h) // 2
    out = np.empty((height, width, 3), np.uint8)
    out[:] = np.asarray(pad_color, np.uint8)
    out[off_y : off_y + new_h, off_x : off_x + new_w] = inner
    return out


def crop(img: np.ndarray, x: int, y: int, width: int, height: int) -> np.ndarray:
    """The width x height region at (x, y), which must lie inside the image."""
    if not (x >= 0 and y >= 0 and width > 0 and height > 0):
        raise ValueError(f"bad crop {width}x{height} at ({x}, {y})")
    if x + width > img.shape[1] or y + height > img.shape[0]:
        raise ValueError(
            f"crop {width}x{height} at ({x}, {y}) leaves a {img.shape[1]}x{img.shape[0]} image"
        )
    return np.ascontiguousarray(img[y : y + height, x : x + width])


def round_half_away(x: float) -> float:
    """C's round(): halves go away from zero (Python's round() goes to even). Exact for the
    float32 values it is given, whose x + 0.5 a double holds without rounding."""
    return math.copysign(math.floor(abs(x) + 0.5), x)


def fit_size(
    width: int,
    height: int,
    *,
    align: int,
    min_pixels: int = 0,
    max_pixels: int = 0,
    longest_edge: int = 0,
) -> tuple[int, int]:
    """llama.cpp's calc_size_preserved_ratio: (width, height) scaled to `longest_edge` (or kept)
    and rounded to multiples of `align`, then rescaled into [min_pixels, max_pixels] (0 = no
    bound). Float32 arithmetic throughout, as llama.cpp does it, so the sides agree exactly."""
    if width <= 0 or height <= 0:
        return 0, 0
    fa = _f32(align)

    def by(x: np.float32, op) -> int:
        return int(op(float(_f32(x) / fa))) * align

    if longest_edge > 0:
        scale = min(_f32(longest_edge) / _f32(width), _f32(longest_edge) / _f32(height))
        w_bar, h_bar = by(_f32(width) * scale, math.ceil), by(_f32(height) * scale, math.ceil)
    else:
        w_bar = max(align, by(_f32(width), round_half_away))
        h_bar = max(align, by(_f32(height), round_half_away))
    if max_pixels > 0 and h_bar * w_bar > max_pixels:
        beta = np.sqrt(_f32(height) * _f32(width) / _f32(max_pixels))
        h_bar = max(align, by(_f32(height) / beta, math.floor))
        w_bar = max(align, by(_f32(width) / beta, math.floor))
    elif min_pixels > 0 and h_bar * w_bar < min_pixels:
        beta = np.sqrt(_f32(min_pixels) / (_f32(height) * _f32(width)))
        h_bar = by(_f32(height) * beta, math.ceil)
        w_bar = by(_f32(width) * beta, math.ceil)
    return w_bar, h_bar
