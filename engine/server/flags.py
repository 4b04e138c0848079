"""llama-server's command line: the server-only flags, the accepted-but-ignored ones, and
the LLAMA_ARG_* environment variables.

Shared flags (-m, -c, -b, -np, sampling...) come from engine/params.py. This module adds
the rest so that any llama-server command line parses: flags ggstation implements are
ordinary options; flags for features it does not have (GPU offload, LoRA, speculative
decoding, NUMA...) are recorded in `args.ignored` and logged; download flags other than
-hf/-hff/-hft (-mu, -dr...) are recorded in `args.refused` and make `serve` exit with a clear error.
"""

from __future__ import annotations

import argparse
import os

SERVER = "server-specific params"

# (option strings, nargs) of flags accepted and ignored. nargs: 0 flag, 1 value, "?" optional
# value, 2 two values.
IGNORED: list[tuple[str, int | str]] = [  # (options, nargs)
    ("-tb --threads-batch", 1),
    ("-C --cpu-mask", 1),
    ("-Cr --cpu-range", 1),
    ("--cpu-strict", 1),
    ("--prio", 1),
    ("--poll", 1),
    ("-Cb --cpu-mask-batch", 1),
    ("-Crb --cpu-range-batch", 1),
    ("--cpu-strict-batch", 1),
    ("--prio-batch", 1),
    ("--poll-batch", 1),
    ("--swa-full", 0),
    ("-fa --flash-attn", "?"),
    ("--perf --no-perf", 0),
    ("-e --escape --no-escape", 0),
    ("--rope-scaling", 1),
    ("--rope-scale", 1),
    ("--rope-freq-base", 1),
    ("--rope-freq-scale", 1),
    ("--yarn-orig-ctx", 1),
    ("--yarn-ext-factor", 1),
    ("--yarn-attn-factor", 1),
    ("--yarn-beta-slow", 1),
    ("--yarn-beta-fast", 1),
    ("-kvo --kv-offload -nkvo --no-kv-offload", 0),
    ("--repack -nr --no-repack", 0),
    ("--no-host", 0),
    ("-dt --defrag-thold", 1),
    ("--rpc", 1),
    ("--mlock", 0),
    ("--mmap --no-mmap", 0),
    ("-dio --direct-io -ndio --no-direct-io", 0),
    ("-lm --load-mode", 1),
    ("-lzm --lazy-mode", 1),
    ("--numa", 1),
    ("-ot --override-tensor", 1),
    ("-cmoe --cpu-moe", 0),
    ("-ncmoe --n-cpu-moe", 1),
    ("--moe-cache-mib", 1),
    ("-ncffn --n-cpu-ffn", 1),
    ("-ts --tensor-split", 1),
    ("-mg --main-gpu", 1),
    ("-fit --fit", "?"),
    ("-fitt --fit-target", 1),
    ("-fitc --fit-ctx", 1),
    ("--check-tensors", 0),
    ("--override-kv", 1),
    ("--op-offload --no-op-offload", 0),
    ("--lora", 1),
    ("--lora-scaled", 1),
    ("--control-vector", 1),
    ("--control-vector-scaled", 1),
    ("--control-vector-layer-range", 2),
    ("--log-disable", 0),
    ("--log-file", 1),
    ("--log-jsonl --no-log-jsonl", 0),
    ("--log-colors", "?"),
    ("--offline", 0),
    ("-lv --verbosity --log-verbosity", 1),
    ("--log-prefix --no-log-prefix", 0),
    ("--log-timestamps --no-log-timestamps", 0),
    ("-ctkd --cache-type-k-draft --spec-draft-type-k", 1),
    ("-ctvd --cache-type-v-draft --spec-draft-type-v", 1),
    ("--dry-multiplier", 1),
    ("--dry-base", 1),
    ("--dry-allowed-length", 1),
    ("--dry-penalty-last-n", 1),
    ("--dry-sequence-breaker", 1),
    ("--adaptive-target", 1),
    ("--adaptive-decay", 1),
    ("--mirostat", 1),
    ("--mirostat-lr", 1),
    ("--mirostat-ent", 1),
    ("--grammar", 1),
    ("--grammar-file", 1),
    ("-j --json-schema", 1),
    ("-jf --json-schema-file", 1),
    ("-bs --backend-sampling", 0),
    ("-lcs --lookup-cache-static", 1),
    ("-lcd --lookup-cache-dynamic", 1),
    ("--kv-unified-per-slot", 1),
    ("-ctxcp --ctx-checkpoints --swa-checkpoints", 1),
    ("-cms --checkpoint-min-step", 1),
    ("-cram --cache-ram", 1),
    ("--cache-idle-slots --no-cache-idle-slots", 0),
    ("-r --reverse-prompt", 1),
    ("-sp --special", 0),
    ("--warmup --no-warmup", 0),
    ("--spm-infill", 0),
    ("-cb --cont-batching -nocb --no-cont-batching", 0),
    ("-mmdev --mmproj-device", 1),
    ("--reuse-port", 0),
    ("--path", 1),
    ("--tools", 1),
    ("--tools-runtime", 1),
    ("--mcp-servers-config", 1),
    ("--mcp-servers-json", 1),
    ("-ag --agent -no-ag --no-agent", 0),
    ("--ui-config --webui-config", 1),
    ("--ui-config-file --webui-config-file", 1),
    ("--ui --webui --no-ui --no-webui", 0),
    ("--rerank --reranking", 0),
    ("--ssl-key-file", 1),
    ("--ssl-cert-file", 1),
    ("--sse-ping-interval", 1),
    ("--threads-http", 1),
    ("-to --timeout", 1),
    ("--cache-reuse", 1),
    ("--reasoning-format", 1),
    ("--reasoning-budget", 1),
    ("--reasoning-budget-message", 1),
    ("--skip-chat-parsing --no-skip-chat-parsing", 0),
    ("--lora-init-without-apply", 0),
    ("--log-prompts-dir", 1),
    ("-md --model-draft --spec-draft-model", 1),
    ("-td --threads-draft", 1),
    ("-tbd --threads-batch-draft", 1),
    ("--draft --draft-n --draft-max", 1),
    ("--draft-min --draft-n-min", 1),
    ("--draft-p-min", 1),
    ("-cd --ctx-size-draft", 1),
    ("-devd --device-draft", 1),
    ("-ngld --gpu-layers-draft --n-gpu-layers-draft", 1),
    ("--spec-replace", 2),
    ("--spec-type", 1),
    ("-mv --model-vocoder", 1),
    ("--tts-use-guide-tokens", 0),
    ("--spec-draft-n-max", 1),
    ("--spec-draft-n-min", 1),
    ("--spec-default", 0),
    ("-cl --cache-list", 0),
    ("--completion-bash", 0),
]

