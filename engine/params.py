"""The one command-line parameter set shared by every entry point (llama.cpp common_params).

Each entry point (serve, chat, generate, bench, perplexity, the GUI's defaults) builds its
parser from the `add_*_args` functions below, so a flag has one name, one default and one
check everywhere. Flags keep llama.cpp's names and defaults and appear under llama.cpp's
--help groups: 'common params', 'sampling params', 'example-specific params'.
`common_params(args)` turns the parsed namespace into the typed CommonParams once; the
commands pass that down, and `to_context_params(p)` / `init_params(p, ...)` turn it into the
engine's parameter objects (`to_sampling_params(args)` makes its SamplingParams).

Usage errors exit with status 1 (llama.cpp's), not argparse's 2, when the parser is an
`ArgumentParser` from this module.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import EngineError
from .sampling import SamplingParams, sampler_names

if TYPE_CHECKING:
    from .context import ContextParams
    from .init import InitParams, SchedulerParams

COMMON = "common params"
SAMPLING = "sampling params"
EXAMPLE = "example-specific params"

CACHE_TYPES = ("f16", "f32")
# Types llama.cpp accepts for -ctk/-ctv that this engine does not implement.
_LLAMA_CACHE_TYPES = ("bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")

_DEFAULTS = SamplingParams()


class ArgumentParser(argparse.ArgumentParser):
    """argparse with llama.cpp's exit status for usage errors (1 instead of 2)."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(1, f"{self.prog}: error: {message}\n")


def group(parser: argparse.ArgumentParser, title: str) -> argparse._ArgumentGroup:
    """The parser's argument group called `title`, created on first use."""
    for g in parser._action_groups:
        if g.title == title:
            return g
    return parser.add_argument_group(title)


# -- value types: each raises ArgumentTypeError with a message naming the rule -------------


def _int_at_least(lo: int, what: str = ""):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}{what}, got {v}")
        return v

    parse.__name__ = "int"
    return parse


def _finite_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected a finite number, got '{text}'")
    return v


_finite_float.__name__ = "float"


def _seed(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer seed, got '{text}'") from None


def _cache_type(text: str) -> str:
    t = text.lower()
    if t in CACHE_TYPES:
        return t
    if t in _LLAMA_CACHE_TYPES:
        raise argparse.ArgumentTypeError(
            f"cache type '{text}' is not supported by this engine (supported: "
            f"{', '.join(CACHE_TYPES)})"
        )
    raise argparse.ArgumentTypeError(
        f"unknown cache type '{text}' (supported: {', '.join(CACHE_TYPES)})"
    )


def _parallel(text: str) -> int:
    v = _int_at_least(-1)(text)
    if v == 0:
        raise argparse.ArgumentTypeError("must be >= 1 (or -1 for auto), got 0")
    return v


_LOGIT_BIAS = re.compile(r"^\s*(\d+)\s*([+-])\s*(\S.*)$")


def parse_logit_bias(text: str) -> tuple[int, float]:
    """'15043+1' -> (15043, 1.0); '15043-inf' -> (15043, -inf) (llama.cpp -l format)."""
    m = _LOGIT_BIAS.match(text)
    try:
        if not m:
            raise ValueError
        bias = float(m.group(3))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid logit bias '{text}': expected TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-inf"
        ) from None
    return int(m.group(1)), (-bias if m.group(2) == "-" else bias)


# -- argument sets -------------------------------------------------------------------------


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """-m/--model, the Hugging Face flags (-hf, -hff, -hft) and -t/--threads."""
    g = group(parser, COMMON)
    g.add_argument(
        "-m",
        "--model",
        metavar="FNAME",
        default=None,
        help="model path, or a starter model name (e.g. smollm2)",
    )
    add_hf_args(parser)
    g.add_argument(
        "-t",
        "--threads",
        metavar="N",
        type=int,
        default=-1,
        help="number of CPU threads to use during generation (default: -1 = all cores)",
    )


