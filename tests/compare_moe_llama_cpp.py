"""Tiny MoE models, ours vs llama.cpp's own forward pass, through llama-perplexity.

Writes a tiny model of each MoE architecture (tests/ggufgen_moe.py), dequantised to F32 so
that llama.cpp rounds no activations, and runs `llama-perplexity --kl-divergence-base` on it
(F32 KV cache, no flash attention): the file it writes holds llama.cpp's log-probabilities
of the second half of every chunk, as 16-bit steps of (max - min) / 65535. The engine then
decodes the same chunks, as a prompt and token by token, and the largest difference in
log-probability is printed (expected: about one storage step, ~1e-4). Not a pytest test: it
needs a llama.cpp build.

    python tests/compare_moe_llama_cpp.py /path/to/llama.cpp/build/bin [--quantised]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from engine.batch import Batch
from engine.context import Context, ContextParams
from engine.model import load_model
from ggufgen import dequantize_to_f32
from ggufgen_moe import MOE_ARCHS, write_tiny_moe

N_CTX = 64
WORDS = ["the", "in", "a", "on", "sword", "hello", "world", "er", "all", "or", "when", "tiny", "moe"]


def llama_cpp_logprobs(bin_dir: Path, model: Path, text: Path, out: Path):
    """(tokens (n_chunk, n_ctx), log-probs (n_chunk, n_ctx//2 - 1, n_vocab), valid mask)."""
    cmd = [str(bin_dir / "llama-perplexity"), "-m", str(model), "-f", str(text), "-c", str(N_CTX),
           "-b", str(N_CTX), "-t", "2", "--chunks", "4", "-ctk", "f32", "-ctv", "f32", "-fa", "off",
           "--kl-divergence-base", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"llama-perplexity failed:\n{r.stderr[-3000:]}")
    raw = out.read_bytes()
    assert raw[:8] == b"_logits_"
    n_ctx, n_vocab, n_chunk = (int(v) for v in np.frombuffer(raw[8:20], np.int32))
    off = 20 + 4 * n_chunk * n_ctx
    tokens = np.frombuffer(raw[20:off], np.int32).reshape(n_chunk, n_ctx)
    nv, n_tok = 2 * ((n_vocab + 1) // 2) + 4, n_ctx - 1 - n_ctx // 2
    blk = np.frombuffer(raw[off : off + 2 * n_chunk * n_tok * nv], np.uint16).reshape(n_chunk, n_tok, nv)
    head = blk[:, :, :4].copy().view(np.float32)  # scale, min_log_prob
    q = blk[:, :, 4 : 4 + n_vocab]
    return tokens, head[:, :, 1:2] + head[:, :, 0:1] * q.astype(np.float64), q > 0


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(bin_dir: Path, arch: str, quantised: bool, tmp: Path) -> None:
    src = write_tiny_moe(tmp / f"{arch}.gguf", arch=arch, n_expert=8, n_expert_used=3, seed=11)
    path = src if quantised else dequantize_to_f32(src, tmp / f"{arch}-f32.gguf")
    text = tmp / "text.txt"
    text.write_text(" ".join(np.random.default_rng(0).choice(WORDS, 600)))
    tokens, ref, valid = llama_cpp_logprobs(bin_dir, path, text, tmp / "base.bin")
    model, first = load_model(path), N_CTX // 2
    worst_prompt = worst_decode = 0.0
    for c, toks in enumerate(tokens.tolist()):
        ctx = Context(model, ContextParams(n_ctx=N_CTX, type_k="f32", type_v="f32"))
        lp = log_softmax(ctx.decode(Batch.for_sequence(toks, 0, logits_all=True)))[first : N_CTX - 1]
        worst_prompt = max(worst_prompt, float(np.abs(lp - ref[c])[valid[c]].max()))
        ctx = Context(model, ContextParams(n_ctx=N_CTX, type_k="f32", type_v="f32"))
        steps = np.stack([ctx.decode(Batch.for_sequence([t], i))[0] for i, t in enumerate(toks)])
        lp = log_softmax(steps)[first : N_CTX - 1]
        worst_decode = max(worst_decode, float(np.abs(lp - ref[c])[valid[c]].max()))
    kind = "Q8_0" if quantised else "F32"
    print(f"{arch} ({kind}): {len(tokens)} chunks, max |log-prob difference| prompt {worst_prompt:.2e}, "
          f"decode {worst_decode:.2e}")


def main() -> None:
    bin_dir = Path(sys.argv[1])
    quantised = "--quantised" in sys.argv
    with tempfile.TemporaryDirectory() as d:
        for arch in MOE_ARCHS:
            compare(bin_dir, arch, quantised, Path(d))


if __name__ == "__main__":
    main()