# Flags that would download something other than a Hugging Face GGUF (-hf/-hff/-hft are
# engine/params.py's): refused with a clear message.
REFUSED = [
    ("-mu --model-url", "LLAMA_ARG_MODEL_URL"),
    ("-dr --docker-repo", "LLAMA_ARG_DOCKER_REPO"),
    ("-hfd -hfrd --hf-repo-draft", None),
    ("-mmu --mmproj-url", "LLAMA_ARG_MMPROJ_URL"),
]
# llama-server presets that download a model (no value)
REFUSED_PRESETS = (
    "--embd-gemma-default --fim-qwen-1.5b-default --fim-qwen-3b-default --fim-qwen-7b-default "
    "--fim-qwen-7b-spec --fim-qwen-14b-spec --fim-qwen-30b-default --gpt-oss-20b-default "
    "--gpt-oss-120b-default --vision-gemma-4b-default --vision-gemma-12b-default"
)

# environment variable -> option string, for every flag ggstation implements
ENV = {
    "LLAMA_ARG_MODEL": "--model",
    "LLAMA_ARG_HF_REPO": "--hf-repo",
    "LLAMA_ARG_HF_FILE": "--hf-file",
    "LLAMA_ARG_MMPROJ": "--mmproj",
    "LLAMA_ARG_THREADS": "--threads",
    "LLAMA_ARG_CTX_SIZE": "--ctx-size",
    "LLAMA_ARG_N_PREDICT": "--n-predict",
    "LLAMA_ARG_BATCH": "--batch-size",
    "LLAMA_ARG_UBATCH": "--ubatch-size",
    "LLAMA_ARG_N_PARALLEL": "--parallel",
    "LLAMA_ARG_KV_UNIFIED": "--kv-unified",
    "LLAMA_ARG_CACHE_TYPE_K": "--cache-type-k",
    "LLAMA_ARG_CACHE_TYPE_V": "--cache-type-v",
    "LLAMA_ARG_CONTEXT_SHIFT": "--context-shift",
    "LLAMA_ARG_TEMPERATURE": "--temp",
    "LLAMA_ARG_TOP_K": "--top-k",
    "LLAMA_ARG_TOP_P": "--top-p",
    "LLAMA_ARG_MIN_P": "--min-p",
    "LLAMA_ARG_REPEAT_PENALTY": "--repeat-penalty",
    "LLAMA_ARG_PRESENCE_PENALTY": "--presence-penalty",
    "LLAMA_ARG_FREQUENCY_PENALTY": "--frequency-penalty",
    "LLAMA_ARG_CHAT_TEMPLATE": "--chat-template",
    "LLAMA_ARG_CHAT_TEMPLATE_FILE": "--chat-template-file",
    "LLAMA_ARG_JINJA": "--jinja",
    "LLAMA_ARG_HOST": "--host",
    "LLAMA_ARG_PORT": "--port",
    "LLAMA_API_KEY": "--api-key",
    "LLAMA_ARG_API_KEY_FILE": "--api-key-file",
    "LLAMA_ARG_ALIAS": "--alias",
    "LLAMA_ARG_ENDPOINT_METRICS": "--metrics",
    "LLAMA_ARG_ENDPOINT_SLOTS": "--slots",
    "LLAMA_ARG_ENDPOINT_PROPS": "--props",
    "LLAMA_ARG_EMBEDDINGS": "--embeddings",
    "LLAMA_ARG_POOLING": "--pooling",
    "LLAMA_ARG_CACHE_PROMPT": "--cache-prompt",
    "LLAMA_ARG_CORS_ORIGINS": "--cors-origins",
    "LLAMA_ARG_API_PREFIX": "--api-prefix",
    "LLAMA_ARG_CORS_METHODS": "--cors-methods",
    "LLAMA_ARG_CORS_HEADERS": "--cors-headers",
    "LLAMA_ARG_CORS_CREDENTIALS": "--cors-credentials",
    "LLAMA_ARG_UI_MCP_PROXY": "--ui-mcp-proxy",
    "LLAMA_ARG_TAGS": "--tags",
    "LLAMA_ARG_N_GPU_LAYERS": "--n-gpu-layers",
    "LLAMA_ARG_DEVICE": "--device",
    "LLAMA_ARG_SPLIT_MODE": "--split-mode",
    "LLAMA_ARG_CHAT_TEMPLATE_KWARGS": "--chat-template-kwargs",
    "LLAMA_ARG_MODELS_DIR": "--models-dir",
    "LLAMA_ARG_MODELS_PRESET": "--models-preset",
    "LLAMA_ARG_MODELS_MAX": "--models-max",
    "LLAMA_ARG_MODELS_AUTOLOAD": "--models-autoload",
    "LLAMA_ARG_REASONING": "--reasoning",
    "LLAMA_ARG_REASONING_EFFORT": "--reasoning-effort",
    "LLAMA_ARG_REASONING_PRESERVE": "--reasoning-preserve",
    "LLAMA_ARG_PREFILL_ASSISTANT": "--prefill-assistant",
}

