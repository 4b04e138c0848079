"""The router's model catalogue: which models a router serves, and the flags each child gets.

Sources, after llama.cpp's common/preset.cpp and server-models.cpp `load_models`:

1. the Hugging Face cache: every complete GGUF, named as llama-server names it ("user/repo:Q4_K_M");
2. `--models-dir`: every `*.gguf` (named after the file, without `.gguf`) and every
   sub-directory holding one model (named after the directory; the first shard of a split
   model; `mmproj*` files and draft sidecars are companions, not models);
3. `--models-preset`: an INI file. Each `[section]` is a model (or adds options to a model of
   the other sources with the same name); keys are `serve` flags without dashes (long or short
   form) or their `LLAMA_ARG_*` variable; `[*]` holds options for every model.

Options per model, lowest to highest priority: the source (the model file), `[*]`, the model's
own section, then the router's own command line. A catalogue is plain data (`ModelSpec`), so a
reload compares old and new specs to decide which running children must restart.
"""

from __future__ import annotations

import argparse
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PresetError

log = logging.getLogger(__name__)


GLOBAL_SECTION = "*"
DEFAULT_SECTION = "default"  # keys before the first [section]
DEFAULT_STOP_TIMEOUT_S = 10
# keys that are not flags: they steer the router itself
PRESET_ONLY = {
    "load-on-startup",
    "stop-timeout",
    "dedup-cache-models",
    # `serve --ray` (engine/cluster): the model's file digest and its replicas
    "sha256",
    "min-replicas",
    "max-replicas",
    "target-ongoing-requests",
    "upscale-delay-s",
    "downscale-delay-s",
}
CLUSTER_KEYS = PRESET_ONLY - {"load-on-startup", "stop-timeout", "dedup-cache-models"}
# flags the router decides for every child (listening address, keys, router-mode options):
# dropped from presets and from the router's command line before they reach a child
RESERVED_DESTS = {
    "host",
    "port",
    "alias",
    "api_key",
    "api_key_file",
    "models_dir",
    "models_max",
    "models_preset",
    "models_autoload",
    "ready_json",
    "ssl_key_file",
    "ssl_cert_file",
    "ray",
}
# model sources are replaced (a preset's `model = ...` wins over a directory's file) but never
# taken from the router's command line (a router has no -m)
MODEL_DESTS = {"model", "hf_repo", "hf_file"}
_TRUE = {"1", "true", "on", "enabled", "yes"}
_FALSE = {"0", "false", "off", "disabled", "no"}
_DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")
_SHARD = re.compile(r"-00001-of-\d+\.gguf$")
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


@dataclass(frozen=True)
class ModelSpec:
    """One model the router can start: its name, where it comes from and its child's flags."""

    name: str
    source: str  # "preset", "models_dir" or "cache", as llama-server's /models reports it
    path: str  # the model file, "" when it comes from a preset's hf-repo
    options: tuple[tuple[str, str], ...]  # (option string, value) in rendering order
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    load_on_startup: bool = False
    stop_timeout: int = DEFAULT_STOP_TIMEOUT_S
    hidden: bool = False  # deduplicated from GET /models, still routable
    preset_ini: str = ""  # the model's effective options as INI, for GET /models
    cluster: tuple[tuple[str, str], ...] = ()  # `serve --ray` keys (sha256, replicas...), as given

    def args(self) -> list[str]:
        """The child's flags (before the router adds host, port, alias)."""
        out: list[str] = []
        for option, value in self.options:
            out.append(option)
            if value != "":
                out.append(value)
        return out


