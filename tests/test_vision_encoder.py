"""The vision towers and projectors against the float64 oracle (tests/vision_oracle.py), on tiny
random mmproj files of each supported projector type and weight type; and the mmproj loader's
errors for files that are not a projector or hold an unsupported one."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFWriter

from engine.errors import GGUFError
from engine.vision import UnsupportedProjectorError
from engine.vision.clip_file import open_clip
from engine.vision.encoder import encode_tile, load_weights, n_output_tokens
from mmprojgen import DEFAULT_SHAPES, F16, F32, Q8_0, write_tiny_mmproj
from vision_oracle import encode as oracle_encode

N_EMBD_LM = 64
# relative error against the float64 oracle: float32 arithmetic and ggml's float16 GELU table
# for F32 weights; the weight type's rounding of the activations on top for F16 / Q8_0
TOL = {F32: 2e-3, F16: 5e-3, Q8_0: 3e-2}


def _tile(size: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(-1.5, 1.5, (size, size, 3)).astype(np.float32)


@pytest.mark.parametrize("qtype", [F32, F16, Q8_0], ids=["f32", "f16", "q8_0"])
@pytest.mark.parametrize("projector", ["gemma3", "idefics3", "mlp"])
def test_encoder_matches_oracle(tmp_path, projector, qtype):
    path = write_tiny_mmproj(tmp_path / "mm.gguf", projector, N_EMBD_LM, qtype=qtype, seed=3)
    f, hp = open_clip(str(path))
    try:
        w = load_weights(f, hp, N_EMBD_LM)
        tile = _tile(hp.image_size, 7)
        got = encode_tile(hp, w, tile)
        want = oracle_encode(path, tile)
        assert got.shape == want.shape == (n_output_tokens(hp, *tile.shape[:2]), N_EMBD_LM)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < TOL[qtype], f"{projector}/{qtype.name}: relative error {err:.2e}"
    finally:
        f.close()


def test_encoder_is_not_trivially_constant(tmp_path):
    """Different images give different embeddings, and the token order follows the patch
    grid: a tile whose halves are swapped gives rows in another order, not the same set."""
    path = write_tiny_mmproj(tmp_path / "mm.gguf", "gemma3", N_EMBD_LM, seed=1)
    f, hp = open_clip(str(path))
    try:
        w = load_weights(f, hp, N_EMBD_LM)
        a = encode_tile(hp, w, _tile(hp.image_size, 1))
        b = encode_tile(hp, w, _tile(hp.image_size, 2))
        assert np.abs(a - b).max() > 1e-2
    finally:
        f.close()


def test_token_counts():
    shapes = DEFAULT_SHAPES
    assert shapes["gemma3"]["image_size"] == 56  # 8x8 patches of 7, pooled 2x2: 16 tokens


def _clip_file(path, **kv):
    w = GGUFWriter(str(path), kv.pop("arch", "clip"))
    for k, v in kv.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_unsupported_projector_names_it_and_lists_supported(tmp_path):
    p = _clip_file(
        tmp_path / "q.gguf",
        **{"clip.has_vision_encoder": True, "clip.projector_type": "qwen2.5vl_merger"},
    )
    with pytest.raises(UnsupportedProjectorError, match="qwen2.5vl_merger.*gemma3, idefics3, mlp"):
        open_clip(p)


def test_a_text_model_is_not_a_projector(tmp_path):
    p = _clip_file(tmp_path / "lm.gguf", arch="llama")
    with pytest.raises(GGUFError, match="not a multimodal projector"):
        open_clip(p)


def test_audio_only_projector_is_refused(tmp_path):
    p = _clip_file(
        tmp_path / "a.gguf", **{"clip.has_audio_encoder": True, "clip.projector_type": "ultravox"}
    )
    with pytest.raises(UnsupportedProjectorError, match="no vision encoder"):
        open_clip(p)


def test_missing_tensor_is_named(tmp_path):
    from gguf import GGUFReader

    src = write_tiny_mmproj(tmp_path / "mm.gguf", "idefics3", N_EMBD_LM)
    r = GGUFReader(str(src))
    w = GGUFWriter(str(tmp_path / "cut.gguf"), "clip")
    for field in r.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(
            field.name,
            field.contents(),
            field.types[0],
            field.types[-1] if len(field.types) > 1 else None,
        )
    for t in r.tensors:
        if t.name != "mm.model.fc.weight":
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f, hp = open_clip(str(tmp_path / "cut.gguf"))
    try:
        with pytest.raises(GGUFError, match="mm.model.fc.weight"):
            load_weights(f, hp, N_EMBD_LM)
    finally:
        f.close()


def test_an_encode_stops_between_layers_when_cancelled(tmp_path):
    import threading

    from engine.vision import EncodeCancelled

    path = write_tiny_mmproj(tmp_path / "mm.gguf", "gemma3", N_EMBD_LM)
    f, hp = open_clip(str(path))
    try:
        w = load_weights(f, hp, N_EMBD_LM)
        stop = threading.Event()
        stop.set()
        with pytest.raises(EncodeCancelled):
            encode_tile(hp, w, _tile(hp.image_size, 1), cancel=stop)
        assert encode_tile(hp, w, _tile(hp.image_size, 1), cancel=threading.Event()).shape[0] == 16
    finally:
        f.close()


def test_gelu_tables_are_ggmls():
    """The numba lookups equal numpy's float16 rounding into ggml's tables, edges included."""
    from engine.vision import encoder as E

    rng = np.random.default_rng(0)
    scales = (1e-9, 1e-7, 1e-5, 1e-3, 1.0, 5.0, 9.99, 100.0, 7e4)
    x = np.concatenate([rng.standard_normal(20000) * s for s in scales]).astype(np.float32)
    edges = [np.inf, -np.inf, 65504, 65519, 65520, -65520, 6.1e-5, 5.96e-8, 2.98e-8, 0.0, -10, 10]
    x = np.concatenate([x, np.array(edges, np.float32)])
    with np.errstate(all="ignore"):
        h = x.astype(np.float16).view(np.uint16)
        want_gelu = np.where(x <= -10, 0, np.where(x >= 10, x, E._GELU[h])).astype(np.float32)
        want_quick = E._GELU_QUICK[h]
        for got, want in ((E.gelu(x), want_gelu), (E.gelu_quick(x), want_quick)):
            same = (got == want) | (np.isnan(got) & np.isnan(want))
            assert same.all(), x[~same][:5]
        assert (E._f16(x) == x.astype(np.float16).astype(np.float32)).all()
