"""`ggstation perplexity`: llama-perplexity's method and output."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import params
from ..errors import EngineError
from .common import init_threads, model_path


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "perplexity",
        help="perplexity of a text file (llama-perplexity)",
        description="Compute perplexity over a text file, chunk by chunk.",
    )
    params.add_model_args(p)
    g = params.group(p, params.COMMON)
    g.add_argument("-f", "--file", metavar="FNAME", required=True, help="text file to score")
    g.add_argument(
        "-c", "--ctx-size", metavar="N", type=int, default=512, help="chunk size (default: 512)"
    )
    g.add_argument(
        "-b",
        "--batch-size",
        metavar="N",
        type=int,
        default=2048,
        help="logical batch size (default: 2048)",
    )
    g.add_argument(
        "-ub",
        "--ubatch-size",
        metavar="N",
        type=int,
        default=512,
        help="physical batch size (default: 512)",
    )
    g.add_argument(
        "--chunks",
        metavar="N",
        type=int,
        default=-1,
        help="max number of chunks (default: -1 = all)",
    )
    g.add_argument("-ctk", "--cache-type-k", default="f16", help="KV cache type for K (f16, f32)")
    g.add_argument("-ctv", "--cache-type-v", default="f16", help="KV cache type for V (f16, f32)")
    params.add_mem_check_arg(p)
    params.add_int8_arg(p)
    params.add_gpu_args(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    from ..context import ContextParams
    from ..init import InitParams, init_from_params
    from ..tools.perplexity import perplexity

    if args.ctx_size < 4:
        raise EngineError(f"-c must be at least 4 for perplexity (got {args.ctx_size})")
    try:
        text = Path(args.file).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise EngineError(f"cannot read '{args.file}': {e.strerror or e}") from None
    n_threads = init_threads(args.threads)
    n_ctx = args.ctx_size
    # One chunk per decode call: the batch must hold a whole chunk.
    context = ContextParams(
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=min(args.ubatch_size, args.batch_size, n_ctx),
        type_k=args.cache_type_k,
        type_v=args.cache_type_v,
        check_memory=not args.no_mem_check,
        decode_path=args.decode_path,
    )
    loaded = init_from_params(
        model_path(args, n_ctx),
        InitParams(
            context, n_threads=n_threads, n_gpu_layers=args.n_gpu_layers, device=args.device
        ),
    )
    ctx, tok = loaded.ctx, loaded.model.tokenizer
    tokens = tok.encode(text, add_special=True, parse_special=False)
    n_avail = len(tokens) // n_ctx
    print(
        f"perplexity: tokenized {len(tokens)} tokens; {n_avail} chunks of {n_ctx}, "
        f"{n_threads} threads",
        file=sys.stderr,
    )
    bos = tok.bos_id if tok.add_bos else None

    def show(c):
        sys.stderr.write(f"[{c.index + 1}]{c.ppl:.4f},")
        sys.stderr.flush()

    res = perplexity(ctx, tokens, n_ctx, bos, args.chunks, on_chunk=show)
    sys.stderr.write("\n")
    print(f"Final estimate: PPL = {res.ppl:.4f} +/- {res.stderr:.5f}")
    return 0