@dataclass
class OptionTable:
    """Preset keys -> `serve` options, built from the serve parser itself so that every flag
    `serve` knows is a preset key too."""

    keys: dict[str, tuple[str, bool]] = field(default_factory=dict)  # key -> (dest, negated)
    actions: dict[str, list[argparse.Action]] = field(default_factory=dict)  # dest -> actions

    @classmethod
    def from_parser(
        cls, parser: argparse.ArgumentParser, env: dict[str, str] | None = None
    ) -> OptionTable:
        table = cls()
        for action in parser._actions:
            if not action.option_strings or action.dest in (argparse.SUPPRESS, "help"):
                continue
            table.actions.setdefault(action.dest, []).append(action)
            for opt in action.option_strings:
                negated = opt.startswith("--no-") and isinstance(
                    action, argparse.BooleanOptionalAction
                )
                negated = negated or isinstance(action, argparse._StoreFalseAction)
                table.keys.setdefault(opt.lstrip("-"), (action.dest, negated))
        for name, opt in (env or {}).items():
            found = parser._option_string_actions.get(opt)
            if found is not None:
                table.keys.setdefault(name, (found.dest, False))
        return table

    def lookup(self, key: str, value: str) -> tuple[str, str] | None:
        """(dest, value) for a preset key, a negated flag's value flipped; None if unknown."""
        hit = self.keys.get(key)
        if hit is None:
            return None
        dest, negated = hit
        if negated:
            value = "false" if is_truthy(value) else "true"
        return dest, value

    def render(self, dest: str, value: str) -> list[tuple[str, str]]:
        """The (option, value) pairs that set `dest` to `value` ("" value: a bare flag)."""
        actions = self.actions.get(dest, [])
        valued = [a for a in actions if a.nargs != 0]
        if valued:
            return [(_long(valued[0]), value)]
        if is_truthy(value):
            for a in actions:
                if isinstance(a, argparse.BooleanOptionalAction):
                    return [(_long(a, positive=True), "")]
                if not isinstance(a, argparse._StoreFalseAction):
                    return [(_long(a), "")]
        elif is_falsey(value):
            for a in actions:
                if isinstance(a, argparse.BooleanOptionalAction):
                    return [("--no-" + _long(a, positive=True)[2:], "")]
                if isinstance(a, argparse._StoreFalseAction):
                    return [(_long(a), "")]
        return []


def _long(action: argparse.Action, positive: bool = False) -> str:
    opts = [o for o in action.option_strings if not (positive and o.startswith("--no-"))]
    longs = [o for o in opts if o.startswith("--")]
    return (longs or opts)[0]


def is_truthy(value: str) -> bool:
    return value.strip().lower() in _TRUE


def is_falsey(value: str) -> bool:
    return value.strip().lower() in _FALSE


# -- INI ---------------------------------------------------------------------------------------


def parse_ini(text: str, where: str = "preset") -> dict[str, dict[str, str]]:
    """llama.cpp's preset INI: `[section]` headers, `key = value` lines, `;`/`#` comments (also
    after a value, when whitespace precedes them), keys before any header in "default".

    Raises:
        PresetError: a line that is none of these, with its number.
    """
    sections: dict[str, dict[str, str]] = {}
    current = DEFAULT_SECTION
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("["):
            m = re.fullmatch(r"\[\s*([^\]]+?)\s*\](?:\s*[;#].*)?", line)
            if not m:
                raise PresetError(f"{where}: line {n}: malformed section header: {raw.strip()!r}")
            current = _canonical_section(m.group(1))
            sections[current] = {}
            continue
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_.-]*)\s*=\s*(.*)", line)
        if not m:
            raise PresetError(f"{where}: line {n}: expected 'key = value': {raw.strip()!r}")
        value = re.split(r"\s+[;#]", m.group(2), maxsplit=1)[0].strip()
        sections.setdefault(current, {})[m.group(1)] = value
    return sections


def _canonical_section(name: str) -> str:
    """ "user/repo:q4_k_m" -> "user/repo:Q4_K_M" (and "...:Model-Q8_0" -> "...:Q8_0"), as the
    cache names its models."""
    if name in (GLOBAL_SECTION, DEFAULT_SECTION) or ":" not in name:
        return name
    head, tag = name.rsplit(":", 1)
    m = _TAG.search(tag)
    return f"{head}:{(m.group(1) if m else tag).upper()}"


# -- sources -----------------------------------------------------------------------------------


def scan_models_dir(directory: Path) -> dict[str, Path]:
    """name -> model file for --models-dir (see the module docstring).

    Raises:
        PresetError: the directory does not exist.
    """
    if not directory.is_dir():
        raise PresetError(f"--models-dir '{directory}' does not exist or is not a directory")
    out: dict[str, Path] = {}
    for entry in sorted(directory.iterdir()):
        if entry.is_dir():
            model = _model_in_subdir(entry)
            if model is not None:
                out[entry.name] = model
        elif entry.name.endswith(".gguf") and not _is_companion(entry.name) and entry.is_file():
            out[entry.name[: -len(".gguf")]] = entry
    return out


