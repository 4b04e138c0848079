"""Benchmark the quant kernels (not collected by pytest):

    python tests/bench_quants.py [threads] [--types Q4_0,IQ4_NL] [--no-models] [--int8-vs-float]

Prints per type: mat-vec GMAC/s (1 token), mat-vec-multi GMAC/s (4 tokens), dequant G weights/s;
then, for each starter model present, the weight time of one decode step (every 2-D weight
mat-vec'd once, output head included). Timings are the best of several runs.
GGSTATION_PORTABLE_LUT=1 times the table types (IQ4_NL, IQ4_XS, MXFP4) without pshufb.
Decode runs the int8 path unless GGSTATION_NO_INT8=1; --int8-vs-float times the mat-vecs on
both paths, alternating runs (on a shared machine the best of many runs is the figure to read).
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import jit, quants  # noqa: E402
from engine.hub import store as model_store
from tests.test_quants import ALL, make_tensor  # noqa: E402


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


def bench_int8_vs_float(w, rounds=5):
    """(int8 1-token, float 1-token, int8 4-token, float 4-token) GMAC/s, best over rounds of
    alternating runs."""
    x = np.random.default_rng(0).standard_normal((4, w.n_cols)).astype(np.float32)
    out = np.empty(w.n_rows, np.float32)
    out4 = np.empty((4, w.n_rows), np.float32)
    macs = w.n_rows * w.n_cols
    best_t = [np.inf] * 4
    for _ in range(rounds):
        for k, path in enumerate(("int8", "float")):
            best_t[k] = min(
                best_t[k],
                best(lambda p=path: quants.matvec(w, x[0], out, p), reps=20, min_time=0.05),
            )
            best_t[2 + k] = min(
                best_t[2 + k],
                best(lambda p=path: quants.matvec_multi(w, x, out4, p), reps=10, min_time=0.05),
            )
    return (
        macs / best_t[0] / 1e9,
        macs / best_t[1] / 1e9,
        4 * macs / best_t[2] / 1e9,
        4 * macs / best_t[3] / 1e9,
    )


def decode_step(calls, ws, xs, outs, head):
    """One decode step's weight mat-vecs in the model's order: calls holds ("many", names) or ("one", name)."""
    for kind, arg in calls:
        if kind == "many":
            w0 = ws[arg[0]]
            quants.matvec_many([ws[a] for a in arg], xs[w0.n_cols], [outs[a] for a in arg])
        else:
            quants.matvec(ws[arg], xs[ws[arg].n_cols], outs[arg])
    head_out = (
        outs["token_embd.weight"] if head is ws["token_embd.weight"] else outs["output.weight"]
    )
    quants.matvec(head, xs[head.n_cols], head_out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("threads", nargs="?", type=int, default=2)
    ap.add_argument("--types", default="", help="comma-separated GGML type names (default: all)")
    ap.add_argument("--no-models", action="store_true", help="skip the starter-model decode steps")
    ap.add_argument(
        "--int8-vs-float",
        action="store_true",
        help="mat-vec GMAC/s of the int8 and the float path per type, nothing else",
    )
    args = ap.parse_args()
    n = jit.set_num_threads(args.threads)
    wanted = {t.strip().upper() for t in args.types.split(",") if t.strip()}
    print(
        f"threads: {n}, portable table lookup: {jit.PORTABLE_LUT}, decode path: {quants.default_decode_path()}"
    )
    if args.int8_vs_float:
        print(
            f"{'type':6} {'shape':>12} {'1 tok int8':>11} {'float':>6} {'4 tok int8':>11} {'float':>6}  GMAC/s"
        )
        for qt in ALL:
            if quants.QUANT_TYPES[qt].matvec_i8 is None or wanted and qt.name not in wanted:
                continue
            r = bench_int8_vs_float(make_tensor(qt, 2048, 2048))
            print(
                f"{qt.name:6} {'2048x2048':>12} {r[0]:11.1f} {r[1]:6.1f} {r[2]:11.1f} {r[3]:6.1f}",
                flush=True,
            )
        return
    print(f"{'type':6} {'shape':>12} {'matvec GMAC/s':>14} {'x4 GMAC/s':>10} {'dequant Gw/s':>13}")
    for qt in ALL:
        if wanted and qt.name not in wanted:
            continue
        w = make_tensor(qt, 2048, 2048)
        a, b, c = bench_type(w)
        print(f"{qt.name:6} {'2048x2048':>12} {a:14.1f} {b:10.1f} {c:13.2f}")
    if args.no_models:
        return
    from engine.gguf_file import GGUFFile

    for model in model_store.STARTER_MODELS:
        path = model_store.cached_path(model)  # in the model cache ($GGSTATION_MODELS_DIR)
        if path is None:
            continue
        name = path.name
        f = GGUFFile(path)
        total_t, total_macs, per_type = 0.0, 0, {}
        names = [n for n, ti in f.tensors.items() if len(ti.shape) == 2]
        ws = {tn: f.qtensor(tn) for tn in names}
        xs = {
            w.n_cols: np.random.default_rng(0).standard_normal(w.n_cols).astype(np.float32)
            for w in ws.values()
        }
        outs = {tn: np.empty(w.n_rows, np.float32) for tn, w in ws.items()}
        for tn, w in ws.items():
            x, out = xs[w.n_cols], outs[tn]
            t = best(partial(quants.matvec, w, x, out), reps=5, min_time=0.02)
            total_t += t
            total_macs += w.n_rows * w.n_cols
            a = per_type.setdefault(w.qtype.name, [0.0, 0])
            a[0] += t
            a[1] += w.n_rows * w.n_cols
        print(
            f"\n{name}: decode-step weight time {total_t * 1e3:.2f} ms for {total_macs / 1e6:.0f} M MACs "
            f"({total_macs / total_t / 1e9:.1f} GMAC/s, {len(names)} separate mat-vecs, best of each)"
        )
        for k, (t, m) in sorted(per_type.items()):
            print(f"   {k:6} {t * 1e3:7.2f} ms  {m / 1e6:7.1f} M MACs  {m / t / 1e9:6.1f} GMAC/s")

        # The whole step back to back, as the model runs it: Q/K/V and gate/up fused per layer.
        layers = sorted({int(tn.split(".")[1]) for tn in names if tn.startswith("blk.")})
        head = ws.get("output.weight", ws["token_embd.weight"])
        calls = []
        for i in layers:
            p = f"blk.{i}."
            qkv = [p + s for s in ("attn_q.weight", "attn_k.weight", "attn_v.weight")]
            gu = [p + s for s in ("ffn_gate.weight", "ffn_up.weight")]
            calls.append(("many", qkv))
            calls.append(("one", p + "attn_output.weight"))
            calls.append(("many", gu))
            calls.append(("one", p + "ffn_down.weight"))
        step = partial(decode_step, calls, ws, xs, outs, head)
        ts = [best(step, reps=3, min_time=0.05) for _ in range(3)]
        print(
            f"   whole step back to back (fused QKV, gate/up; {len(calls) + 1} calls): "
            f"{min(ts) * 1e3:.2f} ms"
        )


if __name__ == "__main__":
    main()
