"""ggstation's engine: GGUF models on a numba CPU engine. Imports no Qt.

Public API (imported lazily so that `import engine` stays cheap):
    load_model(path, n_threads=None, progress=None, *, n_gpu_layers=0, device=None, decode_path=None) -> Model
    init_from_params(path, InitParams(ContextParams(...), scheduler=SchedulerParams(...))) -> Loaded:
        the model, its context and its scheduler built at once (how every entry point loads)
    Context(model, ContextParams(...)); ctx.decode(Batch) -> logits; ctx.memory_report()
    Batch.for_sequence(tokens, pos0, seq_id), Batch.concat([...])
    inspect_model(path) -> ModelInfo;  estimate_memory(cfg, ...) -> MemoryReport
    Scheduler(ctx, tokenizer).start(); scheduler.submit(GenerationRequest(...)) -> RequestHandle
    generate(ctx, tokenizer, prompt_tokens, SamplingParams(...)) -> GenerationStep, ...
    ChatTemplate, chat_prompt_tokens; start_server(scheduler); the starter-model store
    Hugging Face Hub (engine.hub.client): hub.search(), hub.repo(), hub.resolve("user/repo:Q4_K_M"),
        hub.download(file, progress, cancel), hub.cached_models(); remote_fit(file) -> RemoteFit
        (engine.hub.fit);
        HubFile, HubRepo, RemoteFit, HubError
    Remote OpenAI-compatible servers (engine.remote): RemoteClient(RemoteEndpoint(url, api_key))
        .list_models() / .probe() / .slots() / .metrics(); stream_chat(...) -> ChatStream of
        ChatDelta (cancel() from any thread); normalize_url(); RemoteError
    EngineError and its subclasses (engine.errors)
"""

import os as _os
from typing import TYPE_CHECKING

# Threading policy, set before numba starts its OpenMP team: workers spin briefly between the
# ~150 parallel regions of a decode step instead of sleeping (a futex wake-up each halved decode
# speed), but never long enough to starve the batch path's BLAS threads (an unbounded spin did).
# Kernels are launched by the thread that owns a context (the scheduler's); any other thread
# that runs parallel kernels must end afterwards (jit.on_passing_thread), so one OpenMP team
# lives at a time: two live teams throttle each other's spin-waits.
_os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")
_os.environ.setdefault("GOMP_SPINCOUNT", "20000")

# A frozen (PyInstaller) bundle has no writable __pycache__ beside the sources, where numba's
# cache lives by default (numba/numba#4908): give it a per-user directory. numba reads this
# when it is first imported, so it must be set here, before any engine module imports numba.
if getattr(__import__("sys"), "frozen", False):
    _os.environ.setdefault(
        "NUMBA_CACHE_DIR", _os.path.join(_os.path.expanduser("~"), ".cache", "ggstation", "numba")
    )

_EXPORTS = {
    "load_model": "engine.model",
    "init_from_params": "engine.init",
    "InitParams": "engine.init",
    "SchedulerParams": "engine.init",
    "Loaded": "engine.init",
    "Model": "engine.model",
    "Context": "engine.context",
    "ContextParams": "engine.context",
    "Batch": "engine.batch",
    "inspect_model": "engine.model_info",
    "ModelInfo": "engine.model_info",
    "estimate_memory": "engine.memory",
    "MemoryReport": "engine.memory",
    "SamplingParams": "engine.sampling",
    "generate": "engine.generate",
    "GenerationStep": "engine.sequence",
    "EngineError": "engine.errors",
    "Scheduler": "engine.scheduler",
    "GenerationRequest": "engine.tasks",
    "RequestHandle": "engine.tasks",
    "ChatTemplate": "engine.tokenizer.chat_template",
    "chat_prompt_tokens": "engine.tokenizer.chat_template",
    "start_server": "engine.server",
    "STARTER_MODELS": "engine.hub.store",
    "cached_path": "engine.hub.store",
    "pull": "engine.hub.store",
    "models_dir": "engine.hub.store",
    "resolve_model_arg": "engine.hub.store",
    "HubFile": "engine.hub.client",
    "HubRepo": "engine.hub.client",
    "RemoteFit": "engine.hub.fit",
    "HubError": "engine.errors",
    "RemoteError": "engine.errors",
    "RemoteEndpoint": "engine.remote",
    "RemoteClient": "engine.remote",
    "RemoteModel": "engine.remote",
    "ServerInfo": "engine.remote",
    "RemoteSlot": "engine.remote",
    "RemoteMetrics": "engine.remote",
    "RemoteSampling": "engine.remote",
    "ChatDelta": "engine.remote",
    "ChatStream": "engine.remote",
    "stream_chat": "engine.remote",
    "normalize_url": "engine.remote",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # what the lazy table resolves to, for type checkers
    from .batch import Batch
    from .context import Context, ContextParams
    from .errors import EngineError, HubError, RemoteError
    from .generate import generate
    from .hub.client import HubFile, HubRepo
    from .hub.fit import RemoteFit
    from .hub.store import STARTER_MODELS, cached_path, models_dir, pull, resolve_model_arg
    from .init import InitParams, Loaded, SchedulerParams, init_from_params
    from .memory import MemoryReport, estimate_memory
    from .model import Model, load_model
    from .model_info import ModelInfo, inspect_model
    from .remote import (
        ChatDelta,
        ChatStream,
        RemoteClient,
        RemoteEndpoint,
        RemoteMetrics,
        RemoteModel,
        RemoteSampling,
        RemoteSlot,
        ServerInfo,
        normalize_url,
        stream_chat,
    )
    from .sampling import SamplingParams
    from .scheduler import Scheduler
    from .sequence import GenerationStep
    from .server import start_server
    from .tasks import GenerationRequest, RequestHandle
    from .tokenizer.chat_template import ChatTemplate, chat_prompt_tokens


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
