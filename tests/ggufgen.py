"""Tiny random GGUF models for fast tests: every supported architecture, a real tokenizer.

`write_tiny_model(path, arch=...)` writes a 2-layer model (4 for smollm3 and olmo2; dim 64,
vocab ~300) with a gpt2 byte-level BPE vocabulary (llama, qwen2, qwen3, smollm3, olmo2,
granite) or a SentencePiece-style one (gemma2, gemma3, phi3), and a chat template, with the
metadata keys and tensors llama.cpp's converter writes for that architecture
(gguf.GGUFWriter), so llama.cpp loads these files too.
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from quantize_iq4 import quantize_iq4_nl, quantize_iq4_xs

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def _bpe_vocab():
    b2u = _bytes_to_unicode()
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [3, 3, 3]  # control
    tokens += [b2u[b] for b in range(256)]
    types += [1] * 256
    merges = []
    for a, b in [
        ("Ġ", "t"),
        ("h", "e"),
        ("Ġt", "he"),
        ("i", "n"),
        ("Ġ", "a"),
        ("e", "r"),
        ("o", "n"),
        ("Ġ", "s"),
        ("e", "n"),
        ("l", "l"),
        ("Ġ", "w"),
        ("o", "r"),
    ]:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        types.append(1)
    return tokens, types, merges


def _spm_vocab():
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [3, 3, 3, 2, 3, 3]
    scores = [0.0] * len(tokens)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    scores += [0.0] * 256
    pieces = [
        "▁",
        "▁t",
        "▁the",
        "he",
        "in",
        "▁a",
        "er",
        "on",
        "▁s",
        "en",
        "ll",
        "▁w",
        "or",
        "e",
        "t",
        "a",
        "o",
        "n",
        "s",
        "h",
        "l",
        "r",
        "w",
        "i",
    ]
    for i, p in enumerate(pieces):
        tokens.append(p)
        types.append(1)
        scores.append(-float(i) - (0 if len(p) > 1 else 100))
    return tokens, types, scores


SPM_ARCHS = ("gemma2", "gemma3", "phi3")  # SentencePiece vocabulary; the others gpt2 BPE

# tokenizer.ggml.pre of each gpt2-vocabulary architecture, as its real models have it
BPE_PRE = {"llama": "smollm", "smollm3": "llama-bpe", "olmo2": "dbrx", "granite": "refact"}

# Default layer counts: smollm3's 4th layer is its first without RoPE; olmo2's 4th its first
# global one when sliding.
N_LAYER = {"smollm3": 4, "olmo2": 4}

# granite's multipliers, far from 1 so that each one moves this tiny model's logits by over
# 25 % (Granite 3.x: embedding 12, residual 0.22, attention 1/128 with head size 128, logits
# 8 or 16; with those a 0.5 attention scale here would move them by 0.1 % only).
GRANITE_SCALES = dict(embedding_scale=4.0, residual_scale=2.5, attention_scale=4.0, logit_scale=8.0)

# olmo2 as OLMo 3's converter writes it: layers 0-2 slide over 6 positions, layer 3 is global
# with YaRN (factor 4 over an original context of 64: pairs 1 and 2 of 8 are part-interpolated),
# which the sliding layers must not take; the yarn_* keys llama.cpp ignores for olmo2 are
# written too (OLMo 3: factor 8 over 8192, attention factor 1.2079), no rope.freq_base_swa.
OLMO3_WINDOW, OLMO3_PATTERN, OLMO3_YARN, OLMO3_ORIG_CTX = 6, [True, True, True, False], 4.0, 64

# phi3: LongRoPE as Phi-3.5/Phi-4-mini: 3/4 of each head rotated, an original context of 32
# (tests use contexts on both sides of it) and the attention factor the converter writes.
PHI3_ORIG_CTX, PHI3_ROTARY = 32, 0.75


def write_tiny_model(
    path,
    arch: str = "llama",
    n_layer: int | None = None,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    head_dim: int | None = None,
    qtype: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
    seed: int = 0,
    n_ctx_train: int = 256,
    chat_template: str | None = CHATML,
    rope_freqs: bool = False,
    split_max_tensors: int = 0,
    sliding: bool = False,
    granite_scales: dict[str, float] | None = None,
) -> Path:
    """Write a random tiny model of `arch` to `path`; returns the path. rope_freqs (llama): a
    Llama 3.1-style `rope_freqs.weight` of per-pair frequency divisors. split_max_tensors: write a
    split set (llama.cpp's gguf-split naming, `<stem>-00001-of-0000N.gguf` beside `path`) with at
    most that many tensors per file; the first file's path is returned. sliding (olmo2): OLMo 3's
    sliding-window keys (OLMO3_*). granite_scales: granite's multipliers (default GRANITE_SCALES;
    a key left out is not written, logit_scale then 1)."""
    path = Path(path)
    n_layer = n_layer or N_LAYER.get(arch, 2)
    rng = np.random.default_rng(seed)
    head_dim = head_dim or n_embd // n_head
    spm = arch in SPM_ARCHS
    w = GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-6 if spm else 1e-5)
    w.add_rope_freq_base(10000.0)
    if head_dim != n_embd // n_head or arch.startswith("gemma"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    n_vocab = _add_vocab(w, spm, arch)
    w.add_vocab_size(n_vocab)
    if chat_template:
        w.add_chat_template(chat_template)

    def mat(name, rows, cols, scale=0.08):
        data = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if qtype == GGMLQuantizationType.F32:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, quantize_weights(data, qtype), raw_dtype=qtype)

    def vec(name, n, base=1.0, spread=0.05):
        w.add_tensor(name, (base + spread * rng.standard_normal(n)).astype(np.float32))

    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    mat("token_embd.weight", n_vocab, n_embd, 0.5)
    vec("output_norm.weight", n_embd)
    if arch == "olmo2":  # llama.cpp requires it for olmo2 (no tied embeddings)
        mat("output.weight", n_vocab, n_embd, 0.5)
        if sliding:
            w.add_sliding_window(OLMO3_WINDOW)
            w.add_sliding_window_pattern(OLMO3_PATTERN)
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(OLMO3_YARN)
            w.add_rope_scaling_orig_ctx_len(OLMO3_ORIG_CTX)
            w.add_rope_scaling_yarn_attn_factor(1 + 0.1 * math.log(OLMO3_YARN))
            w.add_rope_scaling_yarn_beta_fast(32.0)
            w.add_rope_scaling_yarn_beta_slow(1.0)
    if arch == "granite":
        scales = GRANITE_SCALES if granite_scales is None else granite_scales
        adders = {
            "embedding_scale": w.add_embedding_scale,
            "residual_scale": w.add_residual_scale,
            "attention_scale": w.add_attention_scale,
        }
        for key, add in adders.items():
            if key in scales:
                add(scales[key])
        w.add_logit_scale(scales.get("logit_scale", 1.0))
    if arch == "gemma2":
        w.add_sliding_window(8)  # pattern: llama.cpp's default 2 (layer 0 slides)
        # caps low enough to bend this tiny model's scores (|s| < 1) and logits (|l| ~ 30);
        # Gemma 2 uses 50 and 30
        w.add_attn_logit_softcapping(0.5)
        w.add_final_logit_softcapping(20.0)
    if arch == "gemma3":
        w.add_sliding_window(8)
    if arch == "phi3":
        n_rot = int(PHI3_ROTARY * n_embd) // n_head
        w.add_rope_dimension_count(n_rot)
        w.add_rope_scaling_orig_ctx_len(PHI3_ORIG_CTX)
        w.add_sliding_window(0)  # as Phi-4-mini's converter writes it
        scale = n_ctx_train / PHI3_ORIG_CTX
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(PHI3_ORIG_CTX)))
        # per-pair frequency divisors: long ones stretch the slow pairs most, short ones ~1
        ramp = np.linspace(0.0, 1.0, n_rot // 2)
        w.add_tensor("rope_factors_long.weight", (1.0 + 20.0 * ramp**2).astype(np.float32))
        w.add_tensor("rope_factors_short.weight", (1.0 + 0.5 * ramp).astype(np.float32))
    if (
        rope_freqs
    ):  # divisors 1 (fastest pair) .. 8, steeper than Llama 3.1's so 22 positions show it
        w.add_tensor("rope_freqs.weight", np.linspace(1.0, 8.0, head_dim // 2).astype(np.float32))
    for il in range(n_layer):
        p = f"blk.{il}."
        if arch != "olmo2":  # olmo2 normalises after its sublayers only
            vec(p + "attn_norm.weight", n_embd)
        if arch == "phi3":
            mat(p + "attn_qkv.weight", q_dim + 2 * kv_dim, n_embd)
        else:
            mat(p + "attn_q.weight", q_dim, n_embd)
            mat(p + "attn_k.weight", kv_dim, n_embd)
            mat(p + "attn_v.weight", kv_dim, n_embd)
        mat(p + "attn_output.weight", n_embd, q_dim)
        if arch != "olmo2":
            vec(p + "ffn_norm.weight", n_embd)
        if arch == "phi3":
            mat(p + "ffn_up.weight", 2 * n_ff, n_embd)  # gate | up
        else:
            mat(p + "ffn_gate.weight", n_ff, n_embd)
            mat(p + "ffn_up.weight", n_ff, n_embd)
        mat(p + "ffn_down.weight", n_embd, n_ff)
        if arch == "qwen2":
            for t, n in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
                vec(p + t + ".bias", n, 0.0)
        if arch in ("qwen3", "gemma3"):
            vec(p + "attn_q_norm.weight", head_dim)
            vec(p + "attn_k_norm.weight", head_dim)
        if arch == "olmo2":  # over the whole projection, not per head
            vec(p + "attn_q_norm.weight", q_dim)
            vec(p + "attn_k_norm.weight", kv_dim)
        if arch in ("gemma2", "gemma3", "olmo2"):
            vec(p + "post_attention_norm.weight", n_embd)
            vec(p + "post_ffw_norm.weight", n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split_max_tensors:
        return sorted(path.parent.glob(f"{path.stem}-00001-of-*.gguf"))[0]
    return path


def quantize_weights(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """(rows, cols) f32 -> packed qtype rows: gguf-py's quantiser, or ours where it has none."""
    if qtype == GGMLQuantizationType.IQ4_NL:
        return quantize_iq4_nl(data)
    if qtype == GGMLQuantizationType.IQ4_XS:
        return quantize_iq4_xs(data)
    return quantize(data, qtype)


