"""Regenerate llama.cpp's preprocessing fixtures (see README.md here).

    python tests/data/vision/make_fixtures.py DUMP_BINARY

For each case in CASES: writes the input image (PNG unless named .jpg) here, a tiny mmproj
with tests/mmprojgen.py into a temporary folder, runs scripts/mtmd_preprocess_dump.cpp's binary
(llama.cpp's decoder and preprocessor) on them, and stores what it printed as <case>.npz:
decoded (H, W, 3) uint8, grid (grid_x, grid_y), overview (h, w, 3) float32 if any, entry_<i>.
cases.json records the cases for the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # tests/

from mmprojgen import write_test_image, write_tiny_mmproj  # noqa: E402

# name -> projector, mmproj shape overrides, pinpoints, image (w, h, seed, format), tokens
IDEFICS_BIG = dict(image_size=32, patch_size=8, n_embd=32, n_ff=64, preproc_image_size=100)
CASES: list[dict] = []


def case(name, projector, w, h, seed, *, fmt="PNG", pinpoints=False, shape=None, tokens=None):
    CASES.append(
        dict(
            name=name,
            projector=projector,
            pinpoints=pinpoints,
            shape=shape or {},
            image=f"{name}.{'jpg' if fmt == 'JPEG' else 'png'}",
            size=[w, h],
            seed=seed,
            tokens=tokens,
        )
    )


case("gemma3_56x56", "gemma3", 56, 56, 1)  # no resize at all
case("gemma3_40x30", "gemma3", 40, 30, 2)  # upscale, padded top and bottom
case("gemma3_200x90", "gemma3", 200, 90, 3)  # downscale, padded
case("gemma3_31x77", "gemma3", 31, 77, 4)  # portrait, padded left and right
case("gemma3_300x7", "gemma3", 300, 7, 5)  # a strip: 2 rows of picture
case("gemma3_jpeg_120x80", "gemma3", 120, 80, 6, fmt="JPEG")  # stb_image's JPEG decoder
case("idefics3_56x56", "idefics3", 56, 56, 7)
case("idefics3_100x60", "idefics3", 100, 60, 8)
case("idefics3_60x100", "idefics3", 60, 100, 9)
case("idefics3_20x13", "idefics3", 20, 13, 10)  # upscaled to the longest edge
case("idefics3_300x20", "idefics3", 300, 20, 11)  # odd height rounded up to even
case("idefics3_big_170x130", "idefics3", 170, 130, 12, shape=IDEFICS_BIG)
case("idefics3_big_90x170", "idefics3", 90, 170, 13, shape=IDEFICS_BIG)
case("idefics3_tok_100x60", "idefics3", 100, 60, 14, tokens=[1, 8])  # smart resize, capped
case("idefics3_tok_30x20", "idefics3", 30, 20, 15, tokens=[16, 64])  # smart resize, raised
case("idefics3_big_tok_170x130", "idefics3", 170, 130, 16, shape=IDEFICS_BIG, tokens=[4, 40])
case("mlp_28x28", "mlp", 28, 28, 17)
case("mlp_50x20", "mlp", 50, 20, 18)  # padded with (122, 116, 104)
case("mlp_13x40", "mlp", 13, 40, 19)
case("llava16_20x20", "mlp", 20, 20, 20, pinpoints=True)  # overview only
case("llava16_50x30", "mlp", 50, 30, 21, pinpoints=True)
case("llava16_30x70", "mlp", 30, 70, 22, pinpoints=True)
case("llava16_100x100", "mlp", 100, 100, 23, pinpoints=True)
case("llava16_61x40", "mlp", 61, 40, 24, pinpoints=True)


def read_dump(path: Path) -> dict[str, np.ndarray]:
    b = path.read_bytes()
    assert b[:4] == b"MTPD"
    pos = 8

    def i32() -> int:
        nonlocal pos
        v = int(np.frombuffer(b, "<i4", 1, pos)[0])
        pos += 4
        return v

    def arr(dtype, n):
        nonlocal pos
        a = np.frombuffer(b, dtype, n, pos)
        pos += a.nbytes
        return a

    nx, ny = i32(), i32()
    out = {"decoded": arr(np.uint8, nx * ny * 3).reshape(ny, nx, 3)}
    gx, gy, has_ov, n = i32(), i32(), i32(), i32()
    out["grid"] = np.array([gx, gy], np.int32)

    def f32img():
        w, h = i32(), i32()
        return arr("<f4", w * h * 3).reshape(h, w, 3)

    if has_ov:
        out["overview"] = f32img()
    for i in range(n):
        out[f"entry_{i}"] = f32img()
    assert pos == len(b)
    return out


def main(dump: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for c in CASES:
            mmproj = Path(tmp) / f"{c['name']}.gguf"
            write_tiny_mmproj(mmproj, c["projector"], 64, pinpoints=c["pinpoints"], **c["shape"])
            fmt = "JPEG" if c["image"].endswith(".jpg") else "PNG"
            write_test_image(HERE / c["image"], *c["size"], c["seed"], fmt)
            out = Path(tmp) / "out.bin"
            extra = [str(t) for t in c["tokens"]] if c["tokens"] else []
            subprocess.run(
                [dump, str(mmproj), str(HERE / c["image"]), str(out), *extra],
                check=True,
                capture_output=True,
            )
            np.savez_compressed(HERE / f"{c['name']}.npz", **read_dump(out))
    (HERE / "cases.json").write_text(json.dumps(CASES, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
