"""`ggstation bench`: llama-bench's pp/tg tests, markdown or json output; with --path, the
decode speed through the HTTP server and the desktop app beside the engine's (bench_paths.py)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

from .. import params
from ..errors import EngineError
from .common import init_threads, model_path


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got '{text}'"
        ) from None
    if any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError("values must be >= 0")
    return vals


def _paths(text: str) -> list[str]:
    from ..tools.bench_paths import parse_paths

    try:
        return parse_paths(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench",
        help="prompt/generation throughput (llama-bench)",
        description="Measure prompt processing (ppN) and generation (tgN) tokens/s.",
    )
    g = params.group(p, params.COMMON)
    g.add_argument(
        "-m", "--model", metavar="FNAME", default=None, help="model path or starter model name"
    )
    params.add_hf_args(p)
    g.add_argument(
        "-p",
        "--n-prompt",
        metavar="N",
        type=_int_list,
        default=[512],
        help="prompt tokens (default: 512)",
    )
    g.add_argument(
        "-n",
        "--n-gen",
        metavar="N",
        type=_int_list,
        default=[128],
        help="generated tokens (default: 128)",
    )
    g.add_argument(
        "-d",
        "--n-depth",
        metavar="N",
        type=_int_list,
        default=[0],
        help="context depth: positions prefilled, untimed, before each test (default: 0)",
    )
    g.add_argument(
        "-b", "--batch-size", metavar="N", type=int, default=2048, help="batch size (default: 2048)"
    )
    g.add_argument(
        "-ub",
        "--ubatch-size",
        metavar="N",
        type=int,
        default=512,
        help="ubatch size (default: 512)",
    )
    g.add_argument(
        "-t",
        "--threads",
        metavar="N",
        type=_int_list,
        default=[os.cpu_count() or 1],
        help=f"threads (default: {os.cpu_count()})",
    )
    g.add_argument(
        "-r", "--repetitions", metavar="N", type=int, default=5, help="repetitions (default: 5)"
    )
    g.add_argument(
        "-ctk", "--cache-type-k", default="f16", help="KV cache type for K (default: f16)"
    )
    g.add_argument(
        "-ctv", "--cache-type-v", default="f16", help="KV cache type for V (default: f16)"
    )
    g.add_argument(
        "-o",
        "--output",
        choices=["md", "json", "jsonl"],
        default="md",
        help="output format (default: md)",
    )
    g.add_argument(
        "--path",
        type=_paths,
        default=["engine"],
        metavar="PATHS",
        help="what to measure, comma-separated: engine (the context itself), http (streaming "
        "/completion clients of a `serve` child process), gui (the desktop app's chat, "
        "python -m app.bench_gui); http and gui run the tgN tests only (default: engine)",
    )
    g.add_argument(
        "--clients",
        metavar="N",
        type=_int_list,
        default=[1],
        help="http path: concurrent streaming clients, the server started with -np N; "
        "a comma list gives one row each (default: 1)",
    )
    params.add_mem_check_arg(p)
    params.add_int8_arg(p)
    params.add_gpu_args(p, ngl_type=_int_list, ngl_default=[0])
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    if args.repetitions < 1:
        raise EngineError("-r must be at least 1")
    if any(c < 1 for c in args.clients):
        raise EngineError("--clients must be at least 1")
    for n_threads in args.threads:
        init_threads(n_threads)  # each -t value checked before anything runs
    out: _Output | None = None
    failed = False
    path = model_path(args)
    for ngl in args.n_gpu_layers:  # one load per -ngl value, as llama-bench
        model, ctx = _load(args, path, ngl)
        if out is None:
            out = _Output(args.output, model, show_ngl=any(args.n_gpu_layers))
        out.set_model(model, ngl)
        for bench_path in args.path:
            try:
                if bench_path == "engine":
                    _run_engine(args, ctx, out)
                else:
                    _run_path(args, model, bench_path, out)
            except (
                EngineError
            ) as e:  # one path failing (no GUI module, say) leaves the others' rows
                print(f"error: {bench_path} path: {e}", file=sys.stderr, flush=True)
                failed = True
        model.close()
    if out is not None:
        out.finish()
    return 1 if failed else 0


class _Output:
    """Rows as llama-bench prints them: a markdown table, a json array at the end, or jsonl."""

    def __init__(self, fmt: str, model, show_ngl: bool = False):
        self.fmt = fmt
        self.show_ngl = show_ngl  # llama-bench's ngl column, when some -ngl is given
        self.rows: list[dict] = []
        if fmt == "md":
            ngl = "ngl | " if show_ngl else ""
            print(f"| model | size | params | backend | {ngl}threads | test | t/s |")
            print(
                f"| --- | ---: | ---: | --- | {'---: | ' if show_ngl else ''}---: | ---: | ---: |"
            )

    def set_model(self, model, ngl: int) -> None:
        # which decode path ran: the numbers of the two differ by ~10 %
        self.backend = {
            "x16": "CPU (numba)",
            "int8": "CPU (numba, int8)",
            "float": "CPU (numba, float)",
        }[model.decode_path]
        if model.gpu is not None:
            self.backend = "OpenGL"
        self.ngl = ngl
        self.size_mib = model.weights_bytes / 2**20
        self.n_params = model.n_params
        self.desc = f"{model.cfg.arch} {model.gguf.get('general.size_label', '') or ''} {_ftype(model)}".replace(
            "  ", " "
        )
        self.base = dict(
            model_filename=model.path,
            model_type=self.desc,
            model_size=model.weights_bytes,
            model_n_params=model.n_params,
            backends=self.backend,
            n_gpu_layers=ngl,
        )

    def add(self, result, n_threads: int) -> None:
        row = dict(self.base, **result.as_dict())
        self.rows.append(row)
        if self.fmt == "md":
            ngl = f"{self.ngl} | " if self.show_ngl else ""
            print(
                f"| {self.desc} | {self.size_mib:.2f} MiB | {self.n_params / 1e6:.2f} M | {self.backend} | "
                f"{ngl}{n_threads} | {result.test} | {result.avg_ts:.2f} ± {result.stddev_ts:.2f} |",
                flush=True,
            )
        elif self.fmt == "jsonl":
            print(json.dumps(row), flush=True)

    def finish(self) -> None:
        if self.fmt == "json":
            json.dump(self.rows, sys.stdout, indent=2)
            print()


def _tests(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(n_prompt, n_gen) of each test: the ppN ones, then the tgN ones."""
    return [(n, 0) for n in args.n_prompt if n] + [(0, n) for n in args.n_gen if n]


