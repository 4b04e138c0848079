"""A local HTTP server of the Hugging Face Hub's shape, for tests that never touch the internet.

It answers the routes huggingface_hub's client and engine/hub/client.py really call, the way the Hub
does:

    GET  /api/models?search=&filter=gguf&limit=&expand=...   search (siblings: names only)
    GET  /api/models/{repo}[/revision/{rev}][?blobs=true]    model info (sizes, lfs sha256, sha)
    GET  /api/models/{repo}/tree/{rev}[?recursive=true]      file listing with sizes
    GET  /api/models/{repo}/refs                             branches
    HEAD/GET /{repo}/resolve/{rev}/{path}                    302 to the "CDN" with X-Repo-Commit,
                                                             X-Linked-Etag, X-Linked-Size, ETag
    HEAD/GET /cdn/{sha256}                                   the bytes: ETag, Content-Length,
                                                             Accept-Ranges, Range -> 206
The "CDN" is this server under the name `localhost`: another origin than `url` (127.0.0.1), as
the Hub's CDN is, so clients stop a HEAD at the 302 and drop the token on the redirect.
Errors carry the headers the client reads: 404 X-Error-Code RepoNotFound / RevisionNotFound /
EntryNotFound; a gated repo's files give 401 (no token) or 403 (another token) GatedRepo; a
private repo gives 401 RepoNotFound everywhere without its token.

Usage (a pytest fixture would wrap this):

    server = hub_server.start(tmp_path, repos={"user/repo": {"m-Q4_K_M.gguf": path_or_bytes}})
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    ...
    server.stop()

Faults for tests: `server.drops[filename] = [n, ...]` ends the next GET of that file after n
body bytes (one entry per GET); `server.chunk_delay_s` slows every body; `server.log` records
(method, path, range, status, body bytes sent) for each request. `gate = server.gate(filename, n)`
holds the next GET of that file after n body bytes until `gate.release()` (`gate.reached` is set
once those n bytes are out): a test stops a download mid-file without racing a chunk delay.

A hostile or compromised Hub: a file name in `repos` is listed as `rfilename` as it is
("../../x.gguf", "/abs/x.gguf"); `start(..., commits={repo_id: sha})` sets the commit the
listing gives (any string: "../../x"), `ids={repo_id: id}` the repository id it gives.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlparse

_CHUNK = 1 << 16


@dataclass
class HubRepo:
    """One model repository: files by path, and who may read them."""

    repo_id: str
    files: dict[str, Path]  # path in the repo -> file on disk
    gated: bool = False
    private: bool = False
    downloads: int = 0
    likes: int = 0
    sha: str = ""
    listed_id: str = ""  # the "id" the listing gives; the repo_id when empty
    _meta: dict[str, tuple[int, str, str]] = field(
        default_factory=dict
    )  # path -> (size, sha256, git oid)

    def __post_init__(self):
        self.sha = self.sha or hashlib.sha1(self.repo_id.encode()).hexdigest()

    def meta(self, path: str) -> tuple[int, str, str]:
        if path not in self._meta:
            data = self.files[path]
            digest = hashlib.sha256()
            with open(data, "rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
            oid = hashlib.sha1(f"{self.repo_id}/{path}".encode()).hexdigest()
            self._meta[path] = (data.stat().st_size, digest.hexdigest(), oid)
        return self._meta[path]


@dataclass
class Gate:
    """A body held after `after` bytes: `reached` once they are sent, then waits for release()."""

    after: int
    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


class HubServer:
    """The server; `url` is what HF_ENDPOINT takes."""

    def __init__(
        self, repos: dict[str, HubRepo], token: str = "hf_" + "t" * 34, cdn_host: str = "localhost"
    ):
        self.repos = repos
        self.token = token
        self.drops: dict[str, list[int]] = {}
        self.chunk_delay_s = 0.0
        self.gates: dict[str, Gate] = {}
        self.log: list[tuple[str, str, str | None, int, int]] = []
        self.connections: set = (
            set()
        )  # open client sockets, closed by stop() (no keep-alive survives)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self.cdn_url = f"http://{cdn_host}:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="hub-server", daemon=True
        )
        self._thread.start()

    def gate(self, filename: str, after: int) -> Gate:
        """Holds the next GET of `filename` after `after` body bytes until Gate.release()."""
        gate = self.gates[filename] = Gate(after)
        return gate

    def stop(self) -> None:
        """Stops listening and drops every open connection: the Hub is gone."""
        for gate in self.gates.values():  # a held body never outlives the server
            gate.release()
        self._httpd.shutdown()
        self._httpd.server_close()
        for sock in list(self.connections):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def blob(self, sha256: str) -> tuple[HubRepo, str] | None:
        for repo in self.repos.values():
            for path in repo.files:
                if repo.meta(path)[1] == sha256:
                    return repo, path
        return None

    def bytes_sent(self, prefix: str = "/cdn/") -> int:
        return sum(n for _m, path, _r, _s, n in self.log if path.startswith(prefix))


def start(
    tmpdir: str | Path,
    repos: dict[str, dict[str, Path | bytes]],
    *,
    gated: tuple[str, ...] = (),
    private: tuple[str, ...] = (),
    token: str | None = None,
    commits: dict[str, str] | None = None,
    ids: dict[str, str] | None = None,
) -> HubServer:
    """Serves `repos` ({repo_id: {path in repo: file path or bytes}}); bytes are written under
    tmpdir (named by a hash: a hostile name never picks where). Returns the running server
    (stop() it)."""
    tmpdir = Path(tmpdir)
    built = {}
    for repo_id, files in repos.items():
        on_disk = {}
        for name, data in files.items():
            if isinstance(data, bytes):
                p = tmpdir / "hub-payloads" / hashlib.sha1(f"{repo_id}/{name}".encode()).hexdigest()
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)
                data = p
            on_disk[name] = Path(data)
        built[repo_id] = HubRepo(
            repo_id,
            on_disk,
            gated=repo_id in gated,
            private=repo_id in private,
            sha=(commits or {}).get(repo_id, ""),
            listed_id=(ids or {}).get(repo_id, ""),
        )
    return HubServer(built, token=token or "hf_" + "t" * 34)


def _handler(server: HubServer):
    class Handler(_HubHandler):
        hub = server

    return Handler


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: HubServer

    def log_message(self, format, *args):  # quiet
        pass

    def setup(self):
        super().setup()
        self.hub.connections.add(self.connection)

    def finish(self):
        self.hub.connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    # -- plumbing ------------------------------------------------------------------------
    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        # recorded before the body goes out: a client that has the response may read the log
        self._record(status, len(body) if self.command != "HEAD" else 0)
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _error(
        self, status: int, code: str, message: str, extra: dict[str, str] | None = None
    ) -> None:
        headers = {"X-Error-Code": code, "X-Error-Message": message, **(extra or {})}
        self._json({"error": message}, status, headers)

    def _record(self, status: int, n: int) -> None:
        self.hub.log.append(
            (self.command, urlparse(self.path).path, self.headers.get("Range"), status, n)
        )

    def _authorized(self) -> bool:
        return self.headers.get("Authorization", "") == f"Bearer {self.hub.token}"

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        url = urlparse(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        try:
            if path == "/api/models":
                return self._search(query)
            if path.startswith("/api/models/"):
                return self._api(path[len("/api/models/") :], query)
            if path.startswith("/cdn/"):
                return self._cdn(path[len("/cdn/") :])
            if "/resolve/" in path:
                return self._resolve(path.lstrip("/"))
            self._error(404, "NotFound", "Not Found")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- API -------------------------------------------------------------------------------
    def _repo(self, repo_id: str) -> HubRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and not self._authorized()):
            status = 401 if repo is not None or not self._authorized() else 404
            self._error(status, "RepoNotFound", "Repository not found")
            return None
        return repo

    def _info(self, repo: HubRepo, blobs: bool) -> dict:
        siblings = []
        for name in repo.files:
            entry: dict = {"rfilename": name}
            if blobs:
                size, sha256, oid = repo.meta(name)
                entry.update(
                    size=size, blobId=oid, lfs={"size": size, "sha256": sha256, "pointerSize": 134}
                )
            siblings.append(entry)
        listed_id = repo.listed_id or repo.repo_id
        return {
            "_id": repo.sha[:24],
            "id": listed_id,
            "modelId": listed_id,
            "sha": repo.sha,
            "private": repo.private,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "downloads": repo.downloads,
            "likes": repo.likes,
            "tags": ["gguf"],
            "lastModified": "2025-01-01T00:00:00.000Z",
            "createdAt": "2025-01-01T00:00:00.000Z",
            "siblings": siblings,
        }

    def _search(self, query: dict) -> None:
        text = (query.get("search") or [""])[0].lower()
        limit = int((query.get("limit") or ["1000"])[0])
        found = [
            r
            for r in self.hub.repos.values()
            if text in r.repo_id.lower()
            and not r.private
            and any(n.endswith(".gguf") for n in r.files)
        ]
        found.sort(key=lambda r: -r.downloads)
        self._json([self._info(r, blobs=False) for r in found[:limit]])

    def _api(self, rest: str, query: dict) -> None:
        for marker in ("/revision/", "/tree/", "/refs"):
            if marker in rest:
                repo_id, _, tail = rest.partition(marker)
                break
        else:
            repo_id, marker, tail = rest, "", ""
        repo = self._repo(repo_id)
        if repo is None:
            return
        rev = tail.split("/", 1)[0] if tail else "main"
        if marker in ("/revision/", "/tree/") and rev not in ("main", repo.sha):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if marker == "/refs":
            return self._json(
                {
                    "branches": [
                        {"name": "main", "ref": "refs/heads/main", "targetCommit": repo.sha}
                    ],
                    "tags": [],
                    "converts": [],
                }
            )
        if marker == "/tree/":
            out = []
            for name in repo.files:
                size, sha256, oid = repo.meta(name)
                out.append(
                    {
                        "type": "file",
                        "oid": oid,
                        "size": size,
                        "path": name,
                        "lfs": {"oid": sha256, "size": size, "pointerSize": 134},
                    }
                )
            return self._json(out)
        self._json(self._info(repo, blobs=bool(query.get("blobs"))))

    # -- files -------------------------------------------------------------------------------
    def _resolve(self, rest: str) -> None:
        repo_part, _, tail = rest.partition("/resolve/")
        rev, _, name = tail.partition("/")
        repo = self._repo(repo_part)
        if repo is None:
            return
        if repo.gated and not self._authorized():
            status = 403 if self.headers.get("Authorization") else 401
            return self._error(
                status, "GatedRepo", f"Access to model {repo.repo_id} is restricted."
            )
        if rev not in ("main", repo.sha):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        if name not in repo.files:
            return self._error(
                404, "EntryNotFound", f"{name} does not exist", {"X-Repo-Commit": repo.sha}
            )
        size, sha256, oid = repo.meta(name)
        self._send(
            302,
            b"",
            {
                "Location": f"{self.hub.cdn_url}/cdn/{sha256}?name={quote(name)}",
                "X-Repo-Commit": repo.sha,
                "X-Linked-Etag": f'"{sha256}"',
                "X-Linked-Size": str(size),
                "ETag": f'"{oid}"',
                "Accept-Ranges": "bytes",
            },
            content_type="text/plain",
        )

    def _cdn(self, sha256: str) -> None:
        found = self.hub.blob(sha256)
        if found is None:
            return self._error(404, "NotFound", "no such blob")
        repo, name = found
        size = repo.meta(name)[0]
        start, stop = 0, size  # [start, stop)
        status = 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            a, _, b = rng[len("bytes=") :].partition("-")
            start, stop = int(a), (int(b) + 1 if b else size)
            stop = min(stop, size)
            if start >= size:
                return self._send(416, b"", {"Content-Range": f"bytes */{size}"}, "text/plain")
            status = 206
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{sha256}"')
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        self.end_headers()
        if self.command == "HEAD":
            return self._record(status, 0)
        drops = self.hub.drops.get(name)
        cut = drops.pop(0) if drops else None
        gate = self.hub.gates.pop(name, None)
        sent = self._body(repo.files[name], start, stop, cut, gate)
        self._record(status, sent)

    def _body(
        self, path: Path, start: int, stop: int, cut: int | None, gate: Gate | None = None
    ) -> int:
        """Writes bytes [start, stop) of `path`; with `cut`, ends the connection after cut bytes;
        with `gate`, stops after gate.after bytes until it is released."""
        sent = 0
        with open(path, "rb") as f:
            f.seek(start)
            while sent < stop - start:
                n = min(_CHUNK, stop - start - sent)
                if gate is not None:
                    if sent == gate.after:
                        self.wfile.flush()
                        gate.reached.set()
                        gate.released.wait(timeout=60)  # a failed test never holds it for good
                        gate = None
                    else:
                        n = min(n, gate.after - sent)
                if cut is not None:
                    n = min(n, cut - sent)
                    if n <= 0:
                        self.close_connection = True
                        self.wfile.flush()
                        self.connection.shutdown(2)
                        return sent
                chunk = f.read(n)
                self.wfile.write(chunk)
                sent += len(chunk)
                if self.hub.chunk_delay_s:
                    time.sleep(self.hub.chunk_delay_s)
        return sent