def _is_companion(name: str) -> bool:
    return "mmproj" in name or name.startswith(_DRAFT_PREFIXES)


def _model_in_subdir(d: Path) -> Path | None:
    files = sorted(p for p in d.iterdir() if p.name.endswith(".gguf") and p.is_file())
    shards = [p for p in files if _SHARD.search(p.name)]
    models = [p for p in files if not _is_companion(p.name) and "-of-" not in p.name]
    found = shards or models
    return found[0] if found else None


# -- the catalogue -----------------------------------------------------------------------------


@dataclass
class Catalogue:
    """Builds the router's `ModelSpec`s from its sources; called again on every reload.

    Args:
        table: preset keys -> serve options (`OptionTable.from_parser`).
        base: the router's own command line, as (dest, value) pairs; wins over presets.
        models_dir: --models-dir, or None.
        preset_file: --models-preset, or None.
        cache: returns the Hugging Face cache's models (name -> file); None for no cache.
    """

    table: OptionTable
    base: list[tuple[str, str]] = field(default_factory=list)
    models_dir: Path | None = None
    preset_file: Path | None = None
    cache: object = None  # Callable[[], dict[str, Path]] | None

    def build(self) -> dict[str, ModelSpec]:
        """Every model, by name.

        Raises:
            PresetError: a missing --models-dir, an unreadable or malformed preset file, or a
                name or alias used twice.
        """
        cached = dict(self.cache()) if callable(self.cache) else {}
        local = scan_models_dir(self.models_dir) if self.models_dir is not None else {}
        sections = self._read_presets()
        glob = sections.pop(GLOBAL_SECTION, {})
        if not sections.get(DEFAULT_SECTION, True):
            sections.pop(DEFAULT_SECTION)

        sources: dict[str, tuple[str, str]] = {n: ("cache", str(p)) for n, p in cached.items()}
        sources.update({n: ("models_dir", str(p)) for n, p in local.items()})
        names = list(dict.fromkeys([*cached, *local, *sections]))
        hidden = self._deduplicated(sections, glob, cached)
        specs: dict[str, ModelSpec] = {}
        owners: dict[str, str] = {}
        for name in names:
            source, path = sources.get(name, ("preset", ""))
            if name in sections:
                source = "preset"
            spec = self._spec(name, source, path, glob, sections.get(name))
            spec = ModelSpec(**{**spec.__dict__, "hidden": name in hidden})
            for alias in (name, *spec.aliases):
                if alias in owners and owners[alias] != name:
                    raise PresetError(
                        f"model name or alias '{alias}' is used by both '{owners[alias]}' and '{name}'"
                    )
                owners[alias] = name
            specs[name] = spec
        return specs

    def _read_presets(self) -> dict[str, dict[str, str]]:
        if self.preset_file is None:
            return {}
        try:
            text = self.preset_file.read_text(encoding="utf-8")
        except OSError as e:
            raise PresetError(
                f"cannot read --models-preset '{self.preset_file}': {e.strerror or e}"
            ) from None
        sections = parse_ini(text, str(self.preset_file))
        for values in sections.values():
            values.pop("version", None)
        return sections

    def _spec(
        self,
        name: str,
        source: str,
        path: str,
        glob: dict[str, str],
        section: dict[str, str] | None,
    ) -> ModelSpec:
        opts: dict[str, str] = {}  # dest -> value, in insertion order
        extra: dict[str, str] = {}  # preset-only keys
        if path:
            opts["model"] = path
        for where, values in (("[*]", glob), (f"[{name}]", section or {})):
            for key, value in values.items():
                if key in PRESET_ONLY:
                    extra[key] = value
                    continue
                hit = self.table.lookup(key, value)
                if hit is None:
                    log.warning("preset %s: ignoring unknown option '%s'", where, key)
                    continue
                dest, value = hit
                if (
                    dest in MODEL_DESTS
                    and section is not None
                    and where != "[*]"
                    and dest != "hf_file"
                ):
                    for other in MODEL_DESTS - {
                        "hf_file"
                    }:  # the section's own model replaces the source's
                        opts.pop(other, None)
                if dest not in RESERVED_DESTS or dest == "alias":
                    opts[dest] = value
        aliases = _split(opts.pop("alias", ""))
        tags = _split(opts.pop("tags", ""))
        for dest, value in self.base:
            if dest not in RESERVED_DESTS and dest not in MODEL_DESTS:
                opts[dest] = value
        rendered = tuple(
            pair for dest, value in opts.items() for pair in self.table.render(dest, value)
        )
        lines = sorted(f"{o.lstrip('-')} = {v or 'true'}" for o, v in rendered)
        preset_ini = (
            "\n".join([f"[{name}]", *lines]) + "\n\n"
        )  # GET /models shows it, as llama-server
        try:
            stop_timeout = int(extra.get("stop-timeout", DEFAULT_STOP_TIMEOUT_S))
        except ValueError:
            log.warning(
                "preset [%s]: invalid stop-timeout %r, using %d s",
                name,
                extra["stop-timeout"],
                DEFAULT_STOP_TIMEOUT_S,
            )
            stop_timeout = DEFAULT_STOP_TIMEOUT_S
        return ModelSpec(
            name=name,
            source=source,
            path=opts.get("model", path),
            options=rendered,
            aliases=tuple(a for a in aliases if a != name),
            tags=tuple(tags),
            load_on_startup=is_truthy(extra.get("load-on-startup", "")),
            stop_timeout=stop_timeout,
            preset_ini=preset_ini,
            cluster=tuple((k, v) for k, v in extra.items() if k in CLUSTER_KEYS),
        )

    def _deduplicated(
        self, sections: dict[str, dict[str, str]], glob: dict[str, str], cached: dict[str, Path]
    ) -> set[str]:
        """Cache entries a preset with dedup-cache-models already serves (by hf-repo or draft)."""
        repos: set[str] = set()
        for values in sections.values():
            merged = {**glob, **values}
            if not is_truthy(merged.get("dedup-cache-models", "")):
                continue
            for key, value in values.items():
                hit = self.table.lookup(key, value)
                if (hit and hit[0] == "hf_repo") or key in (
                    "spec-draft-hf",
                    "hf-repo-draft",
                    "hfd",
                    "hfrd",
                ):
                    repos.add(value)
        hidden = set()
        for name in cached:
            repo = name.split(":", 1)[0]
            if (
                name in repos
                or repo in repos
                or any(_canonical_section(r) == name for r in repos if ":" in r)
            ):
                hidden.add(name)
        return hidden


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def explicit_options(
    parser: argparse.ArgumentParser, args: argparse.Namespace, table: OptionTable
) -> list[tuple[str, str]]:
    """The router's command-line options that differ from the defaults, as (dest, value)
    preset pairs: what every child inherits (llama-server passes its own flags on)."""
    defaults = vars(parser.parse_args([]))
    out: list[tuple[str, str]] = []
    for dest, value in vars(args).items():
        if dest not in table.actions or dest in RESERVED_DESTS or value == defaults.get(dest, None):
            continue
        if value is None:
            continue
        if isinstance(value, bool):
            out.append((dest, "true" if value else "false"))
        elif isinstance(value, (list, tuple)):
            out.append((dest, ",".join(str(v) for v in value)))
        else:
            out.append((dest, str(value)))
    return out


def router_catalogue(
    parser: argparse.ArgumentParser, args: argparse.Namespace, env: dict[str, str] | None = None
) -> Catalogue:
    """The catalogue `ggstation serve` (no -m) serves: the Hugging Face cache, --models-dir
    (else ggstation's own models directory, when it exists) and --models-preset; every child
    inherits the router's own command-line options."""
    from ..hub.store import models_dir
    from .hub_access import discover_hub_models

    table = OptionTable.from_parser(parser, env)
    directory: Path | None = Path(args.models_dir) if args.models_dir else models_dir()
    if not args.models_dir and directory is not None and not directory.is_dir():
        directory = None
    preset = args.models_preset
    return Catalogue(
        table,
        explicit_options(parser, args, table),
        models_dir=directory,
        preset_file=Path(preset) if preset else None,
        cache=discover_hub_models,
    )
