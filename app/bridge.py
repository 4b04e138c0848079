"""The one place where app/ meets engine/: plain dataclasses the widgets understand, and adapters.

Everything here is Qt-free and synchronous; app/workers.py runs these calls on QThreads and turns
their callbacks into signals. Tests swap `EngineAdapter` for `tests/gui/fake_engine.FakeEngine`,
which implements the same methods.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import psutil

ProgressFn = Callable[[float, str], None]


class AppError(Exception):
    """An error the app reports to the user in plain words."""


class LoadCancelled(AppError):
    """The user cancelled a model load."""


# ---------------------------------------------------------------------------------------------
# What the widgets see
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlmFileInfo:
    """One GGUF file on disk, read cheaply (no weights). `error` says why it cannot be used."""

    path: str
    name: str
    arch: str = "?"
    n_params: int = 0
    quant_mix: dict[str, int] = field(default_factory=dict)  # qtype name -> bytes
    file_size: int = 0
    n_ctx_train: int = 0
    has_chat_template: bool = False
    tokenizer: str = ""
    error: str | None = None
    quant: str = ""  # the quantised type most tensors use (what the file name says)
    title: str = ""  # general.name from the metadata
    template_name: str = ""  # the chat template family the engine detected (or its fallback)

    @property
    def main_quant(self) -> str:
        if self.quant:
            return self.quant
        return max(self.quant_mix, key=self.quant_mix.get) if self.quant_mix else "?"


@dataclass(frozen=True)
class LoadParams:
    n_ctx: int = 4096
    n_seq_max: int = 2  # slots: one for the chat pane, the rest for the server
    n_threads: int = 0  # 0 = engine default (all cores)
    type_k: str = "f16"
    n_batch: int = 512
    n_ubatch: int = 512


@dataclass(frozen=True)
class MemoryFigures:
    weights_bytes: int = 0
    weights_resident_bytes: int = 0
    kv_bytes: int = 0
    kv_used_bytes: int = 0
    kv_per_seq_used: tuple[int, ...] = ()
    compute_bytes: int = 0
    metadata_bytes: int = 0
    rss_bytes: int = 0
    total_bytes: int = 0

    @classmethod
    def from_report(cls, report: Any) -> "MemoryFigures":
        d = report.as_dict() if hasattr(report, "as_dict") else dict(report)
        names = cls.__dataclass_fields__
        kw = {k: (v if v is not None else 0) for k, v in d.items() if k in names}
        kw["kv_per_seq_used"] = tuple(int(x) for x in kw.get("kv_per_seq_used", ()) or ())
        return cls(**kw)


@dataclass(frozen=True)
class TensorRow:
    layer: int  # -1 for tensors outside the blocks (token_embd, output_norm, output)
    name: str
    qtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    seed: int = -1  # -1 = pick a fresh seed per reply (and record it)
    max_tokens: int = 512

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ReplyStep:
    text_delta: str
    finish_reason: str | None
    n_prompt: int
    n_generated: int
    n_cached: int = 0
    t_prompt_ms: float = 0.0
    t_gen_ms: float = 0.0


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str = ""
    cors: bool = False


@dataclass(frozen=True)
class StarterModel:
    name: str
    description: str = ""
    size_bytes: int = 0
    cached_path: str | None = None


@dataclass(frozen=True)
class BackendInfo:
    cpu_model: str
    n_cores: int
    n_logical: int
    n_threads: int
    cpu_target: str
    simd: tuple[str, ...]


class ReplyStream(Protocol):
    def __iter__(self) -> Iterator[ReplyStep]: ...
    def cancel(self) -> None: ...


class ServerHandle(Protocol):
    url: str
    port: int

    def stop(self) -> None: ...


# ---------------------------------------------------------------------------------------------
# Helpers shared by the real adapter and the fake
# ---------------------------------------------------------------------------------------------

_LAYER_RE = re.compile(r"^blk\.(\d+)\.")
_SIMD_OF_INTEREST = (
    "sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni",
    "avx512bf16", "avxvnni", "amx-int8", "neon", "sve", "dotprod",
)


def layer_of(tensor_name: str) -> int:
    m = _LAYER_RE.match(tensor_name)
    return int(m.group(1)) if m else -1


def file_sha256(path: str, progress: ProgressFn | None = None) -> str:
    h, size, done = hashlib.sha256(), max(os.path.getsize(path), 1), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(done / size, "hashing the file (sha256, for the replay record)")
    return h.hexdigest()


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket() as s:
        s.bind((host if host != "0.0.0.0" else "", 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def backend_info(n_threads: int = 0) -> BackendInfo:
    try:
        import llvmlite.binding as llvm

        features = llvm.get_host_cpu_features()
        simd = tuple(f for f in _SIMD_OF_INTEREST if features.get(f, False))
        target = llvm.get_host_cpu_name()
    except Exception:  # llvmlite missing or too old: say so instead of guessing
        simd, target = (), "unknown"
    n_logical = psutil.cpu_count(logical=True) or 1
    return BackendInfo(
        cpu_model=cpu_model_name(),
        n_cores=psutil.cpu_count(logical=False) or n_logical,
        n_logical=n_logical,
        n_threads=n_threads or n_logical,
        cpu_target=target,
        simd=simd,
    )


def available_ram() -> int:
    return psutil.virtual_memory().available


def process_rss() -> int:
    return psutil.Process().memory_info().rss


# ---------------------------------------------------------------------------------------------
# The real engine
# ---------------------------------------------------------------------------------------------


class _StepStream:
    """Wraps a scheduler RequestHandle: yields ReplyStep, forwards cancel()."""

    def __init__(self, handle: Any):
        self._handle = handle

    def __iter__(self) -> Iterator[ReplyStep]:
        for s in self._handle:
            yield ReplyStep(
                text_delta=s.text_delta or "", finish_reason=s.finish_reason,
                n_prompt=s.n_prompt, n_generated=s.n_generated, n_cached=s.n_cached,
                t_prompt_ms=s.t_prompt_ms, t_gen_ms=s.t_gen_ms,
            )

    def cancel(self) -> None:
        self._handle.cancel()


def _chat_template(gguf: Any) -> Any:
    from engine.tokenizer.chat_template import ChatTemplate

    return ChatTemplate.from_gguf(gguf, override=None)


class LlmSession:
    """A loaded LLM: its context and scheduler thread, shared by the chat pane and the server."""

    def __init__(self, llm: Any, ctx: Any, scheduler: Any, params: LoadParams, sha256: str):
        self.llm, self.ctx, self.scheduler, self.params = llm, ctx, scheduler, params
        self.path = str(llm.path)
        self.name = Path(self.path).stem
        self.arch = llm.cfg.arch
        self.n_params = int(llm.n_params)
        self.n_ctx = int(ctx.n_ctx)
        self.n_ctx_seq = int(ctx.n_ctx_seq)  # what one conversation can use
        self.n_threads = params.n_threads or (psutil.cpu_count() or 1)
        self.sha256 = sha256
        self._template = _chat_template(llm.gguf)
        self.template_source = getattr(self._template, "source", "") or ""
        self.template_name = getattr(self._template, "name", "") or ""

    def layers(self) -> list[TensorRow]:
        rows = [
            TensorRow(layer_of(t.name), t.name, _qname(t.qtype), tuple(int(d) for d in t.shape),
                      int(t.nbytes))
            for t in self.llm.gguf.tensors.values()
        ]
        return sorted(rows, key=lambda r: (r.layer if r.layer >= 0 else 1 << 30, r.name))

    def memory(self) -> MemoryFigures:
        return MemoryFigures.from_report(self.ctx.memory_report())

    def _tokens(self, messages: list[dict]) -> list[int]:
        tok = self.llm.tokenizer
        text = self._template.render(messages, add_generation_prompt=True)
        tokens = tok.encode(text, add_special=True, parse_special=True)
        if len(tokens) >= 2 and tokens[0] == tokens[1] == tok.bos_id:
            tokens = tokens[1:]  # the template wrote BOS itself
        return tokens

    def count_tokens(self, messages: list[dict]) -> int:
        return len(self._tokens(messages))

    def generate(self, messages: list[dict], sampling: SamplingSettings) -> ReplyStream:
        from engine.sampling import SamplingParams
        from engine.scheduler import GenerationRequest

        sp = SamplingParams(
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
            min_p=sampling.min_p, repeat_penalty=sampling.repeat_penalty, seed=sampling.seed,
        )
        request = GenerationRequest(prompt=self._tokens(messages), params=sp,
                                    n_predict=sampling.max_tokens,
                                    stop=tuple(getattr(self._template, "stop_strings", ()) or ()))
        return _StepStream(self.scheduler.submit(request))

    def start_server(self, settings: ServerSettings, on_log: Callable[[str], None]) -> ServerHandle:
        from engine.server import start_server

        def log_request(entry: dict) -> None:
            on_log(f"{entry.get('method', '?')} {entry.get('path', '?')} {entry.get('status', '?')} "
                   f"{entry.get('duration_ms', 0):.0f} ms")

        return start_server(self.scheduler, host=settings.host, port=settings.port,
                            api_keys=[settings.api_key] if settings.api_key else (),
                            cors=settings.cors, request_log=log_request)

    def close(self) -> None:
        self.scheduler.stop()
        self.llm.close()


class EngineAdapter:
    """Calls the engine's public API. Every method may block: call it from a worker thread."""

    def __init__(self) -> None:
        self._infos: dict[str, Any] = {}  # path -> engine.model_info.ModelInfo (header only)

    def _model_info(self, path: str) -> Any:
        from engine.model_info import inspect_model

        info = self._infos[path] = inspect_model(path)
        return info

    def inspect(self, path: str) -> LlmFileInfo:
        info = self._model_info(path)
        name = Path(path).stem
        if info.error:  # the path is in the row already: keep the reason only
            reason = info.error.removeprefix(f"{path}: ")
            return LlmFileInfo(path=str(path), name=name, file_size=int(info.file_size), error=reason)
        return LlmFileInfo(
            path=str(path), name=name, title=info.name, arch=info.arch, n_params=int(info.n_params),
            quant_mix=dict(info.quant_bytes), quant=info.file_type or _main_quant(info.quant_counts),
            file_size=int(info.file_size), n_ctx_train=int(info.n_ctx_train),
            has_chat_template=bool(info.has_chat_template),
            template_name=str(info.chat_template_name or ""), tokenizer=str(info.tokenizer),
        )

    def estimate(self, path: str, params: LoadParams) -> MemoryFigures:
        info = self._infos.get(path) or self._model_info(path)
        report = info.estimate(n_ctx=params.n_ctx, n_seq_max=params.n_seq_max, type_k=params.type_k,
                               type_v=params.type_k, n_ubatch=params.n_ubatch, n_batch=params.n_batch)
        return MemoryFigures.from_report(report)

    def load(self, path: str, params: LoadParams, progress: ProgressFn,
             cancel: threading.Event) -> LlmSession:
        from engine.context import Context, ContextParams
        from engine.model import load_model
        from engine.scheduler import Scheduler

        def stage(start: float, span: float) -> ProgressFn:
            def report(fraction: float, message: str) -> None:
                if cancel.is_set():  # raised inside load_model: it unwinds and nothing is kept
                    raise LoadCancelled("Loading cancelled")
                progress(start + span * fraction, message)
            return report

        report = stage(0.0, 0.8)
        llm = load_model(path, n_threads=params.n_threads or None, progress=report)
        try:
            report(1.0, "allocating the KV cache and compute buffers")
            ctx = Context(llm, ContextParams(
                n_ctx=params.n_ctx, n_batch=params.n_batch, n_ubatch=params.n_ubatch,
                n_seq_max=params.n_seq_max, type_k=params.type_k, type_v=params.type_k,
            ))
            sha = file_sha256(path, stage(0.8, 0.2))
        except BaseException:
            llm.close()
            raise
        scheduler = Scheduler(ctx, model=llm).start()
        return LlmSession(llm, ctx, scheduler, params, sha)

    def starter_models(self) -> list[StarterModel]:
        from engine import model_store

        out = []
        for spec in model_store.STARTER_MODELS.values():
            cached = model_store.cached_path(spec.name)
            out.append(StarterModel(spec.name, spec.description, int(spec.size),
                                    str(cached) if cached else None))
        return out

    def pull(self, name: str, progress: Callable[[str, int, int], None],
             cancel: threading.Event) -> str:
        from engine import model_store

        try:
            return str(model_store.pull(name, progress=progress, cancel=cancel))
        except Exception:
            if cancel.is_set():
                raise LoadCancelled("Download cancelled") from None
            raise

    def models_dir(self) -> str:
        from engine import model_store

        return str(model_store.models_dir())

    def resolve_model(self, arg: str) -> str:
        """A `-m` value: an existing path, or the name of a downloaded starter model."""
        from engine import model_store

        return str(model_store.resolve_model_arg(arg))

    def backends(self, n_threads: int = 0) -> BackendInfo:
        return backend_info(n_threads)


