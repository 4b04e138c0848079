"""The real engine behind the app's Protocols (app/engine_api.py), built on `engine`'s public API.

Qt-free and synchronous; app/workers.py runs these calls on QThreads and turns their callbacks
into signals. Engine modules are imported inside the methods that need them, so importing the
app does not pay for numba until the first file is inspected or loaded.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from .dto import (
    FIT_NO,
    FIT_OK,
    FIT_TIGHT,
    BackendInfo,
    DeviceDesc,
    DeviceShare,
    HubFileInfo,
    HubFitInfo,
    HubRepoInfo,
    LlmFileInfo,
    LoadParams,
    MemoryFigures,
    ReplyStep,
    SamplingSettings,
    ServerSettings,
    StarterModel,
    TensorRow,
)
from .engine_api import (
    DownloadProgressFn,
    EngineApi,
    HubApi,
    LogFn,
    ProgressFn,
    PullProgressFn,
    RemoteApi,
    ReplyStream,
    ServerHandle,
    SessionApi,
)
from .errors import LoadCancelled
from .machine import backend_info, file_sha256
from .remote_adapter import RemoteAdapter
from .stream_buffer import FRAME_MS

if TYPE_CHECKING:
    from engine import (
        ChatTemplate,
        Context,
        HubFile,
        MemoryReport,
        Model,
        ModelInfo,
        RequestHandle,
        Scheduler,
    )
    from engine.backends import DeviceInfo
    from engine.vision import Projector

_LAYER_RE = re.compile(r"^blk\.(\d+)\.")
_FLOAT_TYPES = {"F32", "F16", "BF16", "F64"}


def layer_of(tensor_name: str) -> int:
    """The block index in a GGUF tensor name (`blk.12.attn_q.weight` -> 12), -1 outside blocks."""
    m = _LAYER_RE.match(tensor_name)
    return int(m.group(1)) if m else -1


def _main_quant(counts: dict[str, int]) -> str:
    """The quantised types most tensors use ("Q5_0 / Q4_K"): embeddings are often kept at higher
    precision and norms are F32, so neither total bytes nor all tensors name the quantisation."""
    quantised = {k: v for k, v in counts.items() if k not in _FLOAT_TYPES} or counts
    if not quantised:
        return "?"
    top = max(quantised.values())
    ranked = sorted(
        (k for k, v in quantised.items() if v >= 0.2 * top), key=lambda k: -quantised[k]
    )
    return " / ".join(ranked)


class _StepStream(ReplyStream):
    """Wraps a scheduler RequestHandle: yields ReplyStep, forwards cancel()."""

    def __init__(self, handle: RequestHandle):
        self._handle = handle

    def __iter__(self) -> Iterator[ReplyStep]:
        for s in self._handle:
            yield ReplyStep(
                text_delta=s.text_delta,
                finish_reason=s.finish_reason,
                n_prompt=s.n_prompt,
                n_generated=s.n_generated,
                n_cached=s.n_cached,
                t_prompt_ms=s.t_prompt_ms,
                t_gen_ms=s.t_gen_ms,
            )

    def cancel(self) -> None:
        self._handle.cancel()


def _encode_phases(media: Sequence[Any]) -> list[str]:
    """Each span's "encoding image 1 of 2" (with its part, for an image cut into several tiles:
    a span's id is "<image sha>:<tile>")."""
    keys = [str(span.id).split(":")[0] for span in media]
    images = list(dict.fromkeys(keys))
    out, seen = [], dict.fromkeys(images, 0)
    for key in keys:
        seen[key] += 1
        parts = keys.count(key)
        phase = f"encoding image {images.index(key) + 1} of {len(images)}"
        out.append(phase + (f", part {seen[key]} of {parts}" if parts > 1 else ""))
    return out


