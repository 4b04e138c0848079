"""engine/vision/preprocess.py and resize.py: image decoding as stb_image does it, llama.cpp's
resize kernels bit for bit (against a line-by-line numpy port of mtmd-image.cpp's
resize_pillow), and each projector's tiles against llama.cpp's own output
(tests/data/vision/, made by scripts/mtmd_preprocess_dump.cpp)."""

from __future__ import annotations

import io
import json
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from engine.errors import InvalidRequestError
from engine.vision.clip_file import ClipHParams, open_clip
from engine.vision.errors import MediaError
from engine.vision.preprocess import (
    decode_image,
    idefics3_layout,
    normalize,
    preprocess,
    select_best_resolution,
)
from engine.vision.resize import fit_size, resample, resize, round_half_away

DATA = Path(__file__).parent / "data" / "vision"

# ---------------------------------------------------------------------------------------------
# The oracle: mtmd-image.cpp's resize_pillow transcribed loop for loop (double coefficients,
# 22-bit fixed point, horizontal pass then vertical, uint8 between them).

PRECISION_BITS = 22
SUPPORT = {"bilinear": 1.0, "bicubic": 2.0, "lanczos": 3.0}


def _filter(algo: str, x: float) -> float:
    if algo == "lanczos":
        if -3.0 <= x < 3.0:

            def sinc(v: float) -> float:
                if v == 0.0:
                    return 1.0
                pv = v * 3.141592653589793238462643383279502884
                return math.sin(pv) / pv

            return sinc(x) * sinc(x / 3.0)
        return 0.0
    x = abs(x)
    if algo == "bilinear":
        return 1.0 - x if x < 1.0 else 0.0
    a = -0.5
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def _weights(algo: str, in_size: int, out_size: int):
    scale = filterscale = in_size / out_size
    filterscale = max(filterscale, 1.0)
    support = SUPPORT[algo] * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    bounds, kk = [], np.zeros((out_size, ksize), np.int64)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        ss = 1.0 / filterscale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        w = [_filter(algo, (x + xmin - center + 0.5) * ss) for x in range(xmax)]
        ww = 0.0
        for v in w:
            ww += v
        if ww != 0.0:
            w = [v / ww for v in w]
        for x, v in enumerate(w):
            kk[xx, x] = int(v * (1 << PRECISION_BITS) + (-0.5 if v < 0 else 0.5))
        bounds.append((xmin, xmax))
    return bounds, kk


def _pass(src: np.ndarray, algo: str, out_size: int) -> np.ndarray:
    """Resample axis 1 of (n, in, 3) int64 pixels."""
    bounds, kk = _weights(algo, src.shape[1], out_size)
    out = np.empty((src.shape[0], out_size, src.shape[2]), np.int64)
    for xx, (xmin, cnt) in enumerate(bounds):
        acc = np.full((src.shape[0], src.shape[2]), 1 << (PRECISION_BITS - 1), np.int64)
        for x in range(cnt):
            acc += src[:, xmin + x, :] * kk[xx, x]
        out[:, xx, :] = np.clip(acc >> PRECISION_BITS, 0, 255)
    return out