# environment variables of ignored flags (reported as ignored when set)
IGNORED_ENV = (
    "LLAMA_ARG_FLASH_ATTN",
    "LLAMA_ARG_TENSOR_SPLIT",
    "LLAMA_ARG_MAIN_GPU",
    "LLAMA_ARG_NUMA",
    "LLAMA_ARG_CONT_BATCHING",
    "LLAMA_ARG_ROPE_SCALING_TYPE",
    "LLAMA_ARG_ROPE_SCALE",
    "LLAMA_ARG_ROPE_FREQ_BASE",
    "LLAMA_ARG_ROPE_FREQ_SCALE",
    "LLAMA_ARG_KV_OFFLOAD",
    "LLAMA_ARG_DEFRAG_THOLD",
    "LLAMA_ARG_TIMEOUT",
    "LLAMA_ARG_THREADS_HTTP",
    "LLAMA_ARG_SWA_FULL",
    "LLAMA_ARG_CACHE_REUSE",
    "LLAMA_ARG_NO_MMAP",
    "LLAMA_ARG_MLOCK",
    "LLAMA_ARG_SSL_KEY_FILE",
    "LLAMA_ARG_SSL_CERT_FILE",
    "LLAMA_ARG_WEBUI",
    "LLAMA_ARG_REUSE_PORT",
    "LLAMA_ARG_STATIC_PATH",
    "LLAMA_ARG_THINK",
    "LLAMA_ARG_RERANKING",
)