def add_hf_args(parser: argparse.ArgumentParser) -> None:
    """-hf/-hff/-hft: a model from the Hugging Face Hub (engine/hub/client.py), llama.cpp's flags."""
    g = group(parser, COMMON)
    g.add_argument(
        "-hf",
        "-hfr",
        "--hf-repo",
        dest="hf_repo",
        metavar="<user>/<model>[:quant]",
        default=None,
        help="Hugging Face model repository; quant is optional, case-insensitive, default Q4_K_M "
        "(else Q8_0, else the first GGUF); downloaded into the HF cache unless already there "
        "(env: LLAMA_ARG_HF_REPO)",
    )
    g.add_argument(
        "-hff",
        "--hf-file",
        dest="hf_file",
        metavar="FILE",
        default=None,
        help="Hugging Face model file; overrides the quant in -hf (env: LLAMA_ARG_HF_FILE)",
    )
    g.add_argument(
        "-hft",
        "--hf-token",
        dest="hf_token",
        metavar="TOKEN",
        default=None,
        help="Hugging Face access token (default: HF_TOKEN, else `hf auth login`'s)",
    )


def add_context_args(parser: argparse.ArgumentParser) -> None:
    """KV cache and batching: -c, -b, -ub, -np, -kvu, -ctk, -ctv, --keep, --context-shift."""
    g = group(parser, COMMON)
    g.add_argument(
        "-c",
        "--ctx-size",
        metavar="N",
        type=_int_at_least(0),
        default=4096,
        help="size of the prompt context (default: 4096, 0 = loaded from model)",
    )
    g.add_argument(
        "-b",
        "--batch-size",
        metavar="N",
        type=_int_at_least(1),
        default=2048,
        help="logical maximum batch size (default: 2048)",
    )
    g.add_argument(
        "-ub",
        "--ubatch-size",
        metavar="N",
        type=_int_at_least(1),
        default=512,
        help="physical maximum batch size (default: 512)",
    )
    g.add_argument(
        "-np",
        "--parallel",
        metavar="N",
        type=_parallel,
        default=1,
        help="number of parallel sequences to decode (default: 1, -1 = auto)",
    )
    g.add_argument(
        "-kvu",
        "--kv-unified",
        action="store_true",
        help="use a single unified KV buffer shared by all sequences (default: enabled if the number "
        "of slots is auto)",
    )
    g.add_argument(
        "-no-kvu",
        "--no-kv-unified",
        dest="kv_unified",
        action="store_false",
        help=argparse.SUPPRESS,
    )
    g.add_argument(
        "-ctk",
        "--cache-type-k",
        metavar="TYPE",
        type=_cache_type,
        default="f16",
        help=f"KV cache data type for K; allowed values: {', '.join(CACHE_TYPES)} (default: f16)",
    )
    g.add_argument(
        "-ctv",
        "--cache-type-v",
        metavar="TYPE",
        type=_cache_type,
        default="f16",
        help=f"KV cache data type for V; allowed values: {', '.join(CACHE_TYPES)} (default: f16)",
    )
    g.add_argument(
        "--keep",
        metavar="N",
        type=_int_at_least(-1),
        default=0,
        help="number of tokens to keep from the initial prompt on a context shift "
        "(default: 0, -1 = all)",
    )
    g.add_argument(
        "--context-shift",
        dest="context_shift",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="on infinite generation, shift the context instead of stopping (default: disabled)",
    )