def oracle_resample(img: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    x = img.astype(np.int64)
    if width != img.shape[1]:
        x = _pass(x, algo, width)
    if height != img.shape[0]:
        x = _pass(x.transpose(1, 0, 2), algo, height).transpose(1, 0, 2)
    return x.astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# resize kernels


@pytest.mark.parametrize("algo", ["bilinear", "bicubic", "lanczos"])
def test_resample_matches_llama_cpp_bit_for_bit(algo):
    rng = np.random.default_rng({"bilinear": 1, "bicubic": 2, "lanczos": 3}[algo])
    for trial in range(40):
        h, w = rng.integers(1, 70, 2)
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if trial % 2:  # hard black/white edges: the kernels' overshoot must clamp the same way
            img[:] = np.where(rng.random((h, w, 1)) < 0.5, 0, 255)
        tw, th = (int(v) for v in rng.integers(1, 110, 2))
        got = resample(img, tw, th, algo)
        assert got.dtype == np.uint8 and got.shape == (th, tw, 3)
        np.testing.assert_array_equal(
            got, oracle_resample(img, tw, th, algo), f"{w}x{h}->{tw}x{th}"
        )


def test_resample_order_is_horizontal_then_vertical():
    # Pillow alone would run the vertical pass first for this shape; the uint8 rounding
    # between the passes makes the order visible
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, (51, 68, 3), dtype=np.uint8)
    want = oracle_resample(img, 63, 18, "lanczos")
    np.testing.assert_array_equal(resample(img, 63, 18, "lanczos"), want)
    other = Image.fromarray(img).resize((63, 18), Image.Resampling.LANCZOS)
    assert not np.array_equal(np.asarray(other), want)


def test_resample_in_parallel_bands_is_the_same():
    from engine import parallel

    rng = np.random.default_rng(9)
    img = rng.integers(0, 256, (600, 700, 3), dtype=np.uint8)  # 1.26 MB: split into bands
    before = parallel.pool_size()
    parallel.set_pool_size(3)
    try:
        got = resample(img, 301, 257, "lanczos")
    finally:
        parallel.set_pool_size(before)
    np.testing.assert_array_equal(got, oracle_resample(img, 301, 257, "lanczos"))


def test_resample_bad_target_is_a_media_error():
    img = np.zeros((4, 4, 3), np.uint8)
    for w, h in ((0, 4), (4, 0), (65537, 4)):
        with pytest.raises(MediaError, match="out of range"):
            resample(img, w, h, "bilinear")


def test_resize_pad_ceil_centres_on_the_pad_colour():
    img = np.full((30, 40, 3), 200, np.uint8)
    out = resize(img, 56, 56, "bilinear", "ceil", (1, 2, 3))
    # scale 56/40 = 1.4: 56 x ceil(30 * 1.4) = 42 rows, offset (56 - 42) // 2 = 7
    assert out.shape == (56, 56, 3)
    assert (out[:7] == (1, 2, 3)).all() and (out[49:] == (1, 2, 3)).all()
    np.testing.assert_array_equal(out[7:49], oracle_resample(img, 56, 42, "bilinear"))
    # same size: a copy, no padding, whatever the style
    np.testing.assert_array_equal(resize(img, 40, 30, "bicubic", "ceil", (9, 9, 9)), img)


def test_resize_pad_none_stretches():
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (10, 30, 3), dtype=np.uint8)
    np.testing.assert_array_equal(
        resize(img, 20, 20, "bicubic", "none"), oracle_resample(img, 20, 20, "bicubic")
    )


def test_resize_pad_nearest_rounds():
    img = np.zeros((3, 7, 3), np.uint8)
    out = resize(img, 10, 10, "bilinear", "nearest", (255, 255, 255))
    # scale 10/7: round(3 * 1.4286) = 4 rows at round((10 - 4) / 2) = 3
    assert (out[3:7] == 0).all() and (out[:3] == 255).all() and (out[7:] == 255).all()


def test_round_half_away_is_c_round():
    assert [round_half_away(v) for v in (0.5, 1.5, 2.5, -0.5, 2.4999, 3.0)] == [1, 2, 3, -1, 2, 3]


def test_fit_size_smart_resize():
    # no bounds: each side rounded to the alignment, at least one unit
    assert fit_size(100, 60, align=28) == (112, 56)
    assert fit_size(5, 5, align=28) == (28, 28)
    # longest edge first (ceil to the alignment), then the pixel cap floors it back
    assert fit_size(100, 60, align=28, longest_edge=56) == (56, 56)
    assert fit_size(100, 60, align=28, max_pixels=1568, longest_edge=56) == (28, 28)
    # the floor raises it
    assert fit_size(30, 20, align=28, min_pixels=20 * 196, longest_edge=56) == (84, 56)
    assert fit_size(0, 10, align=28) == (0, 0)


