"""Benchmark the quant kernels (not collected by pytest): python tests/bench_quants.py [threads]

Prints per type: mat-vec GMAC/s (1 token), mat-vec-multi GMAC/s (4 tokens), dequant G weights/s;
then, for each starter model present, the weight time of one decode step (every 2-D weight
mat-vec'd once, output head included). Timings are the best of several runs.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import jit, quants  # noqa: E402
from tests.test_quants import ALL, make_tensor  # noqa: E402

MODELS = Path(os.environ.get("GGSTATION_MODELS", Path.home() / ".local/share/ggstation/models"))


def best(fn, reps=30, min_time=0.2):
    fn()
    ts = []
    t_end = time.perf_counter() + min_time
    while len(ts) < reps or time.perf_counter() < t_end:
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
        if len(ts) > 2000:
            break
    return min(ts)


def bench_type(w):
    x = np.random.default_rng(0).standard_normal((4, w.n_cols)).astype(np.float32)
    out = np.empty(w.n_rows, np.float32)
    out4 = np.empty((4, w.n_rows), np.float32)
    deq = np.empty((min(w.n_rows, 256), w.n_cols), np.float32)
    macs = w.n_rows * w.n_cols
    t1 = best(lambda: quants.matvec(w, x[0], out))
    t4 = best(lambda: quants.matvec_multi(w, x, out4))
    td = best(lambda: quants.dequant_rows(w, 0, deq.shape[0], deq))
    return macs / t1 / 1e9, 4 * macs / t4 / 1e9, deq.size / td / 1e9


def main():
    n = jit.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    print(f"threads: {n}")
    print(f"{'type':6} {'shape':>12} {'matvec GMAC/s':>14} {'x4 GMAC/s':>10} {'dequant Gw/s':>13}")
    for qt in ALL:
        cols = 2048 if qt.name.endswith("_K") else 2048
        w = make_tensor(qt, 2048, cols)
        a, b, c = bench_type(w)
        print(f"{qt.name:6} {'2048x2048':>12} {a:14.1f} {b:10.1f} {c:13.2f}")
    from engine.gguf_file import GGUFFile

    for name in ("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"):
        path = MODELS / name
        if not path.exists():
            continue
        f = GGUFFile(path)
        total_t, total_macs, per_type = 0.0, 0, {}
        names = [n for n, ti in f.tensors.items() if len(ti.shape) == 2]
        for tn in names:
            w = f.qtensor(tn)
            x = np.random.default_rng(0).standard_normal(w.n_cols).astype(np.float32)
            out = np.empty(w.n_rows, np.float32)
            t = best(lambda: quants.matvec(w, x, out), reps=5, min_time=0.02)
            total_t += t
            total_macs += w.n_rows * w.n_cols
            a = per_type.setdefault(w.qtype.name, [0.0, 0])
            a[0] += t
            a[1] += w.n_rows * w.n_cols
        print(f"\n{name}: decode-step weight time {total_t * 1e3:.2f} ms for {total_macs / 1e6:.0f} M MACs "
              f"({total_macs / total_t / 1e9:.1f} GMAC/s, {len(names)} mat-vecs)")
        for k, (t, m) in sorted(per_type.items()):
            print(f"   {k:6} {t * 1e3:7.2f} ms  {m / 1e6:7.1f} M MACs  {m / t / 1e9:6.1f} GMAC/s")


if __name__ == "__main__":
    main()