def _new_spans(media: Sequence[Any], n_new_images: int) -> list[Any]:
    """The spans of the last `n_new_images` images (the message being sent). Earlier messages'
    images are left to the scheduler, which needs them only when its prompt cache lost them."""
    keys = [str(span.id).split(":")[0] for span in media]
    new = set(list(dict.fromkeys(reversed(keys)))[:n_new_images]) if n_new_images else set()
    return [span for span, key in zip(media, keys, strict=True) if key in new]


class _MediaStream(ReplyStream):
    """A prompt with images: encodes the sent message's images (each embedding is kept on its
    span, where the scheduler finds it) on the iterating thread, saying so with a `phase` step
    before each, then submits the request. cancel() stops between images and reaches the request once submitted."""

    def __init__(self, scheduler: Scheduler, request: Any, media: Sequence[Any]):
        self._scheduler, self._request, self._media = scheduler, request, list(media)
        self._cancel = threading.Event()
        self._handle: RequestHandle | None = None

    def __iter__(self) -> Iterator[ReplyStep]:
        from engine.vision import EncodeCancelled

        for phase, span in zip(_encode_phases(self._media), self._media, strict=True):
            if self._cancel.is_set():
                yield ReplyStep("", "cancelled", 0, 0)
                return
            yield ReplyStep("", None, 0, 0, phase=phase)
            try:
                span.embed(self._cancel)  # Stop is heard between the tower's layers
            except EncodeCancelled:
                yield ReplyStep("", "cancelled", 0, 0)
                return
        if self._cancel.is_set():
            yield ReplyStep("", "cancelled", 0, 0)
            return
        self._handle = self._scheduler.submit(self._request)
        if self._cancel.is_set():  # cancelled between the check and the submit
            self._handle.cancel()
        yield from _StepStream(self._handle)

    def cancel(self) -> None:
        self._cancel.set()
        handle = self._handle
        if handle is not None:
            handle.cancel()