def test_select_best_resolution():
    pins = ((28, 56), (56, 28), (56, 56))
    assert select_best_resolution(50, 30, pins) == (56, 56)  # keeps all 1500 pixels
    assert select_best_resolution(60, 20, pins) == (56, 28)  # 1008 kept, least waste
    assert select_best_resolution(30, 70, pins) == (28, 56)
    assert select_best_resolution(100, 100, pins) == (56, 56)
    # a tie on the kept resolution goes to the least waste
    assert select_best_resolution(20, 20, pins) == (28, 56)


def test_normalize_is_float32_as_clip_image_f32():
    hp = _hp("gemma3", mean=(0.48145466, 0.4578275, 0.40821073), std=(0.2686, 0.2613, 0.2757))
    img = np.arange(256, dtype=np.uint8).repeat(3).reshape(16, 16, 3)
    got = normalize(hp, img)
    assert got.dtype == np.float32
    for c in range(3):
        v = img[..., c].astype(np.float32) / np.float32(255)
        want = (v - np.float32(hp.image_mean[c])) / np.float32(hp.image_std[c])
        np.testing.assert_array_equal(got[..., c], want)


# ---------------------------------------------------------------------------------------------
# decoding


def _encode(arr_or_im, fmt="PNG", **kw) -> bytes:
    im = arr_or_im if isinstance(arr_or_im, Image.Image) else Image.fromarray(arr_or_im)
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _chunk(kind: bytes, body: bytes) -> bytes:
    crc = struct.pack(">I", zlib.crc32(kind + body))
    return struct.pack(">I", len(body)) + kind + body + crc


def _png_header_only(w: int, h: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\0" * 16))


def test_decode_rgb_png_is_exact():
    rng = np.random.default_rng(0)
    px = rng.integers(0, 256, (17, 23, 3), dtype=np.uint8)
    got = decode_image(_encode(px))
    assert got.dtype == np.uint8 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, px)


def test_decode_alpha_is_dropped_not_composited():
    rgba = np.zeros((4, 5, 4), np.uint8)
    rgba[..., 0], rgba[..., 1], rgba[..., 2] = 200, 100, 50
    rgba[..., 3] = np.arange(20, dtype=np.uint8).reshape(4, 5) * 13  # 0 = fully transparent
    got = decode_image(_encode(rgba))
    assert (got == (200, 100, 50)).all()
    la = np.stack([np.full((3, 3), 77, np.uint8), np.zeros((3, 3), np.uint8)], axis=-1)
    assert (decode_image(_encode(Image.fromarray(la, "LA"))) == 77).all()


def test_decode_grey_palette_and_bilevel():
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4) * 20
    got = decode_image(_encode(grey))
    np.testing.assert_array_equal(got, np.repeat(grey[..., None], 3, axis=2))
    pal = Image.new("P", (3, 2))
    pal.putpalette([10, 20, 30, 40, 50, 60] + [0] * 762)
    pal.putdata([0, 1, 0, 1, 1, 0])
    pal.info["transparency"] = 0
    got = decode_image(_encode(pal, transparency=0))
    assert (got[0, 0] == (10, 20, 30)).all() and (got[0, 1] == (40, 50, 60)).all()
    bits = Image.fromarray(np.array([[0, 255], [255, 0]], np.uint8)).convert("1")
    np.testing.assert_array_equal(decode_image(_encode(bits))[..., 0], [[0, 255], [255, 0]])


def test_decode_16_bit_keeps_the_high_byte():
    # stb_image's stbi__convert_16_to_8: v >> 8 (not a clip at 255, not a rounding)
    grey16 = np.array([[0, 255, 256, 0x7FFF], [0x8000, 0xFF00, 0xFFFF, 1000]], np.uint16)
    im = Image.frombytes("I;16", (4, 2), grey16.astype("<u2").tobytes())
    got = decode_image(_encode(im))
    np.testing.assert_array_equal(got[..., 1], grey16 >> 8)