_TRUE = {"1", "true", "on", "enabled", "yes"}
_FALSE = {"0", "false", "off", "disabled", "no"}


def _on_off_auto(value: str) -> str:
    """llama.cpp's truthy/falsy spellings of on/off (anything else is left for `choices`)."""
    v = value.strip().lower()
    return "on" if v in _TRUE else "off" if v in _FALSE else v


def _directory(value: str) -> str:
    if not os.path.isdir(value):
        raise argparse.ArgumentTypeError(f"not a directory: {value}")
    return value


def _sleep_seconds(value: str) -> float:
    """--sleep-idle-seconds: -1 (never) or a positive number of seconds. llama-server's is an
    int (std::stoi, which reads "1.5" as 1); fractions are accepted here, a superset, so its
    command lines keep working. llama-server's words for 0 and below -1."""
    import math

    try:
        n = float(value)
    except ValueError:
        n = math.nan
    if not math.isfinite(n):
        raise argparse.ArgumentTypeError(
            f"invalid value {value!r}: not a number of seconds (-1 disables sleeping)"
        )
    if n != -1 and n <= 0:
        raise argparse.ArgumentTypeError("invalid value: cannot be 0 or less than -1")
    return int(n) if n.is_integer() else n


class IgnoredFlag(argparse.Action):
    """Accept a llama-server flag ggstation has no use for; remember it for a warning."""

    def __call__(self, parser, namespace, values, option_string=None):
        ignored = list(getattr(namespace, "ignored", None) or [])
        ignored.append(option_string)
        namespace.ignored = ignored


