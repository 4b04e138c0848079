"""Remote OpenAI-compatible servers behind the app's Protocols (RemoteApi, ChatLlmApi), built
on engine.remote through the engine's public API.

Qt-free; connect(), poll() and a RemoteChat's stream block, so app/workers.py runs them on
QThreads. A remote reply comes out as the same ReplySteps a local one does, so the chat
controller, the StepBuffer and the chat view treat both alike.

Images go as OpenAI content parts, `image_url` with a base64 data URI, in the places of the
message's MEDIA_MARKERs: what llama-server and `ggstation serve` take (and turn back into
markers). Whether the model there reads images only the server knows; one that does not answers
4xx/5xx, which the reply's bubble then says in words.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from engine.errors import RemoteError

from .dto import (
    EndpointInfo,
    RemoteLoad,
    RemoteModelInfo,
    RemoteServerState,
    RemoteSlotRow,
    ReplyStep,
    SamplingSettings,
)
from .engine_api import ChatLlmApi, RemoteApi, ReplyStream
from .vision_files import MEDIA_MARKER

if TYPE_CHECKING:
    from engine import ChatStream, RemoteEndpoint, ServerInfo

# A remote server tokenizes with a vocabulary we do not have: the prompt's size is estimated
# from its characters (English text runs ~4 characters a token; 3 leaves room for code and
# other languages). The estimate only decides which old turns to leave out when the server
# says its context size; the server itself rejects a prompt that does not fit.
CHARS_PER_TOKEN = 3
TOKENS_PER_MESSAGE = 4  # the chat template's markers around each message
# An image's tokens depend on the server's projector (gemma3 256, a tiled idefics3 photo over
# 1000); this guess, like the characters', only decides which old turns to leave out.
TOKENS_PER_IMAGE = 256

# the formats OpenAI's image_url takes, by their first bytes; llama-server decodes whatever
# stb_image reads, whatever the URI says
_MIME_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
)


def _endpoint(endpoint: EndpointInfo, api_key: str) -> RemoteEndpoint:
    from engine import RemoteEndpoint

    return RemoteEndpoint(endpoint.url, api_key, endpoint.name)


class RemoteReplyStream(ReplyStream):
    """Wraps engine.remote's ChatStream: yields ReplySteps, forwards cancel()."""

    def __init__(self, stream: ChatStream, n_images: int = 0):
        self._stream = stream
        self._n_images = n_images

    def __iter__(self) -> Iterator[ReplyStep]:
        try:
            yield from self._steps()
        except RemoteError as e:
            if self._n_images and e.status >= 400:
                raise RemoteError(_refused_images(e, self._n_images), e.reason, e.status) from e
            raise

    def _steps(self) -> Iterator[ReplyStep]:
        for d in self._stream:
            yield ReplyStep(
                text_delta=d.text,
                finish_reason=d.finish_reason,
                n_prompt=d.n_prompt,
                n_generated=d.n_generated,
                n_cached=d.n_cached,
                t_prompt_ms=d.t_prompt_ms,
                t_gen_ms=d.t_gen_ms,
            )

    def cancel(self) -> None:
        self._stream.cancel()


class RemoteChat(ChatLlmApi):
    """One model on one remote server, as the chat pane uses it."""

    path: str
    name: str
    n_ctx: int
    n_ctx_seq: int
    sha256: str
    template_source: str
    template_name: str
    endpoint: str
    projector: str  # not a file: images go to the server, whose model may or may not read them

    def __init__(self, endpoint: EndpointInfo, api_key: str, model: str, server: RemoteServerState):
        self._endpoint, self._key, self._server = endpoint, api_key, server
        self.path = self.name = model
        listed = next((m for m in server.models if m.id == model), None)
        self.n_ctx = self.n_ctx_seq = (listed.n_ctx if listed else 0) or server.n_ctx
        self.sha256, self.template_source, self.template_name = "", "", "server"
        self.endpoint = endpoint.url
        self.projector = f"the server's ({endpoint.url})"

    def count_tokens(self, messages: list[dict]) -> int:
        chars = sum(len(json.dumps(m.get("content", ""), ensure_ascii=False)) for m in messages)
        images = sum(len(m.get("images", ())) for m in messages)
        return (
            chars // CHARS_PER_TOKEN
            + TOKENS_PER_MESSAGE * len(messages)
            + TOKENS_PER_IMAGE * images
        )

    def generate(self, messages: list[dict], sampling: SamplingSettings) -> RemoteReplyStream:
        from engine import RemoteSampling, stream_chat

        s = sampling
        fields = RemoteSampling(
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_tokens,
            seed=s.seed if s.seed >= 0 else None,
            top_k=s.top_k,
            min_p=s.min_p,
            repeat_penalty=s.repeat_penalty,
        )
        stream = stream_chat(
            _endpoint(self._endpoint, self._key),
            self.name,
            [openai_message(m) for m in messages],
            fields,
            _server_info(self._server),
        )
        return RemoteReplyStream(stream, sum(len(m.get("images", ())) for m in messages))


