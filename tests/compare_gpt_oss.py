"""Compare the engine's gpt-oss logits with llama.cpp's on tiny F32 models (not a test: it needs
a local llama.cpp build and llama-cpp-python's sources, and no network).

    python tests/compare_gpt_oss.py [LLAMA_CPP_PYTHON_SRC]

LLAMA_CPP_PYTHON_SRC (default /tmp/lcp/llama_cpp_python-0.3.36) holds llama_cpp/ and
vendor/llama.cpp/build/bin/libllama.so. For the full model and for variants without sinks,
YaRN or the sliding window it prints the largest logit difference, relative to the largest
logit, between llama.cpp, the engine and the
float64 oracle, with f16 and f32 KV caches. llama.cpp runs in a child process.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from engine.batch import Batch  # noqa: E402
from engine.context import Context, ContextParams  # noqa: E402
from engine.model import load_model  # noqa: E402
from ggufgen_gptoss import write_tiny_gptoss  # noqa: E402
from oracles import oracle_logits  # noqa: E402

TOKENS = [5, 17, 42, 9, 100, 3, 77, 250, 31, 8, 64, 200, 12, 7, 150, 99, 23, 45, 61, 2, 11, 19]

CHILD = """
import sys, types, os, numpy as np
sys.modules["diskcache"] = types.SimpleNamespace(Cache=object)  # llama_cache imports it
sys.path.insert(0, sys.argv[1])
os.environ["LLAMA_CPP_LIB_PATH"] = sys.argv[1] + "/vendor/llama.cpp/build/bin"
from llama_cpp import Llama
tokens = [int(t) for t in sys.argv[4].split(",")]
kv = dict(type_k=0, type_v=0) if sys.argv[5] == "f32" else {}  # GGML_TYPE_F32
llm = Llama(model_path=sys.argv[2], n_ctx=64, logits_all=True, verbose=False, n_threads=1, **kv)
llm.eval(tokens)
np.save(sys.argv[3], np.array(llm.scores[: len(tokens)], dtype=np.float64))
"""


def llama_cpp_logits(src: str, model: Path, out: Path, cache: str = "f16") -> np.ndarray:
    subprocess.run([sys.executable, "-c", CHILD, src, str(model), str(out), ",".join(map(str, TOKENS)), cache],
                   check=True)
    return np.load(out)


def engine_logits(path: Path, **kv) -> np.ndarray:
    ctx = Context(load_model(path), ContextParams(n_ctx=64, **kv))
    return ctx.decode(Batch.for_sequence(TOKENS, 0, logits_all=True)).astype(np.float64)


def main() -> None:
    src = sys.argv[1] if len(sys.argv) > 1 else "/tmp/lcp/llama_cpp_python-0.3.36"
    err = lambda a, b: np.abs(a - b).max() / np.abs(b).max()
    with tempfile.TemporaryDirectory() as tmp:
        for name, kw in (("full", {}), ("no sinks", dict(sinks=False)), ("no YaRN", dict(yarn=False)),
                         ("no SWA", dict(sliding_window=1024))):
            path = write_tiny_gptoss(Path(tmp) / "m.gguf", qtype=GGMLQuantizationType.F32, **kw)
            lcp = llama_cpp_logits(src, path, Path(tmp) / "lcp.npy")
            lcp32 = llama_cpp_logits(src, path, Path(tmp) / "lcp32.npy", "f32")
            f16, f32 = engine_logits(path), engine_logits(path, type_k="f32", type_v="f32")
            ref = oracle_logits(path, TOKENS, 64)
            print(f"{name:9s} f16 cache: engine-llama.cpp {err(f16, lcp):.1e}  f32 cache: engine-llama.cpp "
                  f"{err(f32, lcp32):.1e}, engine-oracle {err(f32, ref):.1e}, llama.cpp-oracle {err(lcp32, ref):.1e}")


if __name__ == "__main__":
    main()
