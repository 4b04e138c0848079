"""Tiny random vision projectors (llama.cpp's clip GGUF, "mmproj") and the LMs they pair with.

`write_tiny_mmproj(path, projector, n_embd_lm)` writes a 2-layer vision encoder + projector with
the metadata keys, tensor names, shapes and types llama.cpp's converters write
(convert_hf_to_gguf.py's MmprojModel classes; for "mlp" the legacy
tools/mtmd/legacy-models/convert_image_encoder_to_gguf.py) and that tools/mtmd/clip.cpp
(load_hparams, load_tensors) reads:

- "gemma3":   SigLIP ViT, post_ln, then avg-pool by clip.vision.projector.scale_factor per side
              (tinygemma3 writes it; real Gemma 3 uses the default 4), RMS norm
              (mm.soft_emb_norm) and mm.input_projection (always F16, as the converter does).
- "idefics3": SigLIP ViT + pixel shuffle (scale_factor) + mm.model.fc; images bigger than
              image_size are cut into tiles of image_size after a resize to
              clip.vision.preproc_image_size (the longest edge), plus an overview.
- "mlp":      LLaVA 1.5's CLIP ViT (v.class_embd, v.pre_ln, quick-GELU, no post_ln), mm.0 -> GELU
              -> mm.2; llama.cpp runs n_layer - 1 blocks (no clip.vision.feature_layer key, as in
              the legacy converter's files). `pinpoints` adds llava 1.6's image_grid_pinpoints and
              mm_patch_merge_type "spatial_unpad".

`write_tiny_vlm_pair(dir, projector)` writes such a projector next to a tests/ggufgen.py LM
(gemma3 for "gemma3", llama for the others) whose vocabulary gains the special tokens that
llama.cpp's mtmd looks up for that projector. `write_test_image` makes deterministic images.
Sizes are tiny (images 28-56 px, patches of 7, width 32) so that an encode takes milliseconds.
"""

from __future__ import annotations

import io
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize

from ggufgen import write_tiny_model

F32, F16, Q8_0 = GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.Q8_0

PROJECTORS = ("gemma3", "idefics3", "mlp")

# The vision tower's shape per projector; keyword arguments of write_tiny_mmproj override these.
# n_embd and n_ff are multiples of 32 so every matrix can be Q8_0, and differ so that
# clip.cpp's legacy "ffn up/down swapped" check (ffn_down's ne[0] == n_embd) stays off.
DEFAULT_SHAPES: dict[str, dict[str, int]] = {
    # 8x8 patches pooled 2x2: 16 image tokens
    "gemma3": dict(
        image_size=56, patch_size=7, n_embd=32, n_ff=64, n_layer=2, n_head=2, scale_factor=2
    ),
    # 4x4 patches shuffled 2x2: 4 tokens per tile; up to 2x2 tiles + the overview (20 tokens)
    "idefics3": dict(
        image_size=28,
        patch_size=7,
        n_embd=32,
        n_ff=64,
        n_layer=2,
        n_head=2,
        scale_factor=2,
        preproc_image_size=56,
    ),
    # 4x4 patches + the class embedding: 16 image tokens; 3 blocks of which llama.cpp runs 2
    "mlp": dict(image_size=28, patch_size=7, n_embd=32, n_ff=64, n_layer=3, n_head=2),
}

# llava 1.6-style candidate resolutions (w, h) for the "mlp" projector with pinpoints=True
LLAVA16_PINPOINTS = ((28, 56), (56, 28), (56, 56))

SIGLIP_MEAN_STD = ([0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
CLIP_MEAN_STD = ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711])

# The LM architecture each projector comes with (Gemma 3; SmolVLM's and LLaVA's llama LMs).
LM_ARCH = {"gemma3": "gemma3", "idefics3": "llama", "mlp": "llama"}

# Special tokens mtmd.cpp needs in the LM's vocabulary (init_vision): gemma3 wraps an image in
# <start_of_image> ... <end_of_image>; idefics3 looks up "\n\n", <fake_token_around_image>,
# <global-img> and "\n" as single tokens (a missing one becomes token -1, an invalid
# token) and writes <row_R_col_C> before each tile. <image> is SmolVLM's template placeholder.
IDEFICS3_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>"] + [
    f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)
]
GEMMA3_TOKENS = ["<start_of_image>", "<end_of_image>"]