_FLOAT_TYPES = {"F32", "F16", "BF16", "F64"}


def _main_quant(counts: dict[str, int]) -> str:
    """The quantised types most tensors use ("Q5_0 / Q4_K"): embeddings are often kept at higher
    precision and norms are F32, so neither total bytes nor all tensors name the quantisation."""
    quantised = {k: v for k, v in counts.items() if k not in _FLOAT_TYPES} or counts
    if not quantised:
        return "?"
    top = max(quantised.values())
    ranked = sorted((k for k, v in quantised.items() if v >= 0.2 * top), key=lambda k: -quantised[k])
    return " / ".join(ranked)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _qname(qtype: Any) -> str:
    return getattr(qtype, "name", str(qtype))


def now_ms() -> float:
    return time.perf_counter() * 1000.0


# ---------------------------------------------------------------------------------------------
# Policies the chat pane states up front
# ---------------------------------------------------------------------------------------------

CONTEXT_POLICY = (
    "When the conversation no longer fits, the oldest turns (after the system prompt) are left "
    "out of the prompt, and the reply is cut short if even the last message leaves no room."
)

_PLAIN = {
    "GGUFError": "This file is not a usable GGUF model",
    "MissingTensorError": "The model file is missing a tensor the architecture needs",
    "UnsupportedArchError": "This model's architecture is not supported yet",
    "UnsupportedQuantError": "This model uses a quantisation type the engine cannot run",
    "TokenizerError": "The model's tokenizer is missing or unsupported",
    "TemplateError": "The model's chat template could not be used",
    "ContextOverflowError": "The conversation does not fit in the context",
    "MemoryError": "Not enough memory",
    "ModelStoreError": "The model could not be downloaded",
    "FileNotFoundError": "File not found",
}