def test_decode_16_bit_rgb_png_keeps_the_high_byte():
    rgb16 = np.random.default_rng(4).integers(0, 65536, (3, 4, 3)).astype(">u2")
    raw = b"".join(b"\0" + row.tobytes() for row in rgb16)  # filter type 0 per row
    ihdr = struct.pack(">IIBBBBB", 4, 3, 16, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(raw))
    data += _chunk(b"IEND", b"")
    np.testing.assert_array_equal(decode_image(data), rgb16 >> 8)


def test_decode_animation_gives_the_first_frame():
    frames = [Image.new("RGB", (4, 4), c) for c in ((255, 0, 0), (0, 255, 0))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=50)
    got = decode_image(buf.getvalue())
    assert (got == (255, 0, 0)).all()


def test_decode_gif_transparent_pixels_are_black():
    # stb_image does not draw a GIF's transparent pixels onto its zeroed canvas
    im = Image.new("P", (2, 2))
    im.putpalette([10, 20, 30, 40, 50, 60] + [0] * 762)
    im.putdata([0, 1, 1, 0])
    got = decode_image(_encode(im, "GIF", transparency=1))
    assert (got[0, 0] == (10, 20, 30)).all() and (got[0, 1] == 0).all()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_decode_applies_exif_orientation(orientation):
    rng = np.random.default_rng(orientation)
    px = rng.integers(0, 256, (3, 5, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _encode(px, "PNG", exif=exif)
    want = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    np.testing.assert_array_equal(decode_image(data), want)
    np.testing.assert_array_equal(decode_image(data, exif_orientation=False), px)


def test_decode_refuses_huge_images_from_the_header():
    with pytest.raises(MediaError, match="too large"):
        decode_image(_png_header_only(100_000, 100_000))
    with pytest.raises(MediaError, match="too large"):
        decode_image(_encode(np.zeros((20, 20, 3), np.uint8)), max_pixels=399)
    ok = decode_image(_encode(np.zeros((20, 20, 3), np.uint8)), max_pixels=400)
    assert ok.shape == (20, 20, 3)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello, I am not an image",
        b"\x89PNG\r\n\x1a\n",
        _png_header_only(64, 64),  # the IDAT holds far fewer rows than the header says
    ],
)
def test_decode_bad_bytes_are_media_errors(data):
    with pytest.raises(MediaError, match="^failed to load image") as e:
        decode_image(data)
    assert isinstance(e.value, InvalidRequestError)