class RefusedFlag(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        refused = list(getattr(namespace, "refused", None) or [])
        refused.append(option_string)
        namespace.refused = refused


def _has(parser: argparse.ArgumentParser, option: str) -> bool:
    return option in parser._option_string_actions


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """The flags llama-server adds on top of engine/params.py's shared ones."""
    g = parser.add_argument_group(SERVER)
    g.add_argument(
        "--host",
        default="127.0.0.1",
        help="IP address to listen on (default: 127.0.0.1; 0.0.0.0 = every interface)",
    )
    g.add_argument(
        "--port",
        type=int,
        default=8080,
        help="port to listen on (default: 8080; 0 = any free port)",
    )
    g.add_argument(
        "--api-key",
        dest="api_key",
        action="append",
        default=[],
        metavar="KEY",
        help="API key clients must send; repeatable or comma-separated (default: none)",
    )
    g.add_argument(
        "--api-key-file",
        metavar="FNAME",
        default=None,
        help="file with API keys, one per line; lines starting with # are comments",
    )
    g.add_argument(
        "-a",
        "--alias",
        default=None,
        help="comma-separated model names for the API; the first in sorted order is its id "
        "(default: the file name)",
    )
    g.add_argument("--metrics", action="store_true", help="enable the Prometheus /metrics endpoint")
    g.add_argument(
        "--slots",
        dest="slots",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="expose the /slots monitoring endpoint (default: enabled)",
    )
    g.add_argument(
        "--props", action="store_true", help="allow changing global properties via POST /props"
    )
    g.add_argument(
        "--prefill-assistant",
        dest="prefill_assistant",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="continue a chat's last message when it is the assistant's "
        "(default: enabled; --no-prefill-assistant takes it as a whole message)",
    )
    g.add_argument(
        "--embedding",
        "--embeddings",
        dest="embedding",
        action="store_true",
        help="enable the embedding endpoints",
    )
    g.add_argument(
        "--pooling",
        choices=("none", "mean", "cls", "last", "rank"),
        default=None,
        help="pooling type for embeddings (default: the model's, else mean)",
    )
    g.add_argument(
        "--embd-normalize",
        type=int,
        default=2,
        help="embedding normalisation: -1 none, 0 max-abs int16, 1 taxicab, 2 euclidean (default), "
        ">2 p-norm",
    )
    g.add_argument(
        "--cache-prompt",
        dest="cache_prompt",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse the KV cache of a previous request's common prefix (default: enabled)",
    )
    g.add_argument(
        "-sps",
        "--slot-prompt-similarity",
        type=float,
        default=0.1,
        help="how much a prompt must match a slot's cache to reuse that slot (default: 0.10)",
    )
    g.add_argument(
        "--cors-origins",
        default=None,
        metavar="ORIGINS",
        help="comma-separated allowed CORS origins; 'localhost' allows local pages only "
        "(default: *, or localhost with --tools / MCP servers)",
    )
    g.add_argument(
        "--cors-methods",
        default="GET, POST, DELETE, OPTIONS",
        metavar="METHODS",
        help="allowed CORS methods (default: GET, POST, DELETE, OPTIONS)",
    )
    g.add_argument(
        "--cors-headers", default="*", metavar="HEADERS", help="allowed CORS headers (default: *)"
    )
    g.add_argument(
        "--cors-credentials",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="allow CORS credentials; with origins '*' the request's Origin is echoed (default: enabled)",
    )
    g.add_argument(
        "--ui-mcp-proxy",
        "--webui-mcp-proxy",
        dest="ui_mcp_proxy",
        action="store_true",
        help="enable /cors-proxy, which forwards the web UI's MCP requests; only in trusted "
        "environments (default: disabled)",
    )
    g.add_argument(
        "--no-ui-mcp-proxy",
        "--no-webui-mcp-proxy",
        dest="ui_mcp_proxy",
        action="store_false",
        help=argparse.SUPPRESS,
    )
    g.add_argument(
        "--tags",
        default=None,
        metavar="TAGS",
        help="comma-separated model tags shown in /v1/models",
    )
    g.add_argument(
        "--api-prefix", default="", metavar="PREFIX", help="path prefix the server serves from"
    )
    g.add_argument(
        "--chat-template-kwargs",
        default=None,
        metavar="JSON",
        help="extra variables for the chat template, a JSON object",
    )
    g.add_argument(
        "-rea",
        "--reasoning",
        choices=("on", "off", "auto"),
        default="auto",
        type=_on_off_auto,
        help="thinking in the chat template: on, off, or auto (default: auto, on when the "
        "template has a thinking switch); sets its enable_thinking",
    )
    g.add_argument(
        "--reasoning-effort",
        default="default",
        metavar="LEVEL",
        help="reasoning effort given to the chat template (minimal, low, medium, high...; "
        "default: the template's own)",
    )
    g.add_argument(
        "--reasoning-preserve",
        dest="reasoning_preserve",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep earlier turns' reasoning in the prompt, for templates that can "
        "drop it (default: enabled)",
    )
    g.add_argument(
        "--slot-save-path",
        default=None,
        metavar="PATH",
        help="directory for slot files: POST /slots/{id}?action=save|restore (default: disabled)",
    )
    g.add_argument(
        "--media-path",
        type=_directory,
        default=None,
        metavar="PATH",
        help="directory for loading local media files; files can be accessed via file:// URLs "
        "using relative paths (default: disabled)",
    )
    g.add_argument(
        "--sleep-idle-seconds",
        type=_sleep_seconds,
        default=-1,
        metavar="SECONDS",
        help="unload the model after this many idle seconds (fractions allowed), reload it on "
        "the next request (default: -1, disabled)",
    )
    g.add_argument(
        "--max-body-mib",
        type=float,
        default=8.0,
        help="ggstation: largest accepted request body in MiB (default: 8)",
    )
    g.add_argument(
        "--models-dir",
        default=None,
        metavar="PATH",
        help="router mode (no -m): directory of .gguf models to serve (default: the model cache)",
    )
    g.add_argument(
        "--models-preset",
        default=None,
        metavar="PATH",
        help="router mode: INI file of model presets (sections of serve flags; [*] for all); "
        "re-read by GET /models?reload=1",
    )
    g.add_argument(
        "--models-max",
        type=int,
        default=4,
        metavar="N",
        help="router mode: most models loaded at once (default: 4, 0 = unlimited)",
    )
    g.add_argument(
        "--models-autoload",
        dest="models_autoload",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="router mode: load a model on its first request (default: enabled)",
    )
    g.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="serve the models from a Ray Serve application (needs the `cluster` extra): on the "
        "cluster at ADDRESS (host:port of `ray start --head`, or ray://host:port), or on a "
        "local Ray instance started for it when ADDRESS is omitted",
    )
    g.add_argument("--ready-json", action="store_true", help=argparse.SUPPRESS)
    for opts, nargs in IGNORED:
        names = [o for o in opts.split() if not _has(parser, o)]
        if names:
            g.add_argument(
                *names,
                action=IgnoredFlag,
                nargs=nargs,
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )
    for opts, nargs in [(o, 1) for o, _ in REFUSED] + [(REFUSED_PRESETS, 0)]:
        names = [o for o in opts.split() if not _has(parser, o)]
        if names:
            g.add_argument(
                *names,
                action=RefusedFlag,
                nargs=nargs,
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )
    g.add_argument(
        "--version", action="version", version="ggstation serve (llama-server compatible)"
    )


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    """Every `serve` flag: engine/params.py's shared ones (-np defaults to -1, auto, as in
    llama-server) and this module's; LLAMA_ARG_* variables become defaults (env_argv), so a
    flag on the command line still wins, and a bad one is kept in `env_error`."""
    from .. import params

    params.add_model_args(parser)
    params.add_mmproj_args(parser, images=False)
    params.add_context_args(parser)
    params.add_generation_args(parser, prompt=False)
    params.add_sampling_args(parser)
    params.add_chat_args(parser)
    params.add_gpu_args(parser)
    add_server_args(parser)
    params.add_mem_check_arg(parser)
    params.add_int8_arg(parser)
    parser.set_defaults(
        parallel=-1, ignored=[], refused=[], env_error=None, accepts_unknown_flags=True
    )
    _apply_env_defaults(parser)