def add_generation_args(parser: argparse.ArgumentParser, *, prompt: bool = True) -> None:
    """-n/--n-predict, --verbose and (with prompt=True) -p/--prompt, -f/--file, -r."""
    g = group(parser, COMMON)
    g.add_argument(
        "-n",
        "--n-predict",
        "--predict",
        dest="n_predict",
        metavar="N",
        type=_int_at_least(-1),
        default=-1,
        help="number of tokens to predict (default: -1, -1 = infinity)",
    )
    if prompt:
        g.add_argument(
            "-p", "--prompt", metavar="PROMPT", default=None, help="prompt to start generation with"
        )
        g.add_argument(
            "-f", "--file", metavar="FNAME", default=None, help="a file containing the prompt"
        )
        g.add_argument(
            "-r",
            "--reverse-prompt",
            dest="stop",
            metavar="PROMPT",
            action="append",
            default=[],
            help="halt generation at PROMPT (may be given several times)",
        )
    g.add_argument(
        "-v",
        "--verbose",
        "--log-verbose",
        dest="verbose",
        action="store_true",
        help="print timings and extra information",
    )


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    """Every SamplingParams field as a flag, llama.cpp names and defaults."""
    g = group(parser, SAMPLING)
    d = _DEFAULTS
    g.add_argument(
        "-s",
        "--seed",
        metavar="SEED",
        type=_seed,
        default=d.seed,
        help="RNG seed (default: -1, use random seed for -1)",
    )
    g.add_argument(
        "--temp",
        metavar="N",
        type=_finite_float,
        default=d.temperature,
        help=f"temperature (default: {d.temperature}; <= 0 = greedy)",
    )
    g.add_argument(
        "--top-k",
        metavar="N",
        type=int,
        default=d.top_k,
        help=f"top-k sampling (default: {d.top_k}, 0 = disabled)",
    )
    g.add_argument(
        "--top-p",
        metavar="N",
        type=_finite_float,
        default=d.top_p,
        help=f"top-p sampling (default: {d.top_p}, 1.0 = disabled)",
    )
    g.add_argument(
        "--min-p",
        metavar="N",
        type=_finite_float,
        default=d.min_p,
        help=f"min-p sampling (default: {d.min_p}, 0.0 = disabled)",
    )
    g.add_argument(
        "--typical",
        metavar="N",
        type=_finite_float,
        default=d.typical_p,
        help=f"locally typical sampling, parameter p (default: {d.typical_p}, 1.0 = disabled)",
    )
    g.add_argument(
        "--repeat-last-n",
        metavar="N",
        type=_int_at_least(-1),
        default=d.repeat_last_n,
        help=f"last n tokens to consider for penalize (default: {d.repeat_last_n}, "
        "0 = disabled, -1 = ctx_size)",
    )
    g.add_argument(
        "--repeat-penalty",
        metavar="N",
        type=_finite_float,
        default=d.repeat_penalty,
        help=f"penalize repeat sequence of tokens (default: {d.repeat_penalty}, 1.0 = disabled)",
    )
    g.add_argument(
        "--presence-penalty",
        metavar="N",
        type=_finite_float,
        default=d.presence_penalty,
        help=f"repeat alpha presence penalty (default: {d.presence_penalty}, 0.0 = disabled)",
    )
    g.add_argument(
        "--frequency-penalty",
        metavar="N",
        type=_finite_float,
        default=d.frequency_penalty,
        help=f"repeat alpha frequency penalty (default: {d.frequency_penalty}, 0.0 = disabled)",
    )
    g.add_argument(
        "--top-nsigma",
        "--top-n-sigma",
        dest="top_n_sigma",
        metavar="N",
        type=_finite_float,
        default=d.top_n_sigma,
        help=f"top-n-sigma sampling (default: {d.top_n_sigma}, -1.0 = disabled)",
    )
    g.add_argument(
        "--xtc-probability",
        metavar="N",
        type=_finite_float,
        default=d.xtc_probability,
        help=f"xtc probability (default: {d.xtc_probability}, 0.0 = disabled)",
    )
    g.add_argument(
        "--xtc-threshold",
        metavar="N",
        type=_finite_float,
        default=d.xtc_threshold,
        help=f"xtc threshold (default: {d.xtc_threshold}, 1.0 = disabled)",
    )
    g.add_argument(
        "--dynatemp-range",
        metavar="N",
        type=_finite_float,
        default=d.dynatemp_range,
        help=f"dynamic temperature range (default: {d.dynatemp_range}, 0.0 = disabled)",
    )
    g.add_argument(
        "--dynatemp-exp",
        metavar="N",
        type=_finite_float,
        default=d.dynatemp_exponent,
        help=f"dynamic temperature exponent (default: {d.dynatemp_exponent})",
    )
    g.add_argument(
        "--samplers",
        metavar="SAMPLERS",
        default=None,
        type=lambda v: sampler_names(v.split(";")),
        help="samplers used for generation in order, separated by ';' "
        f"(default: {';'.join(d.samplers)})",
    )
    g.add_argument(
        "--sampling-seq",
        "--sampler-seq",
        dest="samplers",
        metavar="SEQUENCE",
        type=sampler_names,
        help="simplified sequence for samplers, one letter each (e.g. 'edskypmxt')",
    )
    g.add_argument(
        "--ignore-eos",
        action="store_true",
        help="ignore end of stream token and continue generating",
    )
    g.add_argument(
        "-l",
        "--logit-bias",
        metavar="TOKEN_ID(+/-)BIAS",
        type=parse_logit_bias,
        action="append",
        default=[],
        help="modifies the likelihood of token appearing in the completion, i.e. "
        "`--logit-bias 15043+1` to increase likelihood of token ' Hello', "
        "or `--logit-bias 15043-1` to decrease it",
    )


