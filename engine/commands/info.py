"""`ggstation info`: what a GGUF holds and what loading it would allocate."""

from __future__ import annotations

import argparse
import json

from .. import params
from ..errors import EngineError
from .common import model_path


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "info",
        help="model facts and memory estimate",
        description="Show a model's architecture, size, types, tokenizer and memory estimate.",
    )
    g = params.group(p, params.COMMON)
    g.add_argument(
        "-m", "--model", metavar="FNAME", default=None, help="model path or starter model name"
    )
    params.add_hf_args(p)
    g.add_argument(
        "-mm",
        "--mmproj",
        metavar="FILE",
        default=None,
        help="a multimodal projector: its weights and encode buffer join the estimate",
    )
    g.add_argument(
        "-c",
        "--ctx-size",
        metavar="N",
        type=int,
        default=4096,
        help="context size (default: 4096, 0 = model's)",
    )
    g.add_argument(
        "-np",
        "--parallel",
        metavar="N",
        type=int,
        default=1,
        help="parallel sequences (default: 1)",
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
        "-kvu", "--kv-unified", action="store_true", help="every sequence may use the whole context"
    )
    g.add_argument(
        "-ctk", "--cache-type-k", default="f16", help="KV cache type for K (default: f16)"
    )
    g.add_argument(
        "-ctv", "--cache-type-v", default="f16", help="KV cache type for V (default: f16)"
    )
    g.add_argument(
        "-ngl",
        "--gpu-layers",
        "--n-gpu-layers",
        dest="n_gpu_layers",
        metavar="N",
        type=int,
        default=0,
        help="estimate with the last N layers on the GPU (N > layers: the output "
        "layer too; -1: all) (default: 0)",
    )
    g.add_argument(
        "-dev",
        "--device",
        metavar="NAME",
        default=None,
        help="the GPU device the estimate offloads to (default: the first usable one)",
    )
    g.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(run=run)
    return p


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def run(args: argparse.Namespace) -> int:
    from ..context import ContextParams, check_params
    from ..memory import ctx_per_seq, device_fits, fmt_bytes, memory_fit
    from ..model_info import inspect_model

    if args.ctx_size < 0:
        raise EngineError(f"invalid context size {args.ctx_size}")
    if args.parallel == 0 or args.parallel < -1:
        raise EngineError(f"invalid -np/--parallel {args.parallel}: use 1 or more, or -1 for auto")
    info = inspect_model(model_path(args, args.ctx_size))
    if info.error:
        raise EngineError(info.error)
    p = params.common_params(args)
    n_seq, unified = p.n_slots, p.unified_kv
    n_ctx = args.ctx_size or info.n_ctx_train
    check_params(
        ContextParams(n_ctx=n_ctx, n_ubatch=args.ubatch_size, n_seq_max=n_seq, kv_unified=unified),
        n_ctx,
    )
    gpu, n_gpu = _placement(args, info.n_layer)
    est = info.estimate(
        n_ctx=n_ctx,
        n_seq_max=n_seq,
        type_k=args.cache_type_k,
        type_v=args.cache_type_v,
        n_ubatch=args.ubatch_size,
        kv_unified=unified,
        n_gpu_layers=n_gpu,
        gpu_device=gpu.name if gpu else "GL0",
    )
    projector = None
    if args.mmproj:
        from ..vision import estimate_projector

        projector = estimate_projector(args.mmproj)
        est = est.with_projector(*projector)
    fit = memory_fit(est)
    gpu_fits = device_fits(est, [gpu] if gpu else [])
    n_ctx_seq = ctx_per_seq(n_ctx, n_seq, unified)
    beyond = (
        f" (beyond the training context {info.n_ctx_train})" if n_ctx_seq > info.n_ctx_train else ""
    )
    if args.json:
        d = {k: v for k, v in vars(info).items() if k != "cfg"}
        d["memory_estimate"] = est.as_dict()
        d["memory_available"] = {
            "ram_bytes": fit.available_bytes,
            "swap_free_bytes": fit.swap_free_bytes,
            "verdict": fit.verdict,
        }
        d["gpu_fit"] = [
            {
                "device": f.device,
                "needed_bytes": f.needed_bytes,
                "free_bytes": f.free_bytes,
                "total_bytes": f.total_bytes,
                "verdict": f.verdict,
            }
            for f in gpu_fits
        ]
        d["n_ctx"] = n_ctx
        print(json.dumps(d, indent=2))
        return 0
    quant = ", ".join(
        f"{k} ({info.quant_counts[k]} tensors, {_mib(v)})"
        for k, v in sorted(info.quant_bytes.items(), key=lambda kv: -kv[1])
    )
    if info.has_chat_template:
        tmpl = "from the GGUF"
    else:
        name = info.chat_template_name
        tmpl = f"none in the file; built-in '{name}' is used" if name else "none"
    rows = [
        ("file", info.path),
        ("name", info.name),
        ("architecture", info.arch),
        ("parameters", f"{info.n_params / 1e6:.2f} M"),
        *_expert_rows(info),
        ("file size", _mib(info.file_size)),
        ("file type", info.file_type or "unknown"),
        ("quant types", quant),
        ("layers / embd / vocab", f"{info.n_layer} / {info.n_embd} / {info.n_vocab}"),
        ("context (train)", str(info.n_ctx_train)),
        (
            "tokenizer",
            f"{info.tokenizer} (pre '{info.tokenizer_pre}')"
            if info.tokenizer_pre
            else info.tokenizer,
        ),
        ("chat template", tmpl),
        (
            "memory estimate",
            f"n_ctx {n_ctx}, {n_seq} sequence(s)"
            f"{' (unified)' if unified else ''}, "
            f"cache {args.cache_type_k}/{args.cache_type_v}{beyond}",
        ),
        ("  weights (mapped)", _mib(est.weights_bytes)),
        ("  KV cache", _mib(est.kv_bytes)),
        ("  compute buffer", _mib(est.compute_bytes)),
        ("  metadata", _mib(est.metadata_bytes)),
        *(
            [
                ("  projector weights", _mib(est.projector_weights_bytes)),
                ("  image encode buffer", _mib(est.projector_compute_bytes)),
            ]
            if projector
            else []
        ),
        ("  total", _mib(est.total_bytes)),
        *_device_rows(est, gpu_fits, args.n_gpu_layers, gpu),
        (
            "memory available",
            f"{fmt_bytes(fit.available_bytes)} RAM + {fmt_bytes(fit.swap_free_bytes)} free swap",
        ),
        (
            "fit",
            {
                "fits": "fits",
                "tight": "tight: expect swapping, a smaller -c would leave room",
                "too big": "too big: loading with these settings is refused (--no-mem-check to try)",
            }[fit.verdict],
        ),
    ]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    return 0