def plain_error(e: BaseException) -> str:
    """Plain words first, then the engine's own message."""
    for cls in type(e).__mro__:
        if cls.__name__ in _PLAIN:
            return f"{_PLAIN[cls.__name__]}.\n\n{e}".rstrip()
    if isinstance(e, AppError):
        return str(e)
    return f"{type(e).__name__}: {e}"


def fit_to_context(count_tokens: Callable[[list[dict]], int], messages: list[dict],
                   n_ctx: int, max_tokens: int) -> tuple[list[dict], int, int]:
    """Drop the oldest turns until prompt + max_tokens fits. Returns (messages, n_dropped, max_tokens)."""
    head = messages[:1] if messages and messages[0]["role"] == "system" else []
    rest = messages[len(head):]
    n_prompt = count_tokens(head + rest)
    dropped = 0
    while n_prompt + max_tokens > n_ctx and len(rest) > 1:
        rest = rest[1:]
        dropped += 1
        n_prompt = count_tokens(head + rest)
    if n_prompt >= n_ctx:
        raise AppError(
            f"The message is too long for the context: the prompt needs {n_prompt} tokens "
            f"and the context holds {n_ctx}. Load the model with a larger context size."
        )
    return head + rest, dropped, min(max_tokens, n_ctx - n_prompt)