def test_decode_truncated_jpeg_and_png():
    px = np.random.default_rng(3).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    for fmt in ("JPEG", "PNG"):
        data = _encode(px, fmt)
        with pytest.raises(MediaError, match="^failed to load image"):
            decode_image(data[: len(data) // 2])


# ---------------------------------------------------------------------------------------------
# per projector, against llama.cpp


def _hp(ptype: str, **kw) -> ClipHParams:
    base = dict(
        projector_type=ptype,
        image_size=56,
        patch_size=7,
        n_embd=32,
        n_ff=64,
        n_head=2,
        n_layer=2,
        projection_dim=64,
        eps=1e-6,
        image_mean=(0.5, 0.5, 0.5),
        image_std=(0.5, 0.5, 0.5),
        ffn_op="gelu",
        resize_algo={"gemma3": "bilinear", "idefics3": "lanczos"}.get(ptype, "bicubic"),
    )
    base.update(kw)
    mean, std = base.pop("mean", None), base.pop("std", None)
    if mean:
        base["image_mean"], base["image_std"] = mean, std
    return ClipHParams(**base)


CASES = json.loads((DATA / "cases.json").read_text()) if (DATA / "cases.json").exists() else []


@pytest.fixture(scope="module")
def mmprojs(tmp_path_factory):
    """The hyper-parameters of each case's tiny mmproj, as the engine reads them."""
    from mmprojgen import write_tiny_mmproj

    tmp = tmp_path_factory.mktemp("mmproj")
    cache: dict[str, ClipHParams] = {}

    def get(c: dict) -> ClipHParams:
        key = json.dumps([c["projector"], c["pinpoints"], c["shape"]], sort_keys=True)
        if key not in cache:
            path = tmp / f"{len(cache)}.gguf"
            write_tiny_mmproj(path, c["projector"], 64, pinpoints=c["pinpoints"], **c["shape"])
            f, cache[key] = open_clip(str(path))
            f.close()
        return cache[key]

    return get


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_preprocess_matches_llama_cpp(case, mmprojs):
    ref = np.load(DATA / f"{case['name']}.npz")
    data = (DATA / case["image"]).read_bytes()
    rgb = decode_image(data)
    if case["image"].endswith(".png"):
        np.testing.assert_array_equal(rgb, ref["decoded"])
    # the preprocessing itself from llama.cpp's decoded pixels (JPEG decoders differ a little)
    min_t, max_t = case["tokens"] or (None, None)
    out = preprocess(mmprojs(case), ref["decoded"], min_tokens=min_t, max_tokens=max_t)
    entries = [ref[f"entry_{i}"] for i in range(sum(k.startswith("entry_") for k in ref.files))]
    gx, gy = (int(v) for v in ref["grid"])
    if "overview" in ref.files:
        # llama-uhd style: the slices in mtmd's order, then the overview (ov_img_first false)
        want = entries + [ref["overview"]]
        assert out.overview == len(want) - 1
        assert out.grid == ((gy, gx) if gx and gy else None)
    else:
        want = entries
        assert out.overview is None and out.grid is None
    assert len(out.tiles) == len(want)
    for got, w in zip(out.tiles, want, strict=True):
        assert got.dtype == np.float32 and got.shape == w.shape
        np.testing.assert_array_equal(got, w)  # bit for bit (the brief allowed 1e-6)
    assert out.sizes == [(w.shape[1], w.shape[0]) for w in want]
    assert sorted(i for kind, i in out.layout if kind == "tile") == list(range(len(want)))


def test_fixtures_are_present():
    # the llama.cpp comparisons above must not silently vanish
    assert len(CASES) >= 20
    assert {c["projector"] for c in CASES} == {"gemma3", "idefics3", "mlp"}


def test_layouts():
    hp = _hp("gemma3")
    out = preprocess(hp, np.zeros((10, 20, 3), np.uint8))
    assert out.layout == (("text", "<start_of_image>"), ("tile", 0), ("text", "<end_of_image>"))
    assert idefics3_layout(2, 2) == [
        ("text", "<fake_token_around_image><row_1_col_1>"),
        ("tile", 0),
        ("text", "<fake_token_around_image><row_1_col_2>"),
        ("tile", 1),
        ("piece", "\n"),
        ("text", "<fake_token_around_image><row_2_col_1>"),
        ("tile", 2),
        ("text", "<fake_token_around_image><row_2_col_2>"),
        ("tile", 3),
        ("piece", "\n\n"),
        ("piece", "<fake_token_around_image>"),
        ("piece", "<global-img>"),
        ("tile", 4),
        ("piece", "<fake_token_around_image>"),
    ]
    mlp = preprocess(_hp("mlp", image_size=28), np.zeros((5, 5, 3), np.uint8))
    assert mlp.layout == (("tile", 0),) and mlp.sizes == [(28, 28)]


def test_idefics3_too_thin_is_a_media_error():
    hp = _hp("idefics3", image_size=28, n_merge=2, image_longest_edge=56)
    with pytest.raises(MediaError):
        preprocess(hp, np.zeros((1, 200, 3), np.uint8))  # 56 / 200 rows -> 0


def test_preprocess_rejects_a_non_rgb_array():
    with pytest.raises(ValueError):
        preprocess(_hp("gemma3"), np.zeros((4, 4), np.uint8))