def _add_vocab(w: GGUFWriter, spm: bool, arch: str) -> int:
    """The tokenizer keys: a SentencePiece-style or gpt2 BPE vocabulary; returns its size."""
    tokens, types, extra = _spm_vocab() if spm else _bpe_vocab()
    if spm:
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(extra)
        w.add_token_types(types)
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_unk_token_id(3)
        w.add_pad_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_space_prefix(False)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(BPE_PRE.get(arch, "qwen2"))
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(extra)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_pad_token_id(0)
        w.add_add_bos_token(False)
    return len(tokens)


def dequantize_to_f32(src, dst) -> Path:
    """Copy a GGUF with every tensor dequantised to F32 (same metadata): a model on which
    llama.cpp does no activation quantisation, so engines can be compared exactly."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        data = (
            np.asarray(t.data)
            if t.tensor_type == GGMLQuantizationType.F32
            else dequantize(t.data, t.tensor_type)
        )
        w.add_tensor(t.name, np.ascontiguousarray(data, dtype=np.float32).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def vocab_only_copy(src, dst, pre: str) -> Path:
    """Copy a GGUF's metadata only (no tensors, like llama.cpp's models/ggml-vocab-*.gguf) with
    tokenizer.ggml.pre set to `pre` and without the add_bos/add_eos keys, so that the
    pre-tokenizer's own defaults apply. llama-tokenize and our tokenizer both load it."""
    from gguf import GGUFReader

    drop = {
        "general.architecture",
        gguf.Keys.Tokenizer.PRE,
        gguf.Keys.Tokenizer.ADD_BOS,
        gguf.Keys.Tokenizer.ADD_EOS,
    }
    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key in drop:
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), vtype, sub_type=sub)
    w.add_tokenizer_pre(pre)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)
