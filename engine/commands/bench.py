"""`ggstation bench`: llama-bench's pp/tg tests, markdown or json output."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

from .. import params
from ..errors import EngineError
from .common import add_int8_arg, add_mem_check_arg, init_threads, mem_check


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None
    if any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError("values must be >= 0")
    return vals


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bench", help="prompt/generation throughput (llama-bench)",
                              description="Measure prompt processing (ppN) and generation (tgN) tokens/s.")
    g = params.group(p, params.COMMON)
    g.add_argument("-m", "--model", metavar="FNAME", default=None, help="model path or starter model name")
    params.add_hf_args(p)
    g.add_argument("-p", "--n-prompt", metavar="N", type=_int_list, default=[512], help="prompt tokens (default: 512)")
    g.add_argument("-n", "--n-gen", metavar="N", type=_int_list, default=[128], help="generated tokens (default: 128)")
    g.add_argument("-d", "--n-depth", metavar="N", type=_int_list, default=[0],
                   help="context depth: positions prefilled, untimed, before each test (default: 0)")
    g.add_argument("-b", "--batch-size", metavar="N", type=int, default=2048, help="batch size (default: 2048)")
    g.add_argument("-ub", "--ubatch-size", metavar="N", type=int, default=512, help="ubatch size (default: 512)")
    g.add_argument("-t", "--threads", metavar="N", type=_int_list, default=[os.cpu_count() or 1],
                   help=f"threads (default: {os.cpu_count()})")
    g.add_argument("-r", "--repetitions", metavar="N", type=int, default=5, help="repetitions (default: 5)")
    g.add_argument("-ctk", "--cache-type-k", default="f16", help="KV cache type for K (default: f16)")
    g.add_argument("-ctv", "--cache-type-v", default="f16", help="KV cache type for V (default: f16)")
    g.add_argument("-o", "--output", choices=["md", "json", "jsonl"], default="md", help="output format (default: md)")
    add_mem_check_arg(p)
    add_int8_arg(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    from ..bench import bench
    from ..context import Context, ContextParams
    from ..model import load_model

    if args.repetitions < 1:
        raise EngineError("-r must be at least 1")
    for n_threads in args.threads:
        init_threads(n_threads)  # each -t value checked before anything runs
    model = load_model(params.resolve_model_path(args))
    tests = [(n, 0) for n in args.n_prompt if n] + [(0, n) for n in args.n_gen if n]
    n_ctx = max([p + g + d for p, g in tests for d in args.n_depth] + [16])
    ctx = Context(model, ContextParams(n_ctx=n_ctx, n_batch=args.batch_size, n_ubatch=args.ubatch_size,
                                       type_k=args.cache_type_k, type_v=args.cache_type_v,
                                       check_memory=mem_check(args)))
    size_mib = model.weights_bytes / 2**20
    desc = f"{model.cfg.arch} {model.gguf.get('general.size_label', '') or ''} {_ftype(model)}".replace("  ", " ")
    results = []
    if args.output == "md":
        print("| model | size | params | backend | threads | test | t/s |")
        print("| --- | ---: | ---: | --- | ---: | ---: | ---: |")
    for n_threads in args.threads:
        n_threads = init_threads(n_threads)
        for (n_prompt, n_gen), n_depth in itertools.product(tests, args.n_depth):
            r = bench(ctx, n_prompt, n_gen, args.repetitions, n_threads, n_depth=n_depth)
            row = dict(model_filename=model.path, model_type=desc, model_size=model.weights_bytes,
                       model_n_params=model.n_params, backends="CPU (numba)", **r.as_dict())
            results.append(row)
            if args.output == "md":
                print(f"| {desc} | {size_mib:.2f} MiB | {model.n_params / 1e6:.2f} M | CPU (numba) | "
                      f"{n_threads} | {r.test} | {r.avg_ts:.2f} ± {r.stddev_ts:.2f} |", flush=True)
            elif args.output == "jsonl":
                print(json.dumps(row), flush=True)
    if args.output == "json":
        json.dump(results, sys.stdout, indent=2)
        print()
    return 0


def _ftype(model) -> str:
    from ..model_info import file_type_name

    return file_type_name(model.gguf.get("general.file_type"))
