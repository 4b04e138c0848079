"""The seam between app/ and engine/: the real adapter and the fake implement the same Protocols.

Both subclass the Protocols in app/engine_api.py (mypy checks each override there); these tests
also catch drift at run time: a member the Protocol declares but a class only inherits as the
Protocol's empty stub, or a parameter that differs in name, kind, default or type.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import threading
from pathlib import Path
from typing import get_type_hints

import pytest

from app.dto import LoadParams
from app.engine_adapter import EngineAdapter, HubAdapter, LlmSession, _StepStream, layer_of
from app.engine_api import (
    ChatLlmApi,
    EngineApi,
    HubApi,
    RemoteApi,
    ReplyStream,
    ServerHandle,
    SessionApi,
)
from app.remote_adapter import RemoteAdapter, RemoteChat, RemoteReplyStream

from .fake_engine import FakeEngine, FakeHub, FakeServer, FakeSession, FakeStream

ROOT = Path(__file__).resolve().parents[2]

# (Protocol, real implementation or None when the engine's own class serves, fake)
IMPLEMENTATIONS = [
    (EngineApi, EngineAdapter, FakeEngine),
    (SessionApi, LlmSession, FakeSession),
    (ChatLlmApi, LlmSession, FakeSession),
    (ChatLlmApi, RemoteChat, None),
    (ReplyStream, RemoteReplyStream, None),
    (RemoteApi, RemoteAdapter, None),  # the fake engine serves the real one (network only)
    (ReplyStream, _StepStream, FakeStream),
    (HubApi, HubAdapter, FakeHub),
    (ServerHandle, None, FakeServer),  # the real one is engine.server's ServerHandle
]
CASES = [(proto, impl) for proto, *impls in IMPLEMENTATIONS for impl in impls if impl is not None]


def _methods(proto: type) -> list[str]:
    return [n for n, v in vars(proto).items() if inspect.isfunction(v) and n != "__init__"]


def _attributes(proto: type) -> dict[str, str]:
    return dict(vars(proto).get("__annotations__", {}))


def _params(fn) -> list[tuple[str, object, object, object]]:
    hints = get_type_hints(fn)
    return [
        (p.name, p.kind, p.default, hints.get(p.name))
        for p in inspect.signature(fn).parameters.values()
    ]


def _defining_class(cls: type, name: str) -> type:
    return next(c for c in cls.__mro__ if name in vars(c))


@pytest.mark.parametrize("proto, impl", CASES, ids=lambda c: c.__name__)
def test_implementation_defines_every_protocol_method_with_its_signature(proto, impl):
    assert proto in impl.__mro__  # explicit: mypy then checks each override
    for name in _methods(proto):
        owner = _defining_class(impl, name)
        assert owner is not proto, f"{impl.__name__}.{name} is only the Protocol's stub"
        ours, theirs = getattr(impl, name), getattr(proto, name)
        assert _params(ours) == _params(theirs), (
            f"{impl.__name__}.{name} differs from {proto.__name__}"
        )
        got, want = get_type_hints(ours).get("return"), get_type_hints(theirs).get("return")
        covariant = isinstance(got, type) and want in got.__mro__  # a fake may return its fake
        assert got == want or covariant, f"{impl.__name__}.{name} returns {got}, not {want}"


@pytest.mark.parametrize("proto, impl", CASES, ids=lambda c: c.__name__)
def test_implementation_declares_every_protocol_attribute(proto, impl):
    declared = vars(impl).get("__annotations__", {})
    for name, kind in _attributes(proto).items():
        assert declared.get(name) == kind, f"{impl.__name__}.{name}: {declared.get(name)} != {kind}"


def test_fake_and_real_session_set_every_attribute(tiny_llama_path, tmp_path):
    params = LoadParams(n_ctx=256, n_seq_max=1, n_batch=64, n_ubatch=64)
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    fake = FakeEngine(load_time=0).load(str(gguf), params, lambda f, m: None, threading.Event())
    real = EngineAdapter().load(str(tiny_llama_path), params, lambda f, m: None, threading.Event())
    try:
        for session in (fake, real):
            for name, kind in get_type_hints(SessionApi).items():
                assert isinstance(getattr(session, name), kind), f"{type(session).__name__}.{name}"
        assert real.n_ctx_seq == 256 and real.template_source
    finally:
        real.close()


@pytest.mark.slow  # a whole mypy run of app/ and the fakes: ~20 s of a core
def test_mypy_accepts_the_implementations():
    files = [
        "app/engine_api.py",
        "app/engine_adapter.py",
        "app/dto.py",
        "app/errors.py",
        "tests/gui/fake_engine.py",
    ]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--follow-imports=silent",
            "--ignore-missing-imports",
            "--cache-dir=/dev/null",
            "--no-error-summary",
            *files,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_layer_of():
    assert layer_of("blk.12.attn_q.weight") == 12 and layer_of("token_embd.weight") == -1
