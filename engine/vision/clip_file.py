"""A multimodal projector file (llama.cpp's clip GGUF: `clip.*` / `clip.vision.*` keys, `v.*` and
`mm.*` tensors) read through the engine's mmap'd GGUF reader: its hyper-parameters
(`ClipHParams`, as tools/mtmd/clip.cpp's load_hparams fills clip_hparams) and its tensors.

Only what the supported projector types use is read; anything else about the file is the
encoder's business (engine/vision/encoder.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import GGUFError
from ..gguf_file import GGUFFile, closing_on_error

# projector types this engine encodes, and what llama.cpp calls the others it knows
SUPPORTED_PROJECTORS = ("gemma3", "idefics3", "mlp")


class UnsupportedProjectorError(GGUFError):
    """The mmproj's projector type is one llama.cpp knows and this engine does not encode yet."""


@dataclass(frozen=True)
class ClipHParams:
    """The vision tower's shape and its preprocessing, as clip.cpp reads them.

    resize_algo: "bilinear" | "bicubic" | "lanczos" (clip_hparams.image_resize_algo);
    ffn_op: "gelu" | "gelu_quick" | "silu"; n_merge: patches merged per side (gemma3's
    average pool, idefics3's pixel shuffle); grid_pinpoints: llava 1.6's candidate
    resolutions (w, h); image_longest_edge: idefics3's preprocessing size.
    """

    projector_type: str
    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_head: int
    n_layer: int
    projection_dim: int
    eps: float
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    ffn_op: str
    n_merge: int = 1
    resize_algo: str = "bicubic"
    feature_layers: tuple[int, ...] = ()
    grid_pinpoints: tuple[tuple[int, int], ...] = ()
    patch_merge_type: str = "flat"
    image_longest_edge: int = 0
    image_min_pixels: int = -1
    image_max_pixels: int = -1

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_patches_side(self) -> int:
        return self.image_size // self.patch_size


def read_hparams(f: GGUFFile) -> ClipHParams:
    """The vision hyper-parameters of an mmproj file; GGUFError for a file that is not one,
    UnsupportedProjectorError for a projector this engine cannot encode."""
    if f.get_str("general.architecture", "") != "clip":
        raise GGUFError(
            f"{f.path}: not a multimodal projector (general.architecture is "
            f"{f.get_str('general.architecture', '?')!r}, expected 'clip')"
        )
    if not f.get_bool("clip.has_vision_encoder", False):
        raise UnsupportedProjectorError(
            f"{f.path}: this projector has no vision encoder (audio projectors are not supported)"
        )
    ptype = f.get_str("clip.projector_type", "") or f.get_str("clip.vision.projector_type", "")
    if not ptype:
        raise GGUFError(f"{f.path}: missing metadata key 'clip.projector_type'")
    if ptype not in SUPPORTED_PROJECTORS:
        raise UnsupportedProjectorError(
            f"{f.path}: projector type '{ptype}' is not supported; supported projector types: "
            + ", ".join(SUPPORTED_PROJECTORS)
        )

    def u32(key: str, default: int | None = None) -> int:
        k = f"clip.vision.{key}"
        if default is not None and not f.has(k):
            return default
        return f.get_int(k, lo=0, hi=1 << 20)

    mean = [float(x) for x in f.get_array("clip.vision.image_mean", [])]
    std = [float(x) for x in f.get_array("clip.vision.image_std", [])]
    if len(mean) < 3 or len(std) < 3:
        raise GGUFError(f"{f.path}: image_mean/image_std must have 3 elements each")
    if any(s == 0 for s in std[:3]):
        raise GGUFError(f"{f.path}: image_std has a zero element")
    gelu = f.get_bool("clip.use_gelu", False)
    silu = f.get_bool("clip.use_silu", False)
    if gelu and silu:
        raise GGUFError(f"{f.path}: both clip.use_gelu and clip.use_silu are set")
    ffn_op = "gelu" if gelu else "silu" if silu else "gelu_quick"
    pins = [int(x) for x in f.get_array("clip.vision.image_grid_pinpoints", [])]
    if len(pins) % 2:
        raise GGUFError(f"{f.path}: image_grid_pinpoints must have an even number of elements")
    n_layer = u32("block_count")
    feature_layers = tuple(int(x) for x in f.get_array("clip.vision.feature_layer", []))
    if any(v > n_layer or v < 0 for v in feature_layers):
        raise GGUFError(f"{f.path}: feature layer index out of range (n_layer {n_layer})")
    n_embd, n_head = u32("embedding_length"), u32("attention.head_count")
    image_size, patch_size = u32("image_size"), u32("patch_size")
    if not (n_embd and n_head and n_embd % n_head == 0 and patch_size and image_size >= patch_size):
        raise GGUFError(
            f"{f.path}: inconsistent vision shape (embedding {n_embd}, heads {n_head}, "
            f"image {image_size}, patch {patch_size})"
        )
    n_merge, algo, longest = 1, "bicubic", 0
    if ptype == "gemma3":
        n_merge, algo = u32("projector.scale_factor", 4), "bilinear"
    elif ptype == "idefics3":
        n_merge, algo = u32("projector.scale_factor", 1), "lanczos"
        longest = u32("preproc_image_size", 0)
    if n_merge < 1 or (image_size // patch_size) % n_merge:
        raise GGUFError(f"{f.path}: scale factor {n_merge} does not divide the patch grid")
    eps = f.get_float("clip.vision.attention.layer_norm_epsilon", lo=0.0, hi=1.0)
    return ClipHParams(
        projector_type=ptype,
        image_size=image_size,
        patch_size=patch_size,
        n_embd=n_embd,
        n_ff=u32("feed_forward_length"),
        n_head=n_head,
        n_layer=n_layer,
        projection_dim=u32("projection_dim", 0),
        eps=eps,
        image_mean=(mean[0], mean[1], mean[2]),
        image_std=(std[0], std[1], std[2]),
        ffn_op=ffn_op,
        n_merge=n_merge,
        resize_algo=algo,
        feature_layers=feature_layers,
        grid_pinpoints=tuple((pins[i], pins[i + 1]) for i in range(0, len(pins), 2)),
        patch_merge_type=f.get_str("clip.vision.mm_patch_merge_type", "flat") or "flat",
        image_longest_edge=longest,
        image_min_pixels=f.get_int("clip.vision.image_min_pixels")
        if f.has("clip.vision.image_min_pixels")
        else -1,
        image_max_pixels=f.get_int("clip.vision.image_max_pixels")
        if f.has("clip.vision.image_max_pixels")
        else -1,
    )


def open_clip(path: str) -> tuple[GGUFFile, ClipHParams]:
    """The mapped mmproj file and its hyper-parameters (the file is closed on any error)."""
    f = GGUFFile(path)
    with closing_on_error(f):
        return f, read_hparams(f)
