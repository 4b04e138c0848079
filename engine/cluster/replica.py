"""One replica of a model's deployment: one engine context and its single-model HTTP app,
answering the requests the ingress forwards through a Ray deployment handle.

The replica runs the very routes a plain `ggstation serve -m` runs (engine/server/http.py),
in process: a forwarded request becomes an ASGI call, and the app's messages go back as a
stream, its head (`ResponseHead`) first and then each body chunk as the app sends it, so an
SSE stream crosses Ray event by event. When the ingress stops reading (its client left), the
app sees a disconnect and the scheduler frees the slot.

No Ray import: Serve wraps this class in a deployment (engine/cluster/router.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EngineError
from .plan import ReplicaPlan

if TYPE_CHECKING:
    from ..scheduler import Scheduler

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
INGRESS_ONLY_ENV = ("LLAMA_API_KEY", "LLAMA_ARG_API_KEY_FILE")


class ModelFileError(EngineError):
    """The model file on this node is not the one the plan names (its sha256 differs)."""


@dataclass(frozen=True)
class ForwardedRequest:
    """An HTTP request as the ingress received it (headers lower-case, as ASGI has them)."""

    method: str
    path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


@dataclass(frozen=True)
class ResponseHead:
    status: int
    headers: tuple[tuple[bytes, bytes], ...]

    @property
    def content_type(self) -> str:
        return next(
            (v.decode("latin-1") for k, v in self.headers if k.lower() == b"content-type"), ""
        )


def verify_sha256(path: Path, expected: str) -> None:
    """Raises ModelFileError unless `path`'s sha256 is `expected` ("" checks nothing)."""
    if not expected:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise ModelFileError(
            f"{path}: sha256 {digest.hexdigest()} on this node, expected {expected}: the file "
            "differs from the one the model was planned with (a different copy, or a partial one); "
            "the replica does not start"
        )


class ModelReplica:
    """The deployment's class: built once per replica by Serve, with the model's plan."""

    def __init__(self, plan: ReplicaPlan):
        from ..server.startup import in_process_server

        self.plan = plan
        self.scheduler: Scheduler | None = None
        for (
            name
        ) in INGRESS_ONLY_ENV:  # the ingress checks keys; a replica inheriting them would refuse it
            os.environ.pop(name, None)
        self.scheduler, self.app = in_process_server(
            list(plan.argv), verify=lambda path: verify_sha256(path, plan.sha256)
        )
        log.info(
            "replica of %s ready (%d slots, %d threads)", plan.name, plan.n_slots, plan.n_threads
        )

    def check_health(self) -> None:
        """Serve's health check: a replica whose scheduler loop died is replaced."""
        if self.scheduler is None or not self.scheduler.looping:
            raise EngineError(f"the scheduler of {self.plan.name} is not running")

    async def handle_request(self, req: ForwardedRequest) -> AsyncIterator[ResponseHead | bytes]:
        """The app's answer: a ResponseHead, then body chunks as the app sends them."""
        messages: asyncio.Queue[dict | None] = asyncio.Queue()
        gone = asyncio.Event()
        delivered = False

        async def receive() -> dict:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": req.body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            await messages.put(message)

        async def run() -> None:
            try:
                await self.app(_scope(req), receive, send)
            finally:
                await messages.put(None)

        task = asyncio.ensure_future(run())
        try:
            while (message := await messages.get()) is not None:
                if message["type"] == "http.response.start":
                    yield ResponseHead(message["status"], tuple(message.get("headers", ())))
                elif message["type"] == "http.response.body":
                    if message.get("body"):
                        yield bytes(message["body"])
                    if not message.get("more_body"):
                        break
            await task  # the app's own exception, if it raised one
        finally:
            gone.set()  # the ingress stopped reading: the app sees its client leave
            if not task.done():
                try:  # the app ends its response on the disconnect (cancelling the slot) ...
                    await asyncio.wait_for(asyncio.shield(task), 2.0)
                except Exception:  # ... or is cancelled
                    task.cancel()

    def __del__(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop(join_s=2.0)


def _scope(req: ForwardedRequest) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": req.method,
        "scheme": "http",
        "path": req.path,
        "raw_path": req.path.encode(),
        "root_path": "",
        "query_string": req.query_string,
        "headers": list(req.headers),
        "client": ("ray-ingress", 0),
        "server": ("replica", 0),
    }