class LlmSession(SessionApi):
    """A loaded LLM: its context and scheduler thread, shared by the chat pane and the server."""

    path: str
    name: str
    arch: str
    n_params: int
    n_ctx: int
    n_ctx_seq: int
    n_threads: int
    sha256: str
    template_source: str
    template_name: str
    endpoint: str = ""  # loaded here
    projector: str

    def __init__(
        self,
        llm: Model,
        ctx: Context,
        scheduler: Scheduler,
        params: LoadParams,
        sha256: str,
        projector: Projector | None = None,
    ):
        from engine import ChatTemplate

        self.llm, self.ctx, self.scheduler, self.params = llm, ctx, scheduler, params
        self._projector = projector
        self.projector = str(projector.path) if projector is not None else ""
        self._last_media: tuple[tuple, Any] | None = None  # (key, MediaPrompt) count, then send
        self.path = str(llm.path)
        self.name = Path(self.path).stem
        self.arch = llm.cfg.arch
        self.n_params = int(llm.n_params)
        self.n_ctx = int(ctx.n_ctx)
        self.n_ctx_seq = int(ctx.n_ctx_seq)
        self.n_threads = params.n_threads or (psutil.cpu_count() or 1)
        self.sha256 = sha256
        self._template: ChatTemplate = ChatTemplate.from_gguf(llm.gguf, override=None)
        self.template_source = self._template.source
        self.template_name = self._template.name

    def layers(self) -> list[TensorRow]:
        rows = [
            TensorRow(
                layer_of(t.name),
                t.name,
                t.qtype.name,
                tuple(int(d) for d in t.shape),
                int(t.nbytes),
            )
            for t in self.llm.gguf.tensors.values()
        ]
        return sorted(rows, key=lambda r: (r.layer if r.layer >= 0 else 1 << 30, r.name))

    def memory(self) -> MemoryFigures:
        report = self.ctx.memory_report()
        if self._projector is not None:  # the context knows nothing of the projector
            report = report.with_projector(
                self._projector.weights_bytes(), self._projector.compute_bytes()
            )
        return MemoryFigures.from_report(report)

    def _tokens(self, messages: list[dict]) -> list[int]:
        """The same prompt `ggstation chat` and the server's chat endpoint build."""
        from engine import chat_prompt_tokens

        return chat_prompt_tokens(self._template, self.llm.tokenizer, messages)

    def _media_prompt(self, messages: list[dict]) -> Any:
        """The prompt with its images (engine.vision's MediaPrompt); the last one is kept, since
        the worker counts the prompt's tokens and then sends the same messages."""
        images = [data for m in messages for data in m.get("images", ())]
        key = (tuple(str(m.get("content")) for m in messages), tuple(map(hash, images)))
        if self._last_media is not None and self._last_media[0] == key:
            return self._last_media[1]
        assert self._projector is not None
        text = self._template.render(
            [{"role": m["role"], "content": m["content"]} for m in messages],
            add_generation_prompt=True,
        )
        # engine.vision's MediaError (a file it cannot decode) says which image and why
        prompt = self._projector.tokenize(self.llm.tokenizer, text, images, add_special=True)
        self._last_media = (key, prompt)
        return prompt

    def _has_images(self, messages: list[dict]) -> bool:
        return self._projector is not None and any(m.get("images") for m in messages)

    def count_tokens(self, messages: list[dict]) -> int:
        if self._has_images(messages):
            return len(self._media_prompt(messages).tokens)
        return len(self._tokens(messages))

    def generate(self, messages: list[dict], sampling: SamplingSettings) -> ReplyStream:
        from engine import GenerationRequest, SamplingParams

        sp = SamplingParams(
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            min_p=sampling.min_p,
            repeat_penalty=sampling.repeat_penalty,
            seed=sampling.seed,
            ignore_eos=sampling.ignore_eos,
            logprobs=False,  # the chat shows none: spare the softmax
        )
        media: tuple = ()
        if self._has_images(messages):
            prompt = self._media_prompt(messages)
            tokens, media = list(prompt.tokens), tuple(prompt.media)
        else:
            tokens = self._tokens(messages)
        # only with images, so that text chats do not depend on GenerationRequest.media
        with_media: dict[str, Any] = {"media": media} if media else {}
        request = GenerationRequest(
            prompt=tokens,
            params=sp,
            n_predict=sampling.max_tokens,
            stop=self._template.stop_strings,
            wake_interval_s=FRAME_MS / 1000,  # shown once a frame anyway
            **with_media,
        )
        new = _new_spans(media, len(messages[-1].get("images", ())) if messages else 0)
        if new:
            return _MediaStream(self.scheduler, request, new)
        return _StepStream(self.scheduler.submit(request))

    def start_server(self, settings: ServerSettings, on_log: LogFn) -> ServerHandle:
        from engine import start_server

        def log_request(entry: dict) -> None:
            on_log(
                f"{entry.get('method', '?')} {entry.get('path', '?')} {entry.get('status', '?')} "
                f"{entry.get('duration_ms', 0):.0f} ms"
            )

        return start_server(
            self.scheduler,
            host=settings.host,
            port=settings.port,
            api_keys=[settings.api_key] if settings.api_key else (),
            cors=settings.cors,
            request_log=log_request,
        )

    def close(self) -> None:
        self.scheduler.stop()
        self.llm.close()