def _placement(args: argparse.Namespace, n_layer: int):
    """(the GPU DeviceInfo, -ngl for the estimate): -1 is every layer and the output; with no
    usable GPU, or -dev naming none, the CPU holds everything (0)."""
    from ..backends import list_devices

    if not args.n_gpu_layers:
        return None, 0
    gpus = [d for d in list_devices() if d.backend != "CPU" and d.available]
    if args.device is not None:
        gpus = [d for d in gpus if d.name == args.device]
    if not gpus:
        return None, 0
    return gpus[0], n_layer + 1 if args.n_gpu_layers < 0 else args.n_gpu_layers


def _device_rows(est, gpu_fits, n_gpu_layers: int, gpu) -> list[tuple[str, str]]:
    """Each device's share when layers are offloaded, and whether the GPU's fits its memory."""
    from ..backends import CPU
    from ..memory import fmt_bytes

    if n_gpu_layers and gpu is None:
        return [("  GPU", f"none usable: -ngl {n_gpu_layers} ignored, every layer on the CPU")]
    if len(est.devices) < 2:
        return []
    rows = []
    for d in est.devices:
        layers = f"{d.n_layers} layer{'' if d.n_layers == 1 else 's'}"
        if d.device != CPU:  # -ngl counts the output layer first (backends.gpu_placement)
            layers += " + output"
        rows.append(
            (
                f"  on {d.device}",
                f"{layers}: weights {_mib(d.weights_bytes)}, KV {_mib(d.kv_bytes)}, "
                f"compute {_mib(d.compute_bytes)} = {fmt_bytes(d.total_bytes)}",
            )
        )
    return rows + [("  GPU fit", f.summary()) for f in gpu_fits]


def _expert_rows(info) -> list[tuple[str, str]]:
    """A mixture of experts: how many experts, and what one token runs through of the total."""
    if not info.n_expert:
        return []
    return [
        ("experts", f"{info.n_expert} per layer, {info.n_expert_used} used per token"),
        (
            "active per token",
            f"{info.active_params / 1e6:.2f} M parameters, {_mib(info.active_bytes)} "
            f"of the {_mib(info.weights_bytes)} of weights",
        ),
    ]
