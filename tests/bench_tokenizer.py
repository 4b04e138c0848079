"""Tokenizer speed on ~1 MB of English (not collected by pytest: the name does not start with test_).

    python tests/bench_tokenizer.py [MODEL.gguf ...] [--text FILE]

Wall and CPU time are printed for the cold encode: on a shared machine the CPU time is the
steadier figure. The text is the GPL-3 reference text plus docstrings of the Python standard library (varied
English prose, so the per-word cache does not make it trivial), cut to 1 MiB.
"""

from __future__ import annotations

import argparse
import ast
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.gguf_file import GGUFFile  # noqa: E402
from engine.hub import store as model_store  # noqa: E402
from engine.tokenizer import load_tokenizer  # noqa: E402
from tests.conftest import REFERENCE_DIR  # noqa: E402

SIZE = 1 << 20


def english_text(size: int = SIZE) -> str:
    parts = [(REFERENCE_DIR / "gpl-3.txt").read_text(encoding="utf-8")]
    total = sum(map(len, parts))
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if total >= size:
            break
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    parts.append(doc)
                    total += len(doc) + 2
    return "\n\n".join(parts)[:size]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", help="GGUF paths (default: the two starter models)")
    ap.add_argument("--text", help="a text file to tokenize instead")
    args = ap.parse_args()
    text = Path(args.text).read_text(encoding="utf-8") if args.text else english_text()
    models = args.models or [model_store.ensure("smollm2"), model_store.ensure("gemma3-270m")]
    print(f"text: {len(text.encode()) / 2**20:.2f} MiB, {len(text.split())} words")
    for path in models:
        t0 = time.perf_counter()
        gguf = GGUFFile(path)
        t1 = time.perf_counter()
        tok = load_tokenizer(gguf)
        t2 = time.perf_counter()
        c2 = time.process_time()
        ids = tok.encode(text, add_special=True, parse_special=False)
        t3 = time.perf_counter()
        c3 = time.process_time()
        ids2 = tok.encode(text, add_special=True, parse_special=False)
        t4 = time.perf_counter()
        out = tok.decode(ids, skip_special=True)
        t5 = time.perf_counter()
        assert ids == ids2
        print(
            f"{Path(path).name}: GGUFFile {t1 - t0:.2f} s, load_tokenizer {t2 - t1:.2f} s, "
            f"encode {t3 - t2:.2f} s (CPU {c3 - c2:.2f} s; {len(ids)} tokens), again (warm cache) {t4 - t3:.2f} s, "
            f"decode {t5 - t4:.2f} s, round trip {'ok' if out == text else 'DIFFERS'}"
        )


if __name__ == "__main__":
    main()
