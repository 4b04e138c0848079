"""FakeEngine: the engine Protocols of app/engine_api.py with canned numbers, for fast widget
tests (Dangerzone `Dummy`).

Each fake subclasses its Protocol, so mypy checks every override; test_engine_api.py checks that
the fakes and the real adapter define the same members with the same signatures.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from app.dto import (
    FIT_NO,
    FIT_OK,
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
from app.engine_api import (
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
from app.errors import LoadCancelled
from app.machine import backend_info, process_rss
from app.remote_adapter import RemoteAdapter
from engine.errors import HubError

REPLY = "Hello! Here is some **bold** text and code:\n\n```python\nprint('hi')\n```\n\nDone."
N_LAYER = 4
# the fake model's bytes: token_embd, N_LAYER equal layers, the output head
EMBD_BYTES, LAYER_BYTES, HEAD_BYTES = 20_000, 15_000, 10_000
WEIGHTS_BYTES = EMBD_BYTES + N_LAYER * LAYER_BYTES + HEAD_BYTES
COMPUTE_BYTES, METADATA_BYTES = 300_000, 4_000
IMAGE_TOKENS = 64  # what the fake projector counts per image

FAKE_CPU = DeviceDesc("CPU", "CPU", "Fake CPU @ 3.0 GHz, numba target fake", 16 << 30, 8 << 30)
FAKE_GL0 = DeviceDesc(
    "GL0",
    "OpenGL",
    "llvmpipe (LLVM 15.0.7, 256 bits) (4.5 (Core Profile) Mesa 23.2.1)",
    8 << 30,
    6 << 30,
    ("GL 4.5", "compute"),
)
FAKE_GL0_MISSING = DeviceDesc(
    "GL0",
    "OpenGL",
    "EGL (Mesa)",
    None,
    None,
    (),
    False,
    "OpenGL 3.3 only: compute shaders need 4.3",
)


def fake_shares(
    params: LoadParams, kv: int, gpu: DeviceDesc | None, capacity: bool = False
) -> tuple[DeviceShare, ...]:
    """The CPU / GPU split of the fake model under -ngl (the engine's placement contract)."""
    n = params.n_gpu_layers if params.n_gpu_layers >= 0 else N_LAYER + 1
    if gpu is None or not gpu.available or n == 0:
        return (DeviceShare("CPU", WEIGHTS_BYTES, kv, COMPUTE_BYTES, N_LAYER),)
    on, head = min(n, N_LAYER), n > N_LAYER
    gpu_w, gpu_kv = on * LAYER_BYTES + (HEAD_BYTES if head else 0), kv // N_LAYER * on
    room = (gpu.free_bytes if gpu.free_bytes is not None else gpu.total_bytes) or 0
    need = gpu_w + gpu_kv + COMPUTE_BYTES
    verdict = (
        ""
        if not capacity
        else "unknown"
        if not room
        else "too big"
        if need > room
        else "tight"
        if need > 0.9 * room
        else "fits"
    )
    return (
        DeviceShare("CPU", WEIGHTS_BYTES - gpu_w, kv - gpu_kv, COMPUTE_BYTES, N_LAYER - on),
        DeviceShare(gpu.name, gpu_w, gpu_kv, COMPUTE_BYTES, on, room if capacity else 0, verdict),
    )


def fake_figures(
    params: LoadParams, kv: int, gpu: DeviceDesc | None, estimate: bool, **kw
) -> MemoryFigures:
    shares = fake_shares(params, kv, gpu, capacity=estimate)
    weights = sum(d.weights_bytes for d in shares)
    compute = sum(d.compute_bytes for d in shares)
    return MemoryFigures(
        weights_bytes=weights,
        kv_bytes=kv,
        compute_bytes=compute,
        kv_seq_capacity_bytes=kv // max(1, params.n_seq_max),
        metadata_bytes=METADATA_BYTES,
        total_bytes=weights + kv + compute + METADATA_BYTES,
        devices=shares,
        **kw,
    )


_WORK = np.linspace(0.0, 1.0, 1 << 16)


def spin(seconds: float) -> None:
    """Burn CPU the way the engine does: in native code (numpy here, numba and BLAS there) that
    releases the GIL, with short Python steps between calls. (Pure-bytecode spinning would
    measure CPython's GIL hand-off, which the real engine does not hold during compute.)"""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        np.sin(_WORK, out=np.empty_like(_WORK))


class FakeStream(ReplyStream):
    def __init__(
        self,
        text: str,
        n_prompt: int,
        delay: float,
        busy: bool = False,
        n_images: int = 0,
        encode_s: float = 0.0,
    ):
        self._words = text.split(" ")
        self._n_prompt, self._delay, self._busy = n_prompt, delay, busy
        self._n_images, self._encode_s = n_images, encode_s
        self._cancel = threading.Event()
        self.n_generated = 0

    def cancel(self) -> None:
        self._cancel.set()

    def __iter__(self) -> Iterator[ReplyStep]:
        t0 = time.perf_counter()
        for i in range(self._n_images):  # as the adapter's stream: a phase step, then the work
            yield ReplyStep("", None, 0, 0, phase=f"encoding image {i + 1} of {self._n_images}")
            if self._cancel.wait(self._encode_s):
                yield self._step("", "cancelled", t0)
                return
        for i, w in enumerate(self._words):
            if self._busy:
                spin(self._delay)
            if self._cancel.wait(0 if self._busy else self._delay):
                yield self._step("", "cancelled", t0)
                return
            self.n_generated = i + 1
            yield self._step(w if i == 0 else " " + w, None, t0)
        yield self._step("", "stop", t0)

    def _step(self, delta: str, reason: str | None, t0: float) -> ReplyStep:
        return ReplyStep(
            delta,
            reason,
            self._n_prompt,
            self.n_generated,
            0,
            5.0,
            (time.perf_counter() - t0) * 1000.0,
        )


class FakeSession(SessionApi):
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
    endpoint: str = ""
    projector: str

    def __init__(
        self,
        path: str,
        params: LoadParams,
        reply: str,
        delay: float,
        busy: bool = False,
        gpu: DeviceDesc | None = None,
    ):
        self.path, self.params, self.reply, self.delay, self.busy = path, params, reply, delay, busy
        self.gpu = gpu
        self.projector = params.mmproj  # a fake projector: each image counts IMAGE_TOKENS
        self.encode_s = 0.0  # how long each image "encodes" (tests of the encoding phase)
        self.name = Path(path).stem
        self.arch, self.n_params = "llama", 1_234_567
        self.n_ctx = self.n_ctx_seq = params.n_ctx  # one unified cache, as the chat pane sees it
        self.n_threads = params.n_threads or 2
        self.sha256 = "0" * 64
        self.template_source, self.template_name = "{{ fake }}", "fake"
        self.last_messages: list[dict] = []
        self.streams: list[FakeStream] = []
        self._used = 0

    def layers(self) -> list[TensorRow]:
        rows = [TensorRow(-1, "token_embd.weight", "Q8_0", (64, 300), 20400)]
        for i in range(N_LAYER):
            for t in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down"):
                rows.append(TensorRow(i, f"blk.{i}.{t}.weight", "Q4_1", (64, 64), 2560))
        return rows

    def memory(self) -> MemoryFigures:
        kv = self.params.n_ctx * N_LAYER * 2 * 64 * 2 * self.params.n_seq_max
        used = self._used * N_LAYER * 2 * 64 * 2
        per_seq = tuple([used] + [0] * (self.params.n_seq_max - 1))
        return fake_figures(
            self.params,
            kv,
            self.gpu,
            estimate=False,
            weights_resident_bytes=60_000,
            kv_used_bytes=used,
            kv_per_seq_used=per_seq,
            rss_bytes=process_rss(),
        )

    def count_tokens(self, messages: list[dict]) -> int:
        words = sum(len(m["content"].split()) + 4 for m in messages) + 1
        return words + IMAGE_TOKENS * sum(len(m.get("images", ())) for m in messages)

    def generate(self, messages: list[dict], sampling: SamplingSettings) -> FakeStream:
        self.last_messages = list(messages)
        n_prompt = self.count_tokens(messages)
        self._used = n_prompt + len(self.reply.split())
        # as the adapter: the images of the message being sent are encoded before the reply
        n_images = len(messages[-1].get("images", ())) if messages else 0
        s = FakeStream(self.reply, n_prompt, self.delay, self.busy, n_images, self.encode_s)
        self.streams.append(s)
        return s

    def start_server(self, settings: ServerSettings, on_log: LogFn) -> FakeServer:
        return FakeServer(settings, on_log)

    def close(self) -> None:
        pass


class FakeServer(ServerHandle):
    url: str
    port: int

    def __init__(self, settings: ServerSettings, on_log: LogFn):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                body = b'{"object": "list", "data": [{"id": "fake"}]}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                on_log(f"GET {self.path} 200")

            def log_message(self, *a):
                pass

        try:
            self._httpd = ThreadingHTTPServer((settings.host, settings.port), Handler)
        except OSError as e:
            raise OSError(f"port {settings.port} is already in use ({e.strerror})") from None
        self.port = self._httpd.server_address[1]
        self.url = f"http://{settings.host}:{self.port}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class FakeHub(HubApi):
    """Two canned repositories; `delays` slows a search text or an API call ("files", "fit"),
    `fail` makes a repository's calls raise HubError(reason). Downloads write GGUF-looking
    files under `root`, `chunks` steps of `step_s` each, honouring cancel between steps."""

    REPOS = {
        "alice/tiny-llama-GGUF": [
            ("tiny-llama-Q4_K_M.gguf", "Q4_K_M", 4_000_000),
            ("tiny-llama-Q8_0.gguf", "Q8_0", 7_000_000),
        ],
        "bob/mamba-GGUF": [("mamba-IQ4_XS.gguf", "IQ4_XS", 2_000_000)],
    }

    def __init__(self, root: str = "/nonexistent", chunks: int = 5, step_s: float = 0.01):
        self.root, self.chunks, self.step_s = Path(root), chunks, step_s
        self.delays: dict[str, float] = {}
        self.fail: dict[str, str] = {}  # repo_id -> HubError reason
        self.partial: dict[tuple[str, str], int] = {}  # chunks already downloaded
        self.calls: list[tuple[str, str, str | None]] = []  # (call, argument, token)

    def _call(self, what: str, key: str, token: str | None) -> None:
        self.calls.append((what, key, token))
        time.sleep(self.delays.get(key, self.delays.get(what, 0.0)))
        repo_id = key.split(":")[0]
        if repo_id in self.fail:
            raise HubError(f"{repo_id}: canned failure", self.fail[repo_id])

    def search(self, text: str, token: str | None) -> list[HubRepoInfo]:
        self._call("search", text, token)
        return [
            HubRepoInfo(r, 1000 * (i + 1), 10, False, len(files))
            for i, (r, files) in enumerate(self.REPOS.items())
            if text.lower() in r.lower()
        ]

    def files(self, repo_id: str, token: str | None) -> list[HubFileInfo]:
        self._call("files", repo_id, token)
        if repo_id not in self.REPOS:
            raise HubError(f"{repo_id}: no such repository", HubError.NOT_FOUND)
        return [
            HubFileInfo(repo_id, name, quant, size, 1, self._local(repo_id, name), i == 0)
            for i, (name, quant, size) in enumerate(self.REPOS[repo_id])
        ]

    def fit(self, repo_id: str, filename: str, token: str | None) -> HubFitInfo:
        self._call("fit", f"{repo_id}:{filename}", token)
        if "IQ4_XS" in filename:
            return HubFitInfo(repo_id, filename, FIT_OK, False, "architecture 'mamba'", "mamba")
        size = dict((n, s) for n, _q, s in self.REPOS[repo_id])[filename]
        verdict = FIT_OK if size < 5_000_000 else FIT_NO
        return HubFitInfo(
            repo_id,
            filename,
            verdict,
            True,
            "",
            "llama",
            1_234_567,
            2048,
            2048,
            True,
            size * 2,
            6_000_000,
            65_536,
        )

    def download(
        self,
        repo_id: str,
        filename: str,
        token: str | None,
        progress: DownloadProgressFn,
        cancel: threading.Event,
    ) -> str:
        self._call("download", f"{repo_id}:{filename}", token)
        size = dict((n, s) for n, _q, s in self.REPOS[repo_id])[filename]
        start = self.partial.get((repo_id, filename), 0)
        progress(0, size)
        for i in range(start, self.chunks):
            if cancel.is_set():
                raise HubError(f"{repo_id}: download cancelled", HubError.CANCELLED)
            time.sleep(self.step_s)
            self.partial[(repo_id, filename)] = i + 1
            progress(size * (i + 1) // self.chunks, size)
        path = self.root / repo_id.replace("/", "--") / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"GGUF" + bytes(64))
        self.partial.pop((repo_id, filename), None)
        return str(path)

    def discard(self, repo_id: str, filename: str, token: str | None) -> None:
        self.partial.pop((repo_id, filename), None)

    def cached_models(self) -> list[HubFileInfo]:
        return [
            HubFileInfo(r, n, q, s, 1, local)
            for r, files in self.REPOS.items()
            for n, q, s in files
            if (local := self._local(r, n))
        ]

    def _local(self, repo_id: str, filename: str) -> str | None:
        path = self.root / repo_id.replace("/", "--") / filename
        return str(path) if path.is_file() else None


class FakeEngine(EngineApi):
    def __init__(
        self,
        reply: str = REPLY,
        delay: float = 0.01,
        load_time: float = 0.05,
        busy: bool = False,
        hub: HubApi | None = None,
        devices: list[DeviceDesc] | None = None,
    ):
        self.reply, self.delay, self.load_time, self.busy = reply, delay, load_time, busy
        self.device_list = devices or [FAKE_CPU]  # add FAKE_GL0 for a GPU
        self.sessions: list[FakeSession] = []
        self._hub = hub or FakeHub()
        # remote servers are network only: the real client, against local test servers
        self._remote = RemoteAdapter()

    def inspect(self, path: str) -> LlmFileInfo:
        p = Path(path)
        if p.read_bytes()[:4] != b"GGUF":
            return LlmFileInfo(
                str(p), p.stem, file_size=p.stat().st_size, error="not a GGUF file (bad magic)"
            )
        return LlmFileInfo(
            str(p),
            p.stem,
            "llama",
            1_234_567,
            {"Q4_1": 60_000, "F32": 30_000},
            p.stat().st_size,
            2048,
            True,
            "gpt2",
            n_layer=N_LAYER,
        )

    def _gpu(self) -> DeviceDesc | None:
        return next((d for d in self.device_list if d.is_gpu and d.available), None)

    def estimate(self, path: str, params: LoadParams) -> MemoryFigures:
        kv = params.n_ctx * N_LAYER * 2 * 64 * 2 * params.n_seq_max
        return fake_figures(params, kv, self._gpu(), estimate=True)

    def load(
        self, path: str, params: LoadParams, progress: ProgressFn, cancel: threading.Event
    ) -> FakeSession:
        for i in range(5):
            if cancel.is_set():
                raise LoadCancelled("Loading cancelled")
            progress(i / 5, f"Loading layer {i}")
            spin(self.load_time / 5) if self.busy else time.sleep(self.load_time / 5)
        if Path(path).read_bytes()[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        s = FakeSession(path, params, self.reply, self.delay, self.busy, self._gpu())
        self.sessions.append(s)
        return s

    def starter_models(self) -> list[StarterModel]:
        return [StarterModel("smollm2-135m", "SmolLM2 135M Instruct, Q4_1", 90_000_000, None)]

    def pull(self, name: str, progress: PullProgressFn, cancel: threading.Event) -> str:
        for i in range(5):
            if cancel.is_set():
                raise LoadCancelled("Download cancelled")
            progress("download", i, 4)
            time.sleep(0.01)
        return "/nonexistent/" + name + ".gguf"

    def models_dir(self) -> str:
        return "/nonexistent"

    def resolve_model(self, arg: str) -> str:
        return arg

    def backends(self, n_threads: int = 0) -> BackendInfo:
        return backend_info(n_threads)

    def devices(self, refresh: bool = False) -> list[DeviceDesc]:
        return list(self.device_list)

    def hub(self) -> HubApi:
        return self._hub

    def remote(self) -> RemoteApi:
        return self._remote
