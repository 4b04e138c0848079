"""What the model-running commands share beyond engine/params.py: the memory-check and int8
switches, the thread count's sanity check (one clear line for -t 0 or -t 100000) and the
garbage collector's pause while `generate` and `chat` start."""

from __future__ import annotations

import argparse
import gc
import sys

from .. import params
from ..errors import EngineError


def add_mem_check_arg(parser: argparse.ArgumentParser) -> None:
    params.group(parser, params.COMMON).add_argument(
        "--no-mem-check", action="store_true",
        help="load even when the estimated memory use (weights, KV cache, buffers) is clearly more than "
        "the RAM and swap available (also: GGSTATION_NO_MEM_CHECK=1)",
    )


class _Int8Action(argparse.Action):
    """`--int8` / `--no-int8`: choose the decode path as soon as the flag is parsed (before any
    kernel runs; the same as GGSTATION_INT8=1 / GGSTATION_NO_INT8=1; neither: the default,
    quants' "x16"). The last one given wins."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from .. import quants

        on = option_string == "--int8"
        quants.use_int8(on)
        setattr(namespace, self.dest, on)


def add_int8_arg(parser: argparse.ArgumentParser) -> None:
    group = params.group(parser, params.COMMON)
    group.add_argument(
        "--int8", dest="int8", action=_Int8Action, default=None,
        help="llama.cpp's int8 dot products against activations rounded to 8 bits (Q8 blocks; the "
        "rounding moves each logit by a draw of ~0.5 %%) instead of the default's two 8-bit planes "
        "(~15 bits, float-grade) (also: GGSTATION_INT8=1)",
    )
    group.add_argument(
        "--no-int8", dest="int8", action=_Int8Action, default=None,
        help="float32 activations times the weights unpacked to float: the exact, slower oracle "
        "(also: GGSTATION_NO_INT8=1)",
    )


class ListDevicesAction(argparse.Action):
    """--list-devices: print every device llama.cpp's way and exit."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(devices_text(), end="")
        parser.exit(0)


def devices_text() -> str:
    """llama.cpp's list (common_print_available_devices): "Available devices:" and a line per
    usable GPU device, "  GL0: <description> (N MiB, M MiB free)", or "  (none)". A device
    found but unusable is said on stderr with the reason."""
    from ..backends import CPU, list_devices

    lines = ["Available devices:"]
    for d in list_devices():
        if d.name == CPU:
            continue
        if not d.available:
            print(f"{d.name}: {d.backend} not available: {d.reason}", file=sys.stderr)
            continue
        total = "?" if d.total_bytes is None else str(d.total_bytes >> 20)
        free = "?" if d.free_bytes is None else str(d.free_bytes >> 20)
        lines.append(f"  {d.name}: {d.description} ({total} MiB, {free} MiB free)")
    if len(lines) == 1:
        lines.append("  (none)")
    return "\n".join(lines) + "\n"


def _split_mode(value: str) -> str:
    v = value.strip().lower()
    if v == "row":
        raise argparse.ArgumentTypeError("split mode 'row' needs several GPUs of one backend; "
                                         "ggstation has one OpenGL device: use none or layer")
    if v not in ("none", "layer"):
        raise argparse.ArgumentTypeError(f"invalid split mode '{value}' (none, layer or row)")
    return v


def add_gpu_args(parser: argparse.ArgumentParser, ngl_type=int, ngl_default=0) -> None:
    """llama.cpp's device flags: -ngl, --device, --list-devices, -sm."""
    g = params.group(parser, params.COMMON)
    g.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers", type=ngl_type,
                   default=ngl_default, metavar="N",
                   help="layers to offload to the GPU (OpenGL compute), the last ones, the output head "
                   "counting as the last layer as in llama.cpp (default: 0, CPU only)")
    g.add_argument("-dev", "--device", default=None, metavar="<dev1,dev2,..>",
                   help="devices to offload to, comma-separated (see --list-devices); none = CPU only")
    g.add_argument("--list-devices", action=ListDevicesAction, help="print the compute devices and exit")
    g.add_argument("-sm", "--split-mode", type=_split_mode, default="layer", metavar="{none,layer,row}",
                   help="how to split the model over GPUs; with one GPU none and layer are the same "
                   "(default: layer)")


def gpu_kwargs(args: argparse.Namespace, n_gpu_layers: int | None = None) -> dict:
    """load_model's n_gpu_layers and device from the parsed flags."""
    return dict(n_gpu_layers=args.n_gpu_layers if n_gpu_layers is None else n_gpu_layers, device=args.device)


def mem_check(args: argparse.Namespace) -> bool:
    """Whether contexts made for this command check that they fit in memory."""
    return not getattr(args, "no_mem_check", False)


def init_threads(n_threads: int) -> int:
    """-t/--threads: -1 (or unset) is every core; 0 and other negatives are refused; more than
    the machine's hardware threads is cut down with a warning. Returns the count in use."""
    from ..jit import set_num_threads

    if n_threads == 0 or n_threads < -1:
        raise EngineError(f"invalid -t/--threads {n_threads}: use 1 or more, or -1 for every core")
    n = set_num_threads(n_threads)
    if n_threads > n:
        print(f"warning: -t {n_threads} is more than the {n} hardware threads available; using {n}",
              file=sys.stderr)
    return n


_collector_paused = False


def pause_collector() -> None:
    """No garbage collection until resume_collector(): engine.cli.main calls it when the
    process's own command line is `generate` or `chat`. Importing numba and loading its
    target and kernels made ~270 collections, ~0.1 s of CPU, that found almost nothing to
    free (the peak RSS is the same without them)."""
    global _collector_paused
    gc.disable()
    _collector_paused = True


def resume_collector() -> None:
    """After the model has loaded: collect again, but leave out everything made so far
    (gc.freeze: imports, numba's registries, the tokenizer, which live as long as the
    process), so that a collection during generation does not walk them either; the ~1000
    objects start-up left in reference cycles stay until exit. Does nothing unless
    pause_collector() ran."""
    global _collector_paused
    if _collector_paused:
        _collector_paused = False
        gc.freeze()
        gc.enable()