def _load(args: argparse.Namespace, path, ngl: int):
    """The model with -ngl `ngl`, and a context for the engine path's tests when it is asked
    for (None otherwise: the http and gui paths measure other processes)."""
    from ..context import ContextParams
    from ..init import InitParams, init_from_params
    from ..model import load_model

    if "engine" not in args.path:
        return load_model(
            path, n_gpu_layers=ngl, device=args.device, decode_path=args.decode_path
        ), None
    n_ctx = max([p + g + d for p, g in _tests(args) for d in args.n_depth] + [16])
    context = ContextParams(
        n_ctx=n_ctx,
        n_batch=args.batch_size,
        n_ubatch=args.ubatch_size,
        type_k=args.cache_type_k,
        type_v=args.cache_type_v,
        check_memory=not args.no_mem_check,
        decode_path=args.decode_path,
    )
    loaded = init_from_params(path, InitParams(context, n_gpu_layers=ngl, device=args.device))
    return loaded.model, loaded.ctx


def _run_engine(args: argparse.Namespace, ctx, out: _Output) -> None:
    from ..tools.bench import bench

    tests = _tests(args)
    for n_threads in args.threads:
        n_threads = init_threads(n_threads)
        for (n_prompt, n_gen), n_depth in itertools.product(tests, args.n_depth):
            out.add(
                bench(ctx, n_prompt, n_gen, args.repetitions, n_threads, n_depth=n_depth), n_threads
            )


GUI_MODULE = "app.bench_gui"  # the desktop app's benchmark: the gui path runs it as a program


def gui_command(model: str, n_gen: int, reps: int, n_threads: int) -> list[str]:
    """The gui path's child process: the app's benchmark printing one JSON line."""
    return [
        sys.executable,
        "-m",
        GUI_MODULE,
        "--model",
        model,
        "-n",
        str(n_gen),
        "-r",
        str(reps),
        "-t",
        str(n_threads),
        "--json",
    ]


def _run_path(args: argparse.Namespace, model, path: str, out: _Output) -> None:
    """The http or gui path: tgN for each -n and -t (and --clients for http), on the model's
    decode path (the child processes are put on it: bench_paths)."""
    from ..tools import bench_paths

    for n_threads, n_gen in itertools.product(args.threads, [n for n in args.n_gen if n]):
        n_threads = init_threads(n_threads)
        if path == "gui":
            command = gui_command(model.path, n_gen, args.repetitions, n_threads)
            out.add(
                bench_paths.bench_gui(command, n_gen, n_threads, decode_path=model.decode_path),
                n_threads,
            )
            continue
        for n_clients in args.clients:
            r = bench_paths.bench_http(
                model.path,
                n_gen,
                args.repetitions,
                n_threads,
                n_clients,
                decode_path=model.decode_path,
            )
            out.add(r, n_threads)


def _ftype(model) -> str:
    from ..model_info import file_type_name

    return file_type_name(model.gguf.get("general.file_type"))