class HubAdapter(HubApi):
    """engine.hub.client behind the HubApi Protocol. Keeps each repository's last listing, so that fit
    and download use its sizes, checksums and commit without asking the Hub again.

    A model of a repository with projector (mmproj) GGUFs downloads with the one llama.cpp's -hf
    brings (engine.hub.siblings' rule), into the same snapshot folder, where the model list
    pairs them (app/vision_files.py)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str], HubFile] = {}  # (repo_id, filename) -> listed file
        # (repo_id, model filename) -> its projector, None for none (from the last listing)
        self._mmproj: dict[tuple[str, str], HubFile | None] = {}

    def search(self, text: str, token: str | None) -> list[HubRepoInfo]:
        from engine.hub import client as hub
        from engine.hub.siblings import is_sibling

        return [
            HubRepoInfo(
                r.repo_id,
                r.downloads,
                r.likes,
                r.gated,
                len(r.files),
                any(is_sibling(c.filename) for c in r.companions),
            )
            for r in hub.search(text, token=token or None)
        ]

    def files(self, repo_id: str, token: str | None) -> list[HubFileInfo]:
        from engine.hub import client as hub
        from engine.hub.siblings import best_mmproj

        listing = hub.repo(repo_id, token=token or None)
        listed = listing.files
        if not listed:
            return []
        default = hub.choose(listed, repo_id=repo_id)
        names = [c.filename for c in listing.companions]
        by_name = {c.filename: c for c in listing.companions}
        paired = {f.filename: by_name.get(best_mmproj(names, f.filename) or "") for f in listed}
        with self._lock:
            self._known.update({(repo_id, f.filename): f for f in listed + listing.companions})
            self._mmproj.update({(repo_id, name): mm for name, mm in paired.items()})
        cached = {
            (c.repo_id, c.filename): c.local_path
            for c in hub.cached_models()
            if c.repo_id == repo_id
        }
        out = []
        for f in listed:
            mm = paired[f.filename]
            local = cached.get((repo_id, f.filename))
            if mm is not None and hub.with_local_path(mm).local_path is None:
                local = None  # downloaded, but not what -hf brings: the projector is missing
            out.append(_hub_file_info(f, local, f is default, mm))
        return out

    def fit(self, repo_id: str, filename: str, token: str | None) -> HubFitInfo:
        from engine.hub.fit import remote_fit

        r = remote_fit(self._file(repo_id, filename, token), token=token or None)
        verdict = {"fits": FIT_OK, "tight": FIT_TIGHT}.get(r.verdict, FIT_NO)
        return HubFitInfo(
            repo_id,
            filename,
            verdict,
            r.supported,
            "" if r.supported else r.why_unsupported(),
            r.arch or "?",
            int(r.n_params),
            int(r.n_ctx_train),
            int(r.n_ctx),
            bool(r.has_chat_template),
            int(r.needed_bytes),
            int(r.available_bytes),
            int(r.bytes_read),
        )

    def download(
        self,
        repo_id: str,
        filename: str,
        token: str | None,
        progress: DownloadProgressFn,
        cancel: threading.Event,
    ) -> str:
        from engine.hub import client as hub

        file = self._file(repo_id, filename, token)
        mmproj = self._projector(repo_id, filename, token)
        extra = (mmproj.size or 0) if mmproj is not None else 0
        # one bar over both files: the projector's bytes are counted from the start
        path = hub.download(
            file,
            token=token or None,
            progress=lambda done, total: progress(done, total + extra),
            cancel=cancel,
        )
        if mmproj is not None:
            model_bytes = file.size or path.stat().st_size

            def after_model(done: int, total: int) -> None:
                progress(model_bytes + done, model_bytes + total)

            hub.download(mmproj, token=token or None, progress=after_model, cancel=cancel)
        return str(path)

    def discard(self, repo_id: str, filename: str, token: str | None) -> None:
        from engine.hub import client as hub

        hub.discard_partial(self._file(repo_id, filename, token))
        with self._lock:
            mmproj = self._mmproj.get((repo_id, filename))
        if mmproj is not None:
            hub.discard_partial(mmproj)

    def cached_models(self) -> list[HubFileInfo]:
        from engine.hub import client as hub

        return [_hub_file_info(f, f.local_path) for f in hub.cached_models()]

    def _file(self, repo_id: str, filename: str, token: str | None) -> HubFile:
        """The listed file, else looked up (one API call; offline: from the cache)."""
        from engine.hub import client as hub

        with self._lock:
            known = self._known.get((repo_id, filename))
        return known or hub.resolve(repo_id, filename=filename, token=token or None)

    def _projector(self, repo_id: str, filename: str, token: str | None) -> HubFile | None:
        """The projector that downloads with the model: from its listing, else looked up (one
        API call; offline: from the cache, where it is there only if downloaded before)."""
        from engine.hub import client as hub

        key = (repo_id, filename)
        with self._lock:
            if key in self._mmproj:
                return self._mmproj[key]
        _model, mmproj = hub.resolve_with_mmproj(repo_id, filename=filename, token=token or None)
        with self._lock:
            self._mmproj[key] = mmproj
        return mmproj


def _estimated_shares(report: MemoryReport, gpus: list[DeviceInfo]) -> tuple[DeviceShare, ...]:
    """The estimate's per-device shares, each GPU's with its room and the engine's verdict."""
    from engine.memory import device_fits

    fits = {f.device: f for f in device_fits(report, gpus)}
    shares = []
    for d in report.devices:
        fit = fits.get(d.device)
        shares.append(
            DeviceShare(
                d.device,
                int(d.weights_bytes),
                int(d.kv_bytes),
                int(d.compute_bytes),
                int(d.n_layers),
                int(fit.capacity_bytes or 0) if fit else 0,
                fit.verdict if fit else "",
            )
        )
    return tuple(shares)


