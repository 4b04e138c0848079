"""Seeded sampling, ours vs llama.cpp's own sampler chain, on the same logits.

Builds a small C++ harness against a llama.cpp build (libllama and its headers), runs the
chain (penalties, top-n-sigma, top-k, typical, top-p, min-p, XTC, temp_ext, dist, in any
order) on random logits, accepting each pick, and checks that engine.sampling picks the same
token ids. Logits come plain, or rounded to a coarse grid so that many tie (ties are where
sort orders matter). Not a pytest test: it needs a llama.cpp build and g++.

    python tests/compare_sampling.py /path/to/llama.cpp [/path/to/llama.cpp/build/bin]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from engine.sampling import SamplingParams, make_sampler

HARNESS = r"""
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <vector>
// args: seed order top_k typ top_p min_p temp min_keep last_n rep freq pres nsigma xtc_p xtc_t
//       dyn_range dyn_exp n_vocab n_steps logits.bin; prints the selected ids
int main(int argc, char ** argv) {
    if (argc != 21) return 1;
    int a = 1;
    unsigned seed = strtoul(argv[a++], 0, 10); const char * order = argv[a++];
    int top_k = atoi(argv[a++]); float typ = atof(argv[a++]), top_p = atof(argv[a++]);
    float min_p = atof(argv[a++]), temp = atof(argv[a++]); int min_keep = atoi(argv[a++]);
    int last_n = atoi(argv[a++]); float rep = atof(argv[a++]), freq = atof(argv[a++]);
    float pres = atof(argv[a++]), nsigma = atof(argv[a++]), xp = atof(argv[a++]);
    float xt = atof(argv[a++]), dr = atof(argv[a++]), de = atof(argv[a++]);
    int n_vocab = atoi(argv[a++]), n_steps = atoi(argv[a++]); FILE * f = fopen(argv[a++], "rb");
    llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    for (const char * o = order; *o; ++o) {
        llama_sampler * s = nullptr;
        switch (*o) {
            case 'e': s = llama_sampler_init_penalties(n_vocab, last_n, rep, freq, pres); break;
            case 's': s = llama_sampler_init_top_n_sigma(nsigma); break;
            case 'k': s = llama_sampler_init_top_k(top_k); break;
            case 'y': s = llama_sampler_init_typical(typ, min_keep); break;
            case 'p': s = llama_sampler_init_top_p(top_p, min_keep); break;
            case 'm': s = llama_sampler_init_min_p(min_p, min_keep); break;
            case 'x': s = llama_sampler_init_xtc(xp, xt, min_keep, seed); break;
            case 't': s = llama_sampler_init_temp_ext(temp, dr, de); break;
        }
        if (s) llama_sampler_chain_add(chain, s);
    }
    llama_sampler_chain_add(chain, llama_sampler_init_dist(seed));
    std::vector<float> row(n_vocab);
    std::vector<llama_token_data> cur(n_vocab);
    for (int step = 0; step < n_steps; ++step) {
        if (fread(row.data(), 4, n_vocab, f) != (size_t) n_vocab) return 2;
        for (int i = 0; i < n_vocab; ++i) cur[i] = {i, row[i], 0.0f};
        llama_token_data_array arr = {cur.data(), (size_t) n_vocab, -1, false};
        llama_sampler_apply(chain, &arr);
        llama_sampler_accept(chain, arr.data[arr.selected].id);
        printf("%d\n", arr.data[arr.selected].id);
    }
    llama_sampler_free(chain);
    return 0;
}
"""

LETTERS = {
    "e": "penalties",
    "s": "top_n_sigma",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "m": "min_p",
    "x": "xtc",
    "t": "temperature",
}
BASE = dict(
    order="eskypmxt",
    top_k=40,
    typ=1.0,
    top_p=0.95,
    min_p=0.05,
    temp=0.8,
    min_keep=0,
    last_n=64,
    rep=1.0,
    freq=0.0,
    pres=0.0,
    nsigma=-1.0,
    xp=0.0,
    xt=0.1,
    dr=0.0,
    de=1.0,
)
CASES = [
    {},
    dict(temp=1.5),
    dict(top_k=0, top_p=1.0, min_p=0.0, temp=1.0),
    dict(top_k=0, top_p=0.9, min_p=0.0, temp=1.0),
    dict(top_k=0, typ=0.8, top_p=1.0, min_p=0.0),
    dict(typ=0.7, temp=1.2),
    dict(top_k=100, top_p=0.8, min_p=0.02, temp=2.0, min_keep=3),
    dict(top_k=300, top_p=0.99, min_p=0.0, temp=1.0),
    dict(temp=0.0),
    dict(rep=1.3, freq=0.2, pres=0.3, last_n=16, temp=1.0),
    dict(nsigma=1.5, top_k=0, top_p=1.0, min_p=0.0, temp=1.0),
    dict(xp=0.5, xt=0.1, temp=1.0),
    dict(xp=1.0, xt=0.05, temp=1.0, min_keep=2),
    dict(dr=0.5, temp=0.8),
    dict(dr=1.0, de=2.0, temp=0.5, top_k=0, top_p=1.0, min_p=0.0),
    dict(order="kpmte", rep=1.3, freq=0.1, pres=0.2, temp=1.0),
    dict(order="tkpm", temp=1.5),
    dict(order="kxte", temp=0.0, xp=1.0, xt=0.2, rep=1.5),
    dict(top_k=0, top_p=1.0, min_p=0.0, nsigma=1.0, xp=1.0, xt=0.01, temp=1.0),
]


def build(llama_cpp: Path, lib_dir: Path, out: Path) -> Path:
    src = out / "harness.cpp"
    src.write_text(HARNESS)
    exe = out / "harness"
    subprocess.run(
        [
            "g++",
            "-O2",
            "-o",
            str(exe),
            str(src),
            f"-I{llama_cpp / 'include'}",
            f"-I{llama_cpp / 'ggml' / 'include'}",
            f"-L{lib_dir}",
            "-lllama",
            f"-Wl,-rpath,{lib_dir}",
        ],
        check=True,
    )
    return exe


def run_case(
    exe: Path, work: Path, seed: int, n_vocab: int, grid: float | None, kw: dict, n_steps: int = 30
) -> bool:
    p = {**BASE, **kw}
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_steps, n_vocab)) * 3
    x[:, rng.integers(0, n_vocab, 5)] += 9
    x = (np.round(x / grid) * grid if grid else x).astype(np.float32)
    x[:, rng.integers(0, n_vocab, 3)] = -np.inf  # banned tokens stay in llama.cpp's list
    x.tofile(work / "logits.bin")
    keys = (
        "top_k",
        "typ",
        "top_p",
        "min_p",
        "temp",
        "min_keep",
        "last_n",
        "rep",
        "freq",
        "pres",
        "nsigma",
        "xp",
        "xt",
        "dr",
        "de",
    )
    args = [
        str(exe),
        str(seed),
        p["order"],
        *(repr(p[k]) for k in keys),
        str(n_vocab),
        str(n_steps),
        str(work / "logits.bin"),
    ]
    want = [
        int(t)
        for t in subprocess.run(args, capture_output=True, text=True, check=True).stdout.split()
    ]
    s = make_sampler(
        SamplingParams(
            temperature=p["temp"],
            top_k=p["top_k"],
            top_p=p["top_p"],
            min_p=p["min_p"],
            typical_p=p["typ"],
            min_keep=p["min_keep"],
            repeat_last_n=p["last_n"],
            repeat_penalty=p["rep"],
            frequency_penalty=p["freq"],
            presence_penalty=p["pres"],
            top_n_sigma=p["nsigma"],
            xtc_probability=p["xp"],
            xtc_threshold=p["xt"],
            dynatemp_range=p["dr"],
            dynatemp_exponent=p["de"],
            samplers=tuple(LETTERS[c] for c in p["order"]),
            seed=seed,
        )
    )
    history: list[int] = []
    for row in x:
        history.append(s.sample(row, history))
    return history == want


def main() -> int:
    llama_cpp = Path(sys.argv[1])
    lib_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else llama_cpp / "build" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exe = build(llama_cpp, lib_dir, work)
        bad = total = 0
        for n_vocab in (300, 49152):
            for grid in (None, 0.5, 0.01):
                for i, kw in enumerate(CASES):
                    total += 1
                    if not run_case(exe, work, 1000 * i + n_vocab % 7, n_vocab, grid, kw):
                        bad += 1
                        print(f"differs: n_vocab {n_vocab} grid {grid} {kw}", flush=True)
    print(f"{total - bad}/{total} runs pick the same tokens as llama.cpp")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
