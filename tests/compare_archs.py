"""Every architecture's forward pass, ours vs llama.cpp's, on the tiny models of tests/ggufgen.py.

Builds a small C++ harness against a llama.cpp build (libllama and its headers) that loads a
GGUF, decodes one prompt with logits for every position (F32 KV cache, no flash attention,
one thread) and writes them out; the same prompt goes through the engine. The tiny models are
written with F32 weights, so that llama.cpp quantises no activations and both sides compute in
plain float: the logits must agree to ~1e-6 of their range. It also shows that llama.cpp loads
each tiny file (every key and tensor it requires is there). Not a pytest test: it needs a
llama.cpp build and g++.

    python tests/compare_archs.py /path/to/llama.cpp [/path/to/llama.cpp/build/bin]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from engine.batch import Batch
from engine.context import Context, ContextParams
from engine.model import load_model
from ggufgen import write_tiny_model

HARNESS = r"""
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <vector>
// args: model.gguf out.bin token...; writes n_tokens x n_vocab float32 logits
int main(int argc, char ** argv) {
    if (argc < 4) return 1;
    llama_backend_init();
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) return 2;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 64; cp.n_batch = 64; cp.n_ubatch = 64; cp.n_threads = 1; cp.n_threads_batch = 1;
    cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) return 3;
    int n = argc - 3;
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        batch.token[i] = atoi(argv[3 + i]); batch.pos[i] = i; batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0; batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch)) return 4;
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * f = fopen(argv[2], "wb");
    for (int i = 0; i < n; ++i) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, f);
    fclose(f);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
"""
TOKENS = [5, 17, 42, 9, 100, 3, 77, 250, 31, 8, 64, 200, 12, 7, 150, 99, 23, 45, 61, 2, 11, 19]
VARIANTS = {  # name -> (architecture, write_tiny_model keywords)
    "llama": ("llama", {}), "llama-rope-freqs": ("llama", {"rope_freqs": True}), "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}), "gemma2": ("gemma2", {}), "gemma3": ("gemma3", {}), "phi3": ("phi3", {}),
    "smollm3": ("smollm3", {}), "olmo2": ("olmo2", {}), "olmo3": ("olmo2", {"sliding": True}),
    "granite": ("granite", {}), "granite-rope-freqs": ("granite", {"rope_freqs": True}),
}
TOLERANCE = 1e-5  # of the logits' range; float32 on both sides
# ggml's CPU GELU reads a float16 table (GGML_GELU_FP16 in ggml-cpu/vec.h), which moves gemma's
# logits by ~1e-4 of their range from exact tanh GELU
TOLERANCE_GELU = 3e-4
GELU_ARCHS = ("gemma2", "gemma3")


def build(llama_cpp: Path, lib_dir: Path, out: Path) -> Path:
    src = out / "harness.cpp"
    src.write_text(HARNESS)
    exe = out / "harness"
    subprocess.run(["g++", "-O2", "-o", str(exe), str(src), f"-I{llama_cpp / 'include'}",
                    f"-I{llama_cpp / 'ggml' / 'include'}", f"-L{lib_dir}", "-lllama",
                    f"-Wl,-rpath,{lib_dir}"], check=True)
    return exe


def compare(exe: Path, work: Path, name: str, arch: str, kw: dict) -> float:
    """Max |ours - llama.cpp| over the range of llama.cpp's logits."""
    path = write_tiny_model(work / f"{name}.gguf", arch=arch, qtype=GGMLQuantizationType.F32, **kw)
    out = work / f"{name}.bin"
    run = subprocess.run([str(exe), str(path), str(out), *map(str, TOKENS)], capture_output=True, text=True)
    if run.returncode:
        why = [line for line in run.stderr.splitlines() if "error" in line.lower()] or [f"exit {run.returncode}"]
        raise RuntimeError(f"llama.cpp cannot run it: {why[-1].strip()}")
    model = load_model(path)
    try:
        ctx = Context(model, ContextParams(n_ctx=64, type_k="f32", type_v="f32"))
        ours = ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True)).astype(np.float64)
    finally:
        model.close()
    theirs = np.fromfile(out, np.float32).reshape(len(TOKENS), -1).astype(np.float64)
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def main() -> int:
    llama_cpp = Path(sys.argv[1])
    lib_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else llama_cpp / "build" / "bin"
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exe = build(llama_cpp, lib_dir, work)
        for name, (arch, kw) in VARIANTS.items():
            try:
                err = compare(exe, work, name, arch, kw)
            except RuntimeError as e:
                bad += 1
                print(f"{name:20s} {e}", flush=True)
                continue
            differs = err > (TOLERANCE_GELU if arch in GELU_ARCHS else TOLERANCE)
            bad += differs
            print(f"{name:20s} max relative difference {err:.1e}{'  DIFFERS' if differs else ''}", flush=True)
    print(f"{len(VARIANTS) - bad}/{len(VARIANTS)} tiny models give llama.cpp's logits")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