def _hub_file_info(
    f: HubFile, local_path: Path | None, default: bool = False, mmproj: HubFile | None = None
) -> HubFileInfo:
    return HubFileInfo(
        f.repo_id,
        f.filename,
        f.quant or "",
        f.size,
        len(f.parts),
        str(local_path) if local_path else None,
        default,
        mmproj.filename if mmproj is not None else "",
        mmproj.size if mmproj is not None else None,
    )


class EngineAdapter(EngineApi):
    """Calls the engine's public API. Every method may block: call it from a worker thread."""

    def __init__(self) -> None:
        self._infos: dict[str, ModelInfo] = {}  # path -> header-only info, reused by estimate()
        self._hub = HubAdapter()
        self._remote = RemoteAdapter()

    def _model_info(self, path: str) -> ModelInfo:
        from engine import inspect_model

        info = self._infos[path] = inspect_model(path)
        return info

    def inspect(self, path: str) -> LlmFileInfo:
        info = self._model_info(path)
        name = Path(path).stem
        if info.error:  # the path is in the row already: keep the reason only
            reason = info.error.removeprefix(f"{path}: ")
            return LlmFileInfo(
                path=str(path), name=name, file_size=int(info.file_size), error=reason
            )
        return LlmFileInfo(
            path=str(path),
            name=name,
            title=info.name,
            arch=info.arch,
            n_params=int(info.n_params),
            quant_mix=dict(info.quant_bytes),
            quant=info.file_type or _main_quant(info.quant_counts),
            file_size=int(info.file_size),
            n_ctx_train=int(info.n_ctx_train),
            has_chat_template=bool(info.has_chat_template),
            template_name=info.chat_template_name,
            tokenizer=info.tokenizer,
            n_expert=int(info.n_expert),
            n_expert_used=int(info.n_expert_used),
            active_params=int(info.active_params),
            n_layer=int(info.n_layer),
        )

    def estimate(self, path: str, params: LoadParams) -> MemoryFigures:
        info = self._infos.get(path) or self._model_info(path)
        gpu, n_gpu = self._placement(info, params)
        report = info.estimate(
            n_ctx=params.n_ctx,
            n_seq_max=params.n_seq_max,
            type_k=params.type_k,
            type_v=params.type_k,
            n_ubatch=params.n_ubatch,
            n_batch=params.n_batch,
            n_gpu_layers=n_gpu,
            gpu_device=gpu.name if gpu else "GL0",
        )
        if params.mmproj:  # the paired projector loads with the model, into RAM
            from engine.vision import estimate_projector

            report = report.with_projector(*estimate_projector(params.mmproj))
        return MemoryFigures.from_report(report, _estimated_shares(report, [gpu] if gpu else []))

    def _placement(self, info: ModelInfo, params: LoadParams) -> tuple[DeviceInfo | None, int]:
        """The GPU device layers go to (the first usable one) and -ngl for this model: "all"
        (-1) is every layer and the head; no usable GPU means the CPU runs everything."""
        from engine.backends import list_devices

        gpu = next((d for d in list_devices() if d.backend != "CPU" and d.available), None)
        if gpu is None or params.n_gpu_layers == 0:
            return gpu, 0
        top = info.n_layer + 1
        return gpu, top if params.n_gpu_layers < 0 else min(params.n_gpu_layers, top)

    def load(
        self, path: str, params: LoadParams, progress: ProgressFn, cancel: threading.Event
    ) -> SessionApi:
        from engine import ContextParams, InitParams, SchedulerParams, init_from_params

        def stage(start: float, span: float) -> ProgressFn:
            def report(fraction: float, message: str) -> None:
                if cancel.is_set():  # raised inside load_model: it unwinds and nothing is kept
                    raise LoadCancelled("Loading cancelled")
                progress(start + span * fraction, message)

            return report

        report = stage(0.0, 0.8)
        gpu, n_gpu = (None, 0)
        if params.n_gpu_layers:
            gpu, n_gpu = self._placement(self._infos.get(path) or self._model_info(path), params)
        context = ContextParams(
            n_ctx=params.n_ctx,
            n_batch=params.n_batch,
            n_ubatch=params.n_ubatch,
            n_seq_max=params.n_seq_max,
            type_k=params.type_k,
            type_v=params.type_k,
        )
        # the projector only when there is one: InitParams gains mmproj with engine.vision
        vision: dict[str, Any] = {"mmproj": params.mmproj} if params.mmproj else {}
        loaded = init_from_params(
            path,
            InitParams(
                context,
                n_threads=params.n_threads or None,
                n_gpu_layers=n_gpu,
                device=gpu.name if gpu and n_gpu else None,
                scheduler=SchedulerParams(),
                **vision,
            ),
            progress=report,
        )
        try:
            sha = file_sha256(path, stage(0.8, 0.2))
        except BaseException:
            loaded.close()
            raise
        assert loaded.scheduler is not None
        projector = getattr(loaded, "projector", None) if params.mmproj else None
        return LlmSession(
            loaded.model, loaded.ctx, loaded.scheduler.start(), params, sha, projector
        )

    def starter_models(self) -> list[StarterModel]:
        from engine import STARTER_MODELS, cached_path

        out = []
        for spec in STARTER_MODELS.values():
            cached = cached_path(spec.name)
            out.append(
                StarterModel(
                    spec.name, spec.description, int(spec.size), str(cached) if cached else None
                )
            )
        return out

    def pull(self, name: str, progress: PullProgressFn, cancel: threading.Event) -> str:
        from engine import pull

        try:
            return str(pull(name, progress=progress, cancel=cancel))
        except Exception:
            if cancel.is_set():
                raise LoadCancelled("Download cancelled") from None
            raise

    def models_dir(self) -> str:
        from engine import models_dir

        return str(models_dir())

    def resolve_model(self, arg: str) -> str:
        from engine import resolve_model_arg

        return str(resolve_model_arg(arg))

    def backends(self, n_threads: int = 0) -> BackendInfo:
        return backend_info(n_threads)

    def devices(self, refresh: bool = False) -> list[DeviceDesc]:
        from engine.backends import list_devices

        return [
            DeviceDesc(
                d.name,
                d.backend,
                d.description,
                d.total_bytes,
                d.free_bytes,
                tuple(d.caps),
                d.available,
                d.reason,
            )
            for d in list_devices(refresh)
        ]

    def hub(self) -> HubApi:
        return self._hub

    def remote(self) -> RemoteApi:
        return self._remote