def _apply_env_defaults(p: argparse.ArgumentParser) -> None:
    """LLAMA_ARG_* variables become defaults, so flags on the command line still win."""
    import contextlib
    import io

    extra = env_argv(p, [])
    if not extra:
        return
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            base, from_env = p.parse_args([]), p.parse_args(extra)
    except SystemExit:
        p.set_defaults(
            env_error=f"invalid LLAMA_ARG_* environment variable: {err.getvalue().strip()}"
        )
        return
    changed = {k: v for k, v in vars(from_env).items() if vars(base).get(k) != v}
    p.set_defaults(**changed)


def serve_parser() -> argparse.ArgumentParser:
    """A fresh parser of `serve`'s flags: a Ray deployment and the router read its options
    table and defaults, and parse a model's command line with it (parse_serve_args)."""
    parser = argparse.ArgumentParser(prog="ggstation serve")
    add_serve_args(parser)
    return parser


def parse_serve_args(argv: list[str]) -> argparse.Namespace:
    """`serve` flags parsed as the CLI parses them (unknown flags kept in `unknown_flags`)."""
    args, unknown = serve_parser().parse_known_args(argv)
    args.unknown_flags = unknown
    return args


def env_argv(parser: argparse.ArgumentParser, argv: list[str], environ=os.environ) -> list[str]:
    """Options to put BEFORE argv for every LLAMA_ARG_* variable whose flag argv lacks."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("-")}
    out: list[str] = []
    for env, option in ENV.items():
        value = environ.get(env)
        if value is None or option not in parser._option_string_actions:
            continue
        action = parser._option_string_actions[option]
        if given & set(action.option_strings):
            continue
        if action.nargs == 0:  # store_true / BooleanOptionalAction
            v = value.strip().lower()
            if v in _TRUE:
                out.append(option)
            elif v in _FALSE and isinstance(action, argparse.BooleanOptionalAction):
                out.append("--no-" + option[2:])
        elif isinstance(action, argparse._AppendAction):
            for part in value.split(","):
                out.append(f"{option}={part}")
        else:
            out.append(f"{option}={value}")  # "=": a value starting with "-" is not a flag
    for opts, refused_env in REFUSED:  # each refused variable as its own (refused) flag
        option = opts.split()[-1]
        if refused_env and environ.get(refused_env) and option in parser._option_string_actions:
            out += [option, environ[refused_env]]
    return out


def ignored_env(environ=os.environ) -> list[str]:
    return [e for e in IGNORED_ENV if environ.get(e)]


# flags that enable server tools or MCP servers: llama-server then limits CORS to localhost
_AGENT_FLAGS = ("--tools", "--mcp-servers-config", "--mcp-servers-json", "-ag", "--agent")


def cors_origins(args: argparse.Namespace) -> tuple[str, ...]:
    """--cors-origins as a tuple; when not given, '*', or 'localhost' if tools or MCP servers
    are on (they can act on this machine, so other sites' pages must not reach them)."""
    if args.cors_origins is not None:
        return tuple(o.strip() for o in args.cors_origins.split(",") if o.strip())
    # --tools and the MCP flags are accepted and ignored (IGNORED): they are in args.ignored
    return ("localhost",) if set(args.ignored) & set(_AGENT_FLAGS) else ("*",)