def add_chat_args(parser: argparse.ArgumentParser) -> None:
    """-sys/--system-prompt, --chat-template(-file), --jinja/--no-jinja."""
    g = group(parser, EXAMPLE)
    g.add_argument(
        "-sys",
        "--system-prompt",
        metavar="PROMPT",
        default=None,
        help="system prompt to use with the model's chat template",
    )
    g.add_argument(
        "--chat-template",
        metavar="JINJA_TEMPLATE",
        default=None,
        help="set a custom jinja chat template or a built-in template name "
        "(default: the template in the model's metadata)",
    )
    g.add_argument(
        "--chat-template-file",
        metavar="JINJA_TEMPLATE_FILE",
        default=None,
        help="set a custom jinja chat template file",
    )
    g.add_argument(
        "--jinja",
        dest="jinja",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="use the jinja template engine for chat (default: enabled; with --no-jinja "
        "the server renders the built-in format the template matches, as llama-server's "
        "legacy templates: no default system prompt, no template logic)",
    )


def add_mmproj_args(parser: argparse.ArgumentParser, *, images: bool = True) -> None:
    """The multimodal projector's flags (llama.cpp's -mm/--mmproj, --no-mmproj,
    --mmproj-offload, --image-min-tokens/--image-max-tokens) and, for the one-shot commands,
    --image FILE (repeatable, as llama-mtmd-cli's)."""
    g = group(parser, COMMON)
    g.add_argument(
        "-mm",
        "--mmproj",
        metavar="FILE",
        default=None,
        help="multimodal projector file (an mmproj GGUF) for image input; with -hf, the repo's "
        "mmproj file is used unless --no-mmproj (env: LLAMA_ARG_MMPROJ)",
    )
    g.add_argument(
        "--mmproj-auto",
        "--no-mmproj",
        "--no-mmproj-auto",
        dest="mmproj_auto",
        action=_BoolFlag,
        default=True,
        help="with -hf, use the repo's mmproj file when it has one (default: on)",
    )
    g.add_argument(
        "--mmproj-offload",
        "--no-mmproj-offload",
        dest="mmproj_offload",
        action=_BoolFlag,
        default=True,
        help="accepted for llama.cpp compatibility: the projector always runs on the CPU here",
    )
    g.add_argument(
        "--image-min-tokens",
        metavar="N",
        type=_int_at_least(1, "--image-min-tokens"),
        default=None,
        help="minimum tokens per image for projectors with a dynamic resolution (idefics3)",
    )
    g.add_argument(
        "--image-max-tokens",
        metavar="N",
        type=_int_at_least(1, "--image-max-tokens"),
        default=None,
        help="maximum tokens per image for projectors with a dynamic resolution (idefics3)",
    )
    if images:
        g.add_argument(
            "--image",
            dest="images",
            metavar="FILE",
            action="append",
            default=[],
            help="an image file for the prompt (repeatable; needs --mmproj); each goes where the "
            "prompt has a <__media__> marker, or before the prompt's text when it has none",
        )


class _BoolFlag(argparse.Action):
    """A switch whose "--no-..." spellings turn it off (llama.cpp's paired flags)."""

    def __init__(self, option_strings, dest, default=True, **kw):
        super().__init__(option_strings, dest, nargs=0, default=default, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, not str(option_string).startswith("--no-"))


