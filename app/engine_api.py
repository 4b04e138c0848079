"""What the app needs of an engine, as Protocols: the seam between app/ and engine/.

`EngineAdapter` (app/engine_adapter.py) implements these over the engine's public API and
`tests/gui/fake_engine.py` implements them with canned numbers. Both subclass the Protocols
explicitly, so mypy checks every override, and tests/gui/test_engine_api.py checks that they
define every member with the Protocol's signature. Widgets, workers and AppContext are typed
against these names only, never against either implementation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Protocol

from .dto import (
    BackendInfo,
    DeviceDesc,
    EndpointInfo,
    HubFileInfo,
    HubFitInfo,
    HubRepoInfo,
    LlmFileInfo,
    LoadParams,
    MemoryFigures,
    RemoteLoad,
    RemoteServerState,
    ReplyStep,
    SamplingSettings,
    ServerSettings,
    StarterModel,
    TensorRow,
)

ProgressFn = Callable[[float, str], None]  # (fraction 0..1, what is happening)
PullProgressFn = Callable[[str, int, int], None]  # (phase, done, total)
LogFn = Callable[[str], None]  # one line per HTTP request; called from server threads
DownloadProgressFn = Callable[[int, int], None]  # (bytes done, bytes total) over all parts


class ReplyStream(Protocol):
    """One reply being generated: iterate it from a worker thread; cancel() from any thread."""

    def __iter__(self) -> Iterator[ReplyStep]: ...

    def cancel(self) -> None: ...


class ServerHandle(Protocol):
    """A running HTTP server that shares the loaded LLM."""

    url: str
    port: int

    def stop(self) -> None: ...


class ChatLlmApi(Protocol):
    """What the chat pane needs of an LLM: one loaded here (SessionApi) or a remote server's
    (app/remote_adapter.py). generate() may block; count_tokens() is cheap."""

    path: str  # the GGUF file; for a remote model, its id
    name: str  # the file's stem, as the window title shows it; for a remote model, its id
    n_ctx: int  # the whole KV cache, all slots together (a remote model: as n_ctx_seq)
    n_ctx_seq: (
        int  # what one conversation can use; 0: not known (a remote server that does not say)
    )
    sha256: str  # of the GGUF, for the replay record ('' for a remote model)
    template_source: str  # the chat template text in use ('' when the server applies its own)
    template_name: str  # 'gguf' for the model's own template, else the built-in's name
    endpoint: str  # '' for a model loaded here; else the remote server's base URL
    # the vision projector (mmproj) loaded with it, '' when it reads no images. With one, a
    # message dict may carry "images": its image files' bytes, in the order of the
    # MEDIA_MARKERs (app/vision_files.py) in its content; count_tokens counts their tokens and
    # generate's stream yields a ReplyStep with `phase` set while it encodes each
    projector: str

    def count_tokens(self, messages: list[dict]) -> int: ...

    def generate(self, messages: list[dict], sampling: SamplingSettings) -> ReplyStream: ...


class SessionApi(ChatLlmApi, Protocol):
    """A loaded LLM, shared by the chat pane and the server. Methods may block: call them from
    a worker thread (memory() and count_tokens() are cheap enough for the GUI thread)."""

    arch: str
    n_params: int
    n_threads: int

    def layers(self) -> list[TensorRow]: ...

    def memory(self) -> MemoryFigures: ...

    def start_server(self, settings: ServerSettings, on_log: LogFn) -> ServerHandle: ...

    def close(self) -> None: ...


class HubApi(Protocol):
    """The Hugging Face Hub (engine.hub.client): search, list, fit before download, download into the
    Hugging Face cache. Every method blocks: call it from a worker thread. Failures raise
    engine.errors.HubError, whose `reason` (AUTH, OFFLINE, NOT_FOUND, CANCELLED, DISK_FULL, ...)
    says what to offer. `token` None: the library's own (HF_TOKEN, or `hf auth login`'s file)."""

    def search(self, text: str, token: str | None) -> list[HubRepoInfo]: ...

    def files(self, repo_id: str, token: str | None) -> list[HubFileInfo]:
        """The repository's GGUF model files with sizes (one API call)."""
        ...

    def fit(self, repo_id: str, filename: str, token: str | None) -> HubFitInfo:
        """Reads the file's header only (HTTP ranges), never the weights."""
        ...

    def download(
        self,
        repo_id: str,
        filename: str,
        token: str | None,
        progress: DownloadProgressFn,
        cancel: threading.Event,
    ) -> str:
        """Returns the first part's path. Once `cancel` is set: HubError(CANCELLED), and the
        partial file is kept, so that the next download() resumes it."""
        ...

    def discard(self, repo_id: str, filename: str, token: str | None) -> None:
        """Deletes what a cancelled download left; a complete file is kept."""
        ...

    def cached_models(self) -> list[HubFileInfo]:
        """The complete GGUF models in the Hugging Face cache."""
        ...


class RemoteApi(Protocol):
    """Remote OpenAI-compatible servers (engine.remote). connect() and poll() block: call them
    from a worker thread; they raise engine.errors.RemoteError, whose message names the server."""

    def normalize_url(self, text: str) -> str:
        """The base URL from what a user typed; RemoteError(BAD_URL) when it is not one."""
        ...

    def connect(self, endpoint: EndpointInfo, api_key: str) -> RemoteServerState:
        """Lists the models (GET /v1/models) and probes /props."""
        ...

    def open_chat(
        self, endpoint: EndpointInfo, api_key: str, model: str, server: RemoteServerState
    ) -> ChatLlmApi:
        """A chat LLM for the chat pane; cheap, nothing is sent until it generates."""
        ...

    def poll(self, endpoint: EndpointInfo, api_key: str, server: RemoteServerState) -> RemoteLoad:
        """The server's slots and counters, for what it serves of /slots and /metrics."""
        ...


class EngineApi(Protocol):
    """Everything the app asks of an engine before and while loading. Every method may block."""

    def inspect(self, path: str) -> LlmFileInfo: ...

    def estimate(self, path: str, params: LoadParams) -> MemoryFigures: ...

    def load(
        self, path: str, params: LoadParams, progress: ProgressFn, cancel: threading.Event
    ) -> SessionApi:
        """Raises LoadCancelled once `cancel` is set; nothing stays loaded then."""
        ...

    def starter_models(self) -> list[StarterModel]: ...

    def pull(self, name: str, progress: PullProgressFn, cancel: threading.Event) -> str:
        """Downloads a starter model; returns its path. Raises LoadCancelled once cancelled."""
        ...

    def models_dir(self) -> str: ...

    def resolve_model(self, arg: str) -> str:
        """A `-m` value: an existing path, or the name of a downloaded starter model."""
        ...

    def backends(self, n_threads: int = 0) -> BackendInfo: ...

    def devices(self, refresh: bool = False) -> list[DeviceDesc]:
        """Every compute device, the CPU first (engine.backends.list_devices); found once, then
        cached; `refresh` looks again (a GPU probe may take a moment: call from a worker)."""
        ...

    def hub(self) -> HubApi:
        """The Hugging Face Hub client; cheap (no network, no import) on the GUI thread."""
        ...

    def remote(self) -> RemoteApi:
        """The client of remote servers; cheap on the GUI thread."""
        ...
