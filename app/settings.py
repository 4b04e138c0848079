"""AppSettings: typed settings, stored with QSettings (one key per field)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace

from PySide6.QtCore import QSettings

from .dto import EndpointInfo, LoadParams, SamplingSettings, ServerSettings
from .resources import resource_path

BUILTIN_PRESETS: dict[str, SamplingSettings] = {
    "Balanced": SamplingSettings(),
    "Precise": SamplingSettings(
        temperature=0.2, top_k=20, top_p=0.9, min_p=0.1, repeat_penalty=1.05
    ),
    "Creative": SamplingSettings(
        temperature=1.0, top_k=100, top_p=0.98, min_p=0.02, repeat_penalty=1.0
    ),
    "Greedy (deterministic)": SamplingSettings(
        temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=0
    ),
}


@dataclass
class AppSettings:
    load: LoadParams = field(default_factory=LoadParams)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    system_prompt: str = "You are a helpful assistant."
    preset: str = "Balanced"
    user_presets: dict[str, dict] = field(default_factory=dict)
    models_folder: str = ""
    recent_files: list[str] = field(default_factory=list)
    theme: str = "system"  # system | light | dark
    # remote servers: [{"name": ..., "url": ...}]; their API keys are in the keyring (app/key_store.py)
    remote_endpoints: list[dict] = field(default_factory=list)

    def add_recent(self, path: str, limit: int = 8) -> None:
        self.recent_files = [path] + [p for p in self.recent_files if p != path][: limit - 1]

    def endpoints(self) -> list[EndpointInfo]:
        """The remote servers; entries that are not {name, url} strings are skipped."""
        return [
            EndpointInfo(str(e.get("name") or ""), e["url"])
            for e in self.remote_endpoints
            if isinstance(e, dict) and isinstance(e.get("url"), str)
        ]

    def set_endpoints(self, endpoints: list[EndpointInfo]) -> None:
        self.remote_endpoints = [{"name": e.name, "url": e.url} for e in endpoints]

    def presets(self) -> dict[str, SamplingSettings]:
        user = {k: SamplingSettings(**v) for k, v in self.user_presets.items()}
        return {**BUILTIN_PRESETS, **user}


_NESTED = {"load": LoadParams, "sampling": SamplingSettings, "server": ServerSettings}


def _apply(s: AppSettings, name: str, value) -> AppSettings:
    """`s` with field `name` set from JSON data; a nested dataclass keeps the keys `value` lacks."""
    if name in _NESTED:
        cls = _NESTED[name]
        names = {f.name for f in fields(cls)}
        known = {k: v for k, v in value.items() if k in names}
        value = cls(**{**asdict(s)[name], **known})
    return replace(s, **{name: value})


def default_settings() -> AppSettings:
    """AppSettings with resources/default_settings.json applied (packagers may edit that file)."""
    s = AppSettings()
    path = resource_path("default_settings.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except ValueError:
        data = {}
    for f in fields(AppSettings):
        if f.name in data:
            try:
                s = _apply(s, f.name, data[f.name])
            except (TypeError, ValueError, AttributeError):
                continue
    return s


def load_settings(qs: QSettings) -> AppSettings:
    return read_settings(qs)[0]


def read_settings(qs: QSettings) -> tuple[AppSettings, list[str]]:
    """The stored settings over the defaults, and the keys that could not be read."""
    s, bad = default_settings(), []
    for f in fields(AppSettings):
        raw = qs.value(f.name)
        if raw is None:
            continue
        try:
            s = _apply(s, f.name, json.loads(raw))
        except (TypeError, ValueError, AttributeError):
            bad.append(f.name)  # a corrupt or outdated key keeps its default
    return s, bad


def save_settings(qs: QSettings, s: AppSettings) -> bool:
    """Write `s`; False when the file could not be written (QSettings never raises)."""
    for name, value in asdict(s).items():  # nested settings become dicts, as _apply reads them
        qs.setValue(name, json.dumps(value))
    qs.sync()
    return qs.status() == QSettings.Status.NoError