def add_common_args(parser: argparse.ArgumentParser, *, prompt: bool = True) -> None:
    """Model, context, generation and sampling flags: what every generating command takes."""
    add_model_args(parser)
    add_mmproj_args(parser, images=prompt)
    add_context_args(parser)
    add_generation_args(parser, prompt=prompt)
    add_sampling_args(parser)


# -- the model-running commands' switches: memory check, decode path, devices ----------------


def add_mem_check_arg(parser: argparse.ArgumentParser) -> None:
    """--no-mem-check: load even what the memory estimate says will not fit."""
    group(parser, COMMON).add_argument(
        "--no-mem-check",
        action="store_true",
        help="load even when the estimated memory use (weights, KV cache, buffers) is clearly more than "
        "the RAM and swap available (also: GGSTATION_NO_MEM_CHECK=1)",
    )


def add_int8_arg(parser: argparse.ArgumentParser) -> None:
    """--int8 / --no-int8: the decode path (engine/quants/__init__.py, DECODE_PATHS), as
    `decode_path` "int8" or "float"; neither: None, which the model's load turns into the
    default (GGSTATION_INT8=1 / GGSTATION_NO_INT8=1, else "x16"). The last one given wins.
    CommonParams.decode_path carries it to ContextParams.decode_path."""
    g = group(parser, COMMON)
    g.add_argument(
        "--int8",
        dest="decode_path",
        action="store_const",
        const="int8",
        default=None,
        help="llama.cpp's int8 dot products against activations rounded to 8 bits (Q8 blocks; the "
        "rounding moves each logit by a draw of ~0.5 %%) instead of the default's two 8-bit planes "
        "(~15 bits, float-grade) (also: GGSTATION_INT8=1)",
    )
    g.add_argument(
        "--no-int8",
        dest="decode_path",
        action="store_const",
        const="float",
        default=None,
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
    from .backends import CPU, list_devices

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
        raise argparse.ArgumentTypeError(
            "split mode 'row' needs several GPUs of one backend; "
            "ggstation has one OpenGL device: use none or layer"
        )
    if v not in ("none", "layer"):
        raise argparse.ArgumentTypeError(f"invalid split mode '{value}' (none, layer or row)")
    return v


def add_gpu_args(parser: argparse.ArgumentParser, ngl_type=int, ngl_default=0) -> None:
    """llama.cpp's device flags: -ngl, --device, --list-devices, -sm."""
    g = group(parser, COMMON)
    g.add_argument(
        "-ngl",
        "--gpu-layers",
        "--n-gpu-layers",
        dest="n_gpu_layers",
        type=ngl_type,
        default=ngl_default,
        metavar="N",
        help="layers to offload to the GPU (OpenGL compute), the last ones, the output head "
        "counting as the last layer as in llama.cpp (default: 0, CPU only)",
    )
    g.add_argument(
        "-dev",
        "--device",
        default=None,
        metavar="<dev1,dev2,..>",
        help="devices to offload to, comma-separated (see --list-devices); none = CPU only",
    )
    g.add_argument(
        "--list-devices", action=ListDevicesAction, help="print the compute devices and exit"
    )
    g.add_argument(
        "-sm",
        "--split-mode",
        type=_split_mode,
        default="layer",
        metavar="{none,layer,row}",
        help="how to split the model over GPUs; with one GPU none and layer are the same "
        "(default: layer)",
    )


def defaults(argv: list[str] | None = None) -> argparse.Namespace:
    """Every shared flag's value when `argv` (default: nothing) is parsed, e.g. for the GUI's
    initial settings: `to_sampling_params(defaults())`."""
    parser = ArgumentParser(add_help=False)
    add_common_args(parser)
    add_chat_args(parser)
    return parser.parse_args(argv or [])


# -- namespace -> engine objects -----------------------------------------------------------


def to_sampling_params(args: argparse.Namespace, **overrides: object) -> SamplingParams:
    """SamplingParams from flags parsed by a parser that has the sampling group."""
    kw: dict[str, object] = dict(
        temperature=args.temp,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        typical_p=args.typical,
        repeat_penalty=args.repeat_penalty,
        repeat_last_n=args.repeat_last_n,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
        logit_bias=_merge_bias(args.logit_bias),
        top_n_sigma=args.top_n_sigma,
        xtc_probability=args.xtc_probability,
        xtc_threshold=args.xtc_threshold,
        dynatemp_range=args.dynatemp_range,
        dynatemp_exponent=args.dynatemp_exp,
    )
    if args.samplers is not None:
        kw["samplers"] = args.samplers
    kw.update(overrides)
    return SamplingParams(**kw)  # type: ignore[arg-type]


AUTO_SLOTS = 4  # -np -1 (auto), as llama.cpp's server


def n_slots(parallel: int) -> int:
    """-np/--parallel as a number of slots (sequences): -1 (auto) is AUTO_SLOTS."""
    return AUTO_SLOTS if parallel < 0 else parallel


@dataclass(frozen=True)
class CommonParams:
    """The shared flags' values, typed (llama.cpp's common_params): what a generating
    command (generate, chat, serve) passes down instead of its argparse namespace. Built once
    by common_params(args); a flag the command does not take keeps llama.cpp's default."""

    model: str | None = None
    hf_repo: str | None = None
    hf_file: str | None = None
    hf_token: str | None = None
    n_threads: int = -1
    n_ctx: int = 4096  # 0: the model's training context
    n_batch: int = 2048
    n_ubatch: int = 512
    n_parallel: int = 1  # -1: auto (AUTO_SLOTS and a unified cache)
    kv_unified: bool = False
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    n_keep: int = 0
    context_shift: bool = False
    n_predict: int = -1
    prompt: str | None = None
    prompt_file: str | None = None
    antiprompt: tuple[str, ...] = ()  # -r/--reverse-prompt
    verbose: bool = False
    sampling: SamplingParams = _DEFAULTS
    system_prompt: str | None = None
    chat_template: str | None = None
    chat_template_file: str | None = None
    use_jinja: bool = True
    n_gpu_layers: int = 0
    device: str | None = None
    mem_check: bool = True  # --no-mem-check turns it off
    decode_path: str | None = (
        None  # --int8 "int8", --no-int8 "float"; None: quants.default_decode_path()
    )
    mmproj: str | None = None  # -mm/--mmproj
    mmproj_auto: bool = True  # --no-mmproj turns it off: -hf then skips the repo's mmproj
    mmproj_offload: bool = True
    image_min_tokens: int | None = None
    image_max_tokens: int | None = None
    images: tuple[str, ...] = ()  # --image (chat, generate)

    @property
    def n_slots(self) -> int:
        return n_slots(self.n_parallel)

    @property
    def unified_kv(self) -> bool:
        """-kvu, or auto parallelism (-np -1), whose slots share one cache as llama-server's."""
        return self.kv_unified or self.n_parallel < 0


# flag dest -> CommonParams field, for the flags whose names differ from llama.cpp's fields
_FIELD_OF_DEST = {
    "threads": "n_threads",
    "ctx_size": "n_ctx",
    "batch_size": "n_batch",
    "ubatch_size": "n_ubatch",
    "parallel": "n_parallel",
    "keep": "n_keep",
    "file": "prompt_file",
    "jinja": "use_jinja",
    "stop": "antiprompt",
}
_FIELDS = frozenset(f.name for f in dataclasses.fields(CommonParams))


def common_params(args: argparse.Namespace) -> CommonParams:
    """The CommonParams of a parser built from this module's argument sets: the one place a
    namespace's shared flags are read (the sampling flags through to_sampling_params)."""
    kw: dict[str, Any] = {}
    for dest, value in vars(args).items():
        name = _FIELD_OF_DEST.get(dest, dest)
        if name in _FIELDS and name != "sampling":
            kw[name] = value
    if "antiprompt" in kw:
        kw["antiprompt"] = tuple(kw["antiprompt"])
    if "images" in kw:
        kw["images"] = tuple(kw["images"] or ())
    if "no_mem_check" in vars(args):
        kw["mem_check"] = not args.no_mem_check
    if "temp" in vars(args):  # the parser has the sampling group
        kw["sampling"] = to_sampling_params(args)
    return CommonParams(**kw)


def to_context_params(p: CommonParams, **overrides: object) -> ContextParams:
    """ContextParams of the shared flags; -np -1 (auto) gives AUTO_SLOTS sequences sharing a
    unified cache, as llama.cpp's server does."""
    from .context import ContextParams

    kw: dict[str, object] = dict(
        n_ctx=p.n_ctx,
        n_batch=p.n_batch,
        n_ubatch=min(p.n_ubatch, p.n_batch),
        n_seq_max=p.n_slots,
        type_k=p.cache_type_k,
        type_v=p.cache_type_v,
        kv_unified=p.unified_kv,
        check_memory=p.mem_check,
        decode_path=p.decode_path,
    )
    kw.update(overrides)
    return ContextParams(**kw)  # type: ignore[arg-type]


def init_params(
    p: CommonParams, n_threads: int | None, scheduler: SchedulerParams | None = None
) -> InitParams:
    """The InitParams (engine/init.py) of the shared flags, with the thread count in use."""
    from .init import InitParams

    return InitParams(
        to_context_params(p),
        n_threads=n_threads,
        n_gpu_layers=p.n_gpu_layers,
        device=p.device,
        scheduler=scheduler,
        mmproj=p.mmproj if p.mmproj_auto else None,  # --no-mmproj wins, as in llama.cpp
        image_min_tokens=p.image_min_tokens,
        image_max_tokens=p.image_max_tokens,
    )


def read_prompt(p: CommonParams) -> str | None:
    """The prompt from -p or -f (None when neither is given).

    Raises:
        EngineError: both were given, or the file cannot be read.
    """
    if p.prompt is not None and p.prompt_file is not None:
        raise EngineError("use either -p/--prompt or -f/--file, not both")
    if p.prompt_file is None:
        return p.prompt
    try:
        return Path(p.prompt_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise EngineError(f"cannot read prompt file '{p.prompt_file}': {e}") from None


def chat_template_override(p: CommonParams) -> str | None:
    """--chat-template (text or name) or the contents of --chat-template-file, or None.

    Raises:
        EngineError: both flags were given, or the file cannot be read.
    """
    text, path = p.chat_template, p.chat_template_file
    if text is not None and path is not None:
        raise EngineError("use either --chat-template or --chat-template-file, not both")
    if path is None:
        return text
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise EngineError(f"cannot read chat template file '{path}': {e}") from None


def _merge_bias(pairs) -> dict[int, float]:
    """Repeated -l flags for one token add up, like llama.cpp's logit_bias list."""
    out: dict[int, float] = {}
    for token, bias in pairs:
        out[token] = out.get(token, 0.0) + bias
    return out


@dataclass(frozen=True)
class ModelSource:
    """Where a command's model comes from: -m (a path or a starter model name) or the Hub's
    -hf/-hff/-hft (engine/hub/pull.py turns it into a path)."""

    model: str | None = None
    hf_repo: str | None = None
    hf_file: str | None = None
    hf_token: str | None = None
    n_ctx: int | None = None  # the context the Hub's fit estimate is made for (None: the default)


def model_source(args: argparse.Namespace | CommonParams, n_ctx: int | None = None) -> ModelSource:
    """The ModelSource of -m and the -hf flags (a namespace of a parser that has them, or the
    CommonParams made of one). LLAMA_ARG_HF_REPO stands for -hf when neither -m nor -hf is
    given, and LLAMA_ARG_HF_FILE for -hff with a repository (read here only).
    `n_ctx`: the context the Hub's fit estimate is made for (None: its default)."""
    repo = args.hf_repo
    if repo is None and not args.model:
        repo = os.environ.get("LLAMA_ARG_HF_REPO") or None
    hf_file = args.hf_file
    if repo is not None and not hf_file:
        hf_file = os.environ.get("LLAMA_ARG_HF_FILE") or None
    return ModelSource(args.model, repo, hf_file, args.hf_token, n_ctx or None)