def openai_message(message: dict) -> dict:
    """A chat message as OpenAI's API takes it: one with images becomes content parts, text
    and image_url in the order of its MEDIA_MARKERs (the app puts them first, as llama-server
    joins [images..., text]); marker-free text that happens to hold the marker string keeps
    it, with the images first."""
    images = message.get("images") or ()
    out = {k: v for k, v in message.items() if k != "images"}
    if not images:
        return out
    text = str(message.get("content", ""))
    pieces = text.split(MEDIA_MARKER)
    if len(pieces) != len(images) + 1:  # not the app's markers: images first, text as it is
        pieces = [""] * len(images) + [text]
    parts: list[dict[str, Any]] = []
    for piece, data in zip(pieces, images, strict=False):
        if piece:
            parts.append({"type": "text", "text": piece})
        parts.append({"type": "image_url", "image_url": {"url": data_uri(data)}})
    if pieces[-1]:
        parts.append({"type": "text", "text": pieces[-1]})
    out["content"] = parts
    return out


def data_uri(data: bytes) -> str:
    """`data:<mime>;base64,...` of an image file's bytes."""
    mime = next((m for magic, m in _MIME_MAGIC if data.startswith(magic)), "")
    if not mime and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        mime = "image/webp"
    return f"data:{mime or 'application/octet-stream'};base64,{base64.b64encode(data).decode()}"


def _refused_images(e: RemoteError, n_images: int) -> str:
    what = "the image" if n_images == 1 else f"the {n_images} images"
    return (
        f"The server did not take {what}: the model there may read text only (llama-server "
        f"reads images only when started with --mmproj, or -hf of a repository with one). "
        f"It said: {e}"
    )


def _server_info(server: RemoteServerState) -> ServerInfo:
    from engine import ServerInfo

    return ServerInfo(
        kind=server.kind,
        n_ctx=server.n_ctx,
        total_slots=server.total_slots,
        has_slots=server.has_slots,
        has_metrics=server.has_metrics,
    )


class RemoteAdapter(RemoteApi):
    """engine.remote behind the RemoteApi Protocol."""

    def normalize_url(self, text: str) -> str:
        from engine import normalize_url

        return normalize_url(text)

    def connect(self, endpoint: EndpointInfo, api_key: str) -> RemoteServerState:
        from engine import RemoteClient

        with RemoteClient(_endpoint(endpoint, api_key)) as client:
            models = client.list_models()  # first: a wrong key or a non-OpenAI server fails here
            info = client.probe()
        return RemoteServerState(
            url=endpoint.url,
            kind=info.kind,
            models=tuple(RemoteModelInfo(m.id, m.n_ctx) for m in models),
            n_ctx=info.n_ctx,
            total_slots=info.total_slots,
            has_slots=info.has_slots,
            has_metrics=info.has_metrics,
        )

    def open_chat(
        self, endpoint: EndpointInfo, api_key: str, model: str, server: RemoteServerState
    ) -> RemoteChat:
        return RemoteChat(endpoint, api_key, model, server)

    def poll(self, endpoint: EndpointInfo, api_key: str, server: RemoteServerState) -> RemoteLoad:
        from engine import RemoteClient

        slots: tuple[RemoteSlotRow, ...] = ()
        total: float | None = None
        processing = 0
        with RemoteClient(_endpoint(endpoint, api_key)) as client:
            if server.has_slots:
                slots = tuple(
                    RemoteSlotRow(s.id, s.n_ctx, s.is_processing, s.n_prompt_tokens + s.n_decoded)
                    for s in client.slots()
                )
            if server.has_metrics:
                m = client.metrics()
                total, processing = m.tokens_predicted_total, int(m.requests_processing)
        return RemoteLoad(endpoint.url, slots, total, None, processing)
