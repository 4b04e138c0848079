"""The OpenGL backend's benchmark, one command for a short window on a machine with a GPU
(not collected by pytest: the name does not start with test_).

    PYTHONPATH=. python tests/bench_gl.py [--models smollm2,gemma3-270m] [-p 64] [-n 16] [-r 3]

Prints the devices (llama.cpp's --list-devices), then `ggstation bench -ngl 0,99` rows (the
CPU and the GPU) for each starter model, and the GPU logits' distance from the CPU's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import numpy as np


def max_rel_diff(path: str) -> float:
    """max |GPU - CPU| / max |CPU| over the logits of an 8-token prefill and 4 decode steps."""
    from engine.batch import Batch
    from engine.context import Context, ContextParams
    from engine.model import load_model

    tokens = np.arange(1, 13, dtype=np.int32) * 37
    out = []
    for ngl in (0, 99):
        ctx = Context(load_model(path, n_gpu_layers=ngl), ContextParams(n_ctx=64))
        rows = [ctx.decode(Batch.for_sequence(tokens[:8], 0, 0, logits_all=True))]
        rows += [ctx.decode(Batch.for_sequence(tokens[i : i + 1], i, 0)) for i in range(8, 12)]
        out.append(np.concatenate(rows))
    return float(np.abs(out[1] - out[0]).max() / np.abs(out[0]).max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma3-270m")
    ap.add_argument("-p", default="64")
    ap.add_argument("-n", default="16")
    ap.add_argument("-r", default="3")
    args = ap.parse_args()
    from engine.hub import store as model_store

    subprocess.run([sys.executable, "-m", "engine", "bench", "--list-devices"], check=False)
    for name in args.models.split(","):
        path = str(model_store.ensure(name))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "engine",
                "bench",
                "-m",
                path,
                "-ngl",
                "0,99",
                "-p",
                args.p,
                "-n",
                args.n,
                "-r",
                args.r,
            ],
            check=False,
        )
        print(f"{name}: max |GPU - CPU| / max |CPU| logits = {max_rel_diff(path):.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