def write_tiny_mmproj(
    path,
    projector: str,
    n_embd_lm: int,
    *,
    qtype: GGMLQuantizationType = F32,
    seed: int = 0,
    pinpoints: bool = False,
    **shape: int,
) -> Path:
    """Write a random `projector` mmproj whose output width is `n_embd_lm`; returns the path.
    qtype: the matrices' type (F32, F16 or Q8_0); norms, biases and embeddings stay as the
    converters keep them. shape: image_size, patch_size, n_embd, n_ff, n_layer, n_head,
    scale_factor, preproc_image_size (DEFAULT_SHAPES[projector] for what is left out)."""
    if projector not in DEFAULT_SHAPES:
        raise ValueError(f"unknown projector {projector!r}; one of {PROJECTORS}")
    if pinpoints and projector != "mlp":
        raise ValueError("pinpoints (llava 1.6) only go with the mlp projector")
    s = {**DEFAULT_SHAPES[projector], **shape}
    image_size, patch, n_embd, n_ff = s["image_size"], s["patch_size"], s["n_embd"], s["n_ff"]
    n_patches = (image_size // patch) ** 2
    rng = np.random.default_rng(seed)
    path = Path(path)
    w = GGUFWriter(str(path), "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_name(f"tiny-mmproj-{projector}")
    w.add_file_type(_file_type(qtype))
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(projector)
    w.add_vision_image_size(image_size)
    w.add_vision_patch_size(patch)
    w.add_vision_embedding_length(n_embd)
    w.add_vision_feed_forward_length(n_ff)
    w.add_vision_block_count(s["n_layer"])
    w.add_vision_head_count(s["n_head"])
    w.add_vision_projection_dim(n_embd_lm)
    mean, std = CLIP_MEAN_STD if projector == "mlp" else SIGLIP_MEAN_STD
    w.add_vision_image_mean(mean)
    w.add_vision_image_std(std)
    # converters' defaults: Gemma 3's SigLIP 1e-6, SmolVLM's and CLIP's 1e-5
    w.add_vision_attention_layernorm_eps(1e-6 if projector == "gemma3" else 1e-5)
    # SigLIP uses tanh GELU; CLIP's quick_gelu is clip.cpp's default when use_gelu is false
    w.add_vision_use_gelu(projector != "mlp")
    if projector in ("gemma3", "idefics3"):
        w.add_vision_projector_scale_factor(s["scale_factor"])
    if projector == "idefics3":
        w.add_vision_preproc_image_size(s["preproc_image_size"])
    if pinpoints:
        w.add_array("clip.vision.image_grid_pinpoints", [v for wh in LLAVA16_PINPOINTS for v in wh])
        w.add_string("clip.vision.mm_patch_merge_type", "spatial_unpad")

    def add(name: str, data: np.ndarray, ttype: GGMLQuantizationType) -> None:
        # Q8_0 needs rows of whole 32-blocks; the converter falls back to F16 otherwise
        if ttype == Q8_0 and data.shape[-1] % 32:
            ttype = F16
        if ttype == F32:
            w.add_tensor(name, data.astype(np.float32))
        elif ttype == F16:
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, quantize(data.astype(np.float32), ttype), raw_dtype=ttype)

    def mat(name: str, rows: int, cols: int, gain: float = 1.0) -> None:
        # 1/sqrt(fan-in) keeps every layer's output near unit scale
        add(name + ".weight", rng.standard_normal((rows, cols)) * gain / np.sqrt(cols), qtype)

    def norm(name: str, n: int) -> None:
        add(name + ".weight", 1.0 + 0.05 * rng.standard_normal(n), F32)
        add(name + ".bias", 0.02 * rng.standard_normal(n), F32)

    def bias(name: str, n: int) -> None:
        add(name + ".bias", 0.02 * rng.standard_normal(n), F32)

    # ggml_conv_2d's kernel: numpy (out, in, kh, kw); CLIP's legacy converter saves 4-D tensors
    # F16 always, the SigLIP converters keep ".embeddings." F32
    legacy = projector == "mlp"
    embd_type = F16 if legacy and qtype != F32 else F32
    patch_w = rng.standard_normal((n_embd, 3, patch, patch)) / np.sqrt(3 * patch * patch)
    add("v.patch_embd.weight", patch_w, embd_type)
    n_pos = n_patches + (1 if legacy else 0)
    add("v.position_embd.weight", 0.1 * rng.standard_normal((n_pos, n_embd)), embd_type)
    if legacy:  # CLIP's patch conv has no bias; it has a class token and a pre-norm instead
        add("v.class_embd", 0.1 * rng.standard_normal(n_embd), F32)
        norm("v.pre_ln", n_embd)
    else:
        bias("v.patch_embd", n_embd)
    for il in range(s["n_layer"]):
        p = f"v.blk.{il}."
        norm(p + "ln1", n_embd)
        for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
            mat(p + t, n_embd, n_embd)
            bias(p + t, n_embd)
        norm(p + "ln2", n_embd)
        mat(p + "ffn_up", n_ff, n_embd)
        bias(p + "ffn_up", n_ff)
        mat(p + "ffn_down", n_embd, n_ff, 0.5)
        bias(p + "ffn_down", n_embd)
    # output scale ~0.5 per element, the tiny LMs' token embedding scale
    if projector == "gemma3":
        norm_w = 1.0 + 0.05 * rng.standard_normal(n_embd)  # converter's +1 already applied
        add("mm.soft_emb_norm.weight", norm_w, F32)
        # (vision, text) as in HF, transposed by clip.cpp; F16 always (llama.cpp issue 13025)
        proj = rng.standard_normal((n_embd, n_embd_lm)) * 0.5 / np.sqrt(n_embd)
        add("mm.input_projection.weight", proj, F16)
        norm("v.post_ln", n_embd)
    elif projector == "idefics3":
        mat("mm.model.fc", n_embd_lm, n_embd * s["scale_factor"] ** 2, 0.5)
        norm("v.post_ln", n_embd)
    else:  # llava's 2-layer MLP: hidden width = the LM's, as in LLaVA 1.5
        mat("mm.0", n_embd_lm, n_embd)
        bias("mm.0", n_embd_lm)
        mat("mm.2", n_embd_lm, n_embd_lm, 0.5)
        bias("mm.2", n_embd_lm)
        if pinpoints:  # llava 1.6's newline embedding, appended after each row of tiles
            add("v.image_newline", 0.1 * rng.standard_normal(n_embd_lm), F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _file_type(qtype: GGMLQuantizationType) -> int:
    return {
        F32: gguf.LlamaFileType.ALL_F32,
        F16: gguf.LlamaFileType.MOSTLY_F16,
        Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
    }[qtype]


def write_tiny_vlm_pair(
    directory,
    projector: str,
    *,
    qtype: GGMLQuantizationType = F32,
    lm_qtype: GGMLQuantizationType = Q8_0,
    seed: int = 0,
    pinpoints: bool = False,
    **shape: int,
) -> tuple[Path, Path]:
    """Write `<projector>-lm.gguf` and `<projector>-mmproj-<qtype>.gguf` into `directory`;
    returns (lm_path, mmproj_path). The LM is tests/ggufgen.py's tiny model of LM_ARCH[projector]
    (n_embd 64) with the projector's special tokens appended to its vocabulary."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arch = LM_ARCH[projector]
    base = write_tiny_model(
        directory / f"{projector}-lm-base.gguf", arch=arch, qtype=lm_qtype, seed=seed
    )
    lm = directory / f"{projector}-lm.gguf"
    extra = GEMMA3_TOKENS if projector == "gemma3" else IDEFICS3_TOKENS
    add_special_tokens(base, lm, extra, newline_pair=projector == "idefics3", seed=seed + 1)
    base.unlink()
    n_embd_lm = int(GGUFReader(str(lm)).fields[f"{arch}.embedding_length"].contents())
    mm = directory / f"{projector}-mmproj-{qtype.name.lower()}.gguf"
    write_tiny_mmproj(
        mm, projector, n_embd_lm, qtype=qtype, seed=seed, pinpoints=pinpoints, **shape
    )
    return lm, mm


def add_special_tokens(
    src, dst, tokens: list[str], *, newline_pair: bool = False, seed: int = 0
) -> Path:
    """Copy the LM `src` to `dst` with `tokens` appended as control tokens (and, for a gpt2
    vocabulary with newline_pair, a merged "\\n\\n" token "ĊĊ"), token_embd growing by random
    rows of the same type and scale."""
    r = GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    old = r.fields["tokenizer.ggml.tokens"].contents()
    spm = r.fields["tokenizer.ggml.model"].contents() == "llama"
    new_tokens = list(tokens) + (["ĊĊ"] if newline_pair and not spm else [])
    new_types = [3] * len(tokens) + ([1] if newline_pair and not spm else [])
    replace = {
        "tokenizer.ggml.tokens": old + new_tokens,
        "tokenizer.ggml.token_type": list(r.fields["tokenizer.ggml.token_type"].contents())
        + new_types,
        f"{arch}.vocab_size": len(old) + len(new_tokens),
    }
    if spm:
        replace["tokenizer.ggml.scores"] = list(r.fields["tokenizer.ggml.scores"].contents()) + [
            0.0
        ] * len(new_tokens)
    elif newline_pair:
        replace["tokenizer.ggml.merges"] = list(r.fields["tokenizer.ggml.merges"].contents()) + [
            "Ċ Ċ"
        ]
    w = GGUFWriter(str(dst), arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(key, replace.get(key, field.contents()), vtype, sub_type=sub)
    rng = np.random.default_rng(seed)
    for t in r.tensors:
        data = np.asarray(t.data)
        if t.name == "token_embd.weight":
            rows = (rng.standard_normal((len(new_tokens), int(t.shape[0]))) * 0.5).astype(
                np.float32
            )
            add = rows if t.tensor_type == F32 else quantize(rows, t.tensor_type)
            data = np.concatenate([data, add.astype(data.dtype)])
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def write_test_image(path, w: int, h: int, seed: int, fmt: str = "PNG") -> bytes:
    """A deterministic w x h RGB image (a smooth gradient under noise, so that resizing
    filters differ visibly) encoded as `fmt`; written to `path` unless it is None."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([255 * xx / max(w - 1, 1), 255 * yy / max(h - 1, 1), 128 + 0 * xx], axis=-1)
    pixels = np.clip(base * 0.6 + rng.integers(0, 256, (h, w, 3)) * 0.4, 0, 255)
    buf = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8), "RGB").save(buf, format=fmt)
    data = buf.getvalue()
    if path is not None:
        Path(path).write_bytes(data)
    return data
