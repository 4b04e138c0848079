"""Router scheduling without processes: children are stand-ins that come up in a few ms, so the
queue rules of llama-server's router (FIFO, one entry per model, a busy or wanted model is never
stopped, a leaving client gives its place up) are checked quickly and deterministically."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from engine.errors import ModelLimitError, RequestCancelled, RouterError
from engine.router.supervisor import ModelStatus, Router


class _Pipe:
    def __init__(self, proc: FakeProc | None = None):
        self.proc = proc

    def write(self, data: bytes) -> int:
        if self.proc is not None and data.strip() == b"exit":
            self.proc.returncode = 0
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeProc:
    """Enough of subprocess.Popen for the router: exits on "exit", terminate or kill."""

    pid = 0

    def __init__(self):
        self.returncode: int | None = None
        self.stdin = _Pipe(self)
        self.stdout = _Pipe()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = time.monotonic() + (timeout or 5)
        while self.returncode is None:
            if time.monotonic() > deadline:
                import subprocess

                raise subprocess.TimeoutExpired("fake", timeout or 5)
            time.sleep(0.005)
        return self.returncode

    def terminate(self) -> None:
        self.returncode = -15

    def kill(self) -> None:
        self.returncode = -9


class FakeRouter(Router):
    """Spawns stand-ins that are ready after `ready_s` (or fail with `fail` exit codes)."""

    ready_s = 0.02
    fail: dict[str, int] = {}

    def __init__(self, names, **kw):
        super().__init__({n: Path(f"/models/{n}.gguf") for n in names}, fake_timing=False, **kw)
        self.spawned: list[str] = []

    def _popen(self, child, cmd, env):
        proc = FakeProc()
        self.spawned.append(child.name)
        threading.Timer(self.ready_s, self._come_up, (child, proc)).start()
        return proc

    def _watch(self, child, proc):
        pass

    def _come_up(self, child, proc):
        deadline = time.monotonic() + 2
        while (
            child.proc is not proc and time.monotonic() < deadline
        ):  # _spawn stores it after _popen
            time.sleep(0.002)
        if child.proc is not proc or proc.returncode is not None:
            return
        if child.name in self.fail:
            proc.returncode = self.fail[child.name]
            return
        self._on_message(child, b'{"event": "ready"}')


@pytest.fixture
def make():
    routers = []

    def _make(names=("a", "b", "c"), **kw):
        r = FakeRouter(names, **kw).start()
        routers.append(r)
        return r

    yield _make
    for r in routers:
        r.stop()


def status(router, name):
    return router.get(name).status


def wait_for(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


class Bg:
    def __init__(self, fn):
        self.result = self.error = None
        self.done_at = 0.0
        self.t = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.t.start()

    def _run(self, fn):
        try:
            self.result = fn()
        except Exception as e:  # noqa: BLE001 - the test inspects it
            self.error = e
        self.done_at = time.monotonic()

    def join(self, timeout=10):
        self.t.join(timeout)
        assert not self.t.is_alive(), "background call did not finish"
        return self


def use(router, name, hold=0.0, **kw):
    """acquire, hold the model busy a while, release (one proxied request)."""
    child = router.acquire(name, **kw)
    time.sleep(hold)
    router.release(child)
    return child


def test_busy_model_is_not_evicted_the_request_waits(make):
    r = make(models_max=1)
    a = r.acquire("a")
    waiter = Bg(lambda: use(r, "b"))
    time.sleep(0.2)
    assert status(r, "a") is ModelStatus.LOADED and status(r, "b") is ModelStatus.UNLOADED
    r.release(a)
    waiter.join()
    assert waiter.error is None
    assert status(r, "b") is ModelStatus.LOADED
    wait_for(lambda: status(r, "a") is ModelStatus.UNLOADED)


def test_requests_for_one_model_share_one_entry_and_one_eviction(make):
    r = make(models_max=2)
    use(r, "a")
    use(r, "b")
    a = r.acquire("a")  # busy: only b may go
    waiters = [Bg(lambda: use(r, "c", hold=0.05)) for _ in range(3)]
    time.sleep(0.1)
    assert len(r._queue) == 1 and r._queue[0].waiters == 3
    for w in waiters:
        w.join()
        assert w.error is None
    r.release(a)
    time.sleep(0.1)
    assert status(r, "a") is ModelStatus.LOADED and status(r, "c") is ModelStatus.LOADED
    assert status(r, "b") is ModelStatus.UNLOADED
    assert r.spawned.count("c") == 1 and r._queue == []


def test_a_client_that_leaves_the_queue_costs_nobody_a_slot(make):
    r = make(models_max=1)
    a = r.acquire("a")
    t0 = time.monotonic()
    with pytest.raises(RequestCancelled):
        r.acquire("b", should_stop=lambda: time.monotonic() - t0 > 0.1)
    assert r._queue == []
    r.release(a)
    time.sleep(0.2)
    assert status(r, "a") is ModelStatus.LOADED and status(r, "b") is ModelStatus.UNLOADED


def test_the_queue_is_served_in_arrival_order(make):
    r = make(models_max=1)
    a = r.acquire("a")
    first = Bg(lambda: use(r, "b", hold=0.05))
    time.sleep(0.05)
    second = Bg(lambda: use(r, "c", hold=0.05))
    time.sleep(0.05)
    assert [e.model for e in r._queue] == ["b", "c"]
    r.release(a)
    first.join()
    second.join()
    assert first.error is None and second.error is None
    assert first.done_at < second.done_at
    assert r.spawned == ["a", "b", "c"]


def test_two_waiters_for_one_idle_model_are_both_served(make):
    r = make(models_max=1)
    use(r, "a")
    calls = [Bg(lambda n=n: use(r, n, hold=0.02)) for n in ("b", "c")]
    for c in calls:
        c.join()
        assert c.error is None
    assert status(r, "a") is ModelStatus.UNLOADED
    assert sum(r.get(n).running for n in "abc") == 1


def test_load_stops_the_least_recently_used_and_refuses_when_all_are_busy(make):
    r = make(models_max=2)
    use(r, "a")
    use(r, "b")
    r.load("c")  # a is the least recently used
    assert status(r, "a") is ModelStatus.UNLOADED and r.get("c").running
    wait_for(lambda: status(r, "c") is ModelStatus.LOADED)
    held = [r.acquire("b"), r.acquire("c")]
    with pytest.raises(ModelLimitError):
        r.load("a")
    for c in held:
        r.release(c)


def test_a_failed_load_is_reported_as_unloaded_with_its_exit_code(make):
    r = make()
    r.fail = {"a": 3}
    with pytest.raises(RouterError, match="failed to load"):
        r.acquire("a")
    info = next(m for m in r.models_info() if m["id"] == "a")["status"]
    assert info["value"] == "unloaded" and info["failed"] is True and info["exit_code"] == 3
    assert r._queue == []


def test_no_autoload_refuses_a_model_that_is_not_running(make):
    r = make(autoload=False)
    with pytest.raises(RouterError, match="not loaded"):
        r.acquire("a")
    r.load("a")
    assert r.acquire("a").status is ModelStatus.LOADED


def test_unload_and_unknown_models(make):
    r = make()
    with pytest.raises(RouterError, match="not running"):
        r.unload("a")
    use(r, "a")
    r.unload("a", wait=True)
    assert status(r, "a") is ModelStatus.UNLOADED and not r.get("a").failed
    with pytest.raises(RouterError, match="not found"):
        r.acquire("zzz")


def test_sse_subscribers_see_status_changes(make):
    r = make()
    seen: list[dict] = []
    unsubscribe = r.subscribe(seen.append)
    use(r, "a")
    unsubscribe()
    use(r, "b")
    assert [(e["model"], e["data"]["status"]) for e in seen] == [("a", "loading"), ("a", "loaded")]


# -- the router's HTTP app over stand-in children ---------------------------------------------------


@pytest.fixture
def app_client(make):
    from fastapi.testclient import TestClient

    from engine.router.proxy import create_router_app
    from engine.server import ServerOptions, ServerState

    def _client(router=None, **options):
        router = router or make(models_max=2)
        state = ServerState(ServerOptions(**options))
        return router, TestClient(create_router_app(router, state))

    return _client


def test_app_errors_are_llama_servers_400s(app_client):
    router, c = app_client()
    chat = {"messages": [{"role": "user", "content": "x"}]}
    r = c.post("/v1/chat/completions", json=chat)
    assert (
        r.status_code == 400
        and r.json()["error"]["message"] == "model name is missing from the request"
    )
    r = c.post("/v1/chat/completions", json={**chat, "model": "zzz"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "model 'zzz' not found"
    assert c.get("/metrics").status_code == 400  # a GET names its model in the query
    assert c.post("/models/load", json={"model": "zzz"}).status_code == 404
    assert (
        c.post("/models/unload", json={"model": "a"}).json()["error"]["message"]
        == "model is not running"
    )
    r = c.post("/tokenize?autoload=false", json={"model": "a", "content": "x"})
    assert r.status_code == 400 and "not loaded" in r.json()["error"]["message"]
    assert c.post("/models/load", json={"model": "a"}).json() == {"success": True}
    assert (
        c.post("/models/load", json={"model": "a"}).json()["error"]["message"]
        == "model is already running"
    )
    assert c.post("/models/load", content=b"{").status_code == 400


def test_app_router_props_and_listing(app_client):
    router, c = app_client(router=None)
    props = c.get("/props").json()
    assert (
        props["role"] == "router"
        and props["max_instances"] == 2
        and props["models_autoload"] is True
    )
    assert props["build_info"].startswith("b")
    use(router, "a")
    data = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
    assert data["a"]["status"]["value"] == "loaded" and data["b"]["status"]["value"] == "unloaded"
    assert data["a"]["object"] == "model" and data["a"]["source"] == "models_dir"
    assert data["a"]["architecture"]["input_modalities"] == ["text"]
    assert "--alias" in data["a"]["status"]["args"]


def test_app_keys_and_cors_apply_to_the_router(app_client):
    router, c = app_client(api_keys=("k",), cors_origins=("http://ok.example",))
    assert c.get("/health").status_code == 200
    r = c.get("/v1/models")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert c.get("/v1/models", headers={"Authorization": "Bearer k"}).status_code == 200
    r = c.options(
        "/completions",
        headers={"Origin": "http://ok.example", "Access-Control-Request-Method": "POST"},
    )
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://ok.example"


def test_app_reload_with_a_broken_preset_is_a_400(app_client, tmp_path):
    from engine.router.presets import Catalogue, OptionTable
    from test_router_presets import serve_parser

    ini = tmp_path / "p.ini"
    ini.write_text("[x]\nmodel = /x.gguf\n")
    cat = Catalogue(OptionTable.from_parser(serve_parser()), preset_file=ini)
    router = FakeRouter([], catalogue=cat.build).start()
    try:
        _, c = app_client(router=router)
        ini.write_text("[x]\nmodel = /x.gguf\n[y]\nmodel = /y.gguf\n")
        assert {m["id"] for m in c.get("/models?reload=1").json()["data"]} == {"x", "y"}
        ini.write_text("[x\n")
        r = c.get("/models?reload=1")
        assert r.status_code == 400 and "p.ini" in r.json()["error"]["message"]
    finally:
        router.stop()


def test_load_on_startup_models_load_and_may_not_exceed_models_max(make):
    from engine.router.presets import ModelSpec

    specs = {
        n: ModelSpec(n, "preset", f"/{n}.gguf", (("--model", f"/{n}.gguf"),), load_on_startup=True)
        for n in ("a", "b")
    }
    with pytest.raises(RouterError, match="load-on-startup"):
        FakeRouter([], catalogue=lambda: specs, models_max=1)
    r = FakeRouter([], catalogue=lambda: specs, models_max=2).start()
    try:
        r.load_startup_models()
        wait_for(lambda: all(c.status is ModelStatus.LOADED for c in r.children.values()))
    finally:
        r.stop()


class FakeHub:
    """Downloads into a dict; "bad/*" does not exist on the Hub."""

    def __init__(self):
        self.cache: dict[str, Path] = {}
        self.gate = threading.Event()

    def validate(self, spec):
        if spec.startswith("bad/"):
            from engine.errors import HubError

            raise HubError(f"{spec}: not found", HubError.NOT_FOUND)
        return spec, f"https://hub.example/{spec}.gguf"

    def fetch(self, file, progress, cancel):
        progress(5, 10)
        self.gate.wait(5)
        if cancel.is_set():
            raise RuntimeError("cancelled")
        progress(10, 10)
        self.cache[file] = Path(f"/cache/{file}.gguf")
        return self.cache[file]

    def remove(self, spec):
        return self.cache.pop(spec, None) is not None


def test_app_downloads_into_the_cache_and_removes_from_it(app_client, tmp_path):
    from engine.router.presets import Catalogue, OptionTable
    from test_router_presets import serve_parser

    hub = FakeHub()
    cat = Catalogue(OptionTable.from_parser(serve_parser()), cache=lambda: dict(hub.cache))
    router = FakeRouter([], catalogue=cat.build, hub=hub).start()
    seen: list[dict] = []
    router.subscribe(seen.append)
    try:
        _, c = app_client(router=router)
        r = c.post("/models", json={"model": "bad/model"})
        assert r.status_code == 400 and "validation failed" in r.json()["error"]["message"]
        assert c.post("/models", json={"model": "org/m:Q8_0"}).json() == {"success": True}
        assert c.post("/models", json={"model": "org/m:Q8_0"}).status_code == 400  # already there
        wait_for(lambda: any(e["event"] == "download_progress" for e in seen))
        status = next(m for m in c.get("/models").json()["data"] if m["id"] == "org/m:Q8_0")[
            "status"
        ]
        assert status["value"] == "downloading"
        assert status["progress"] == {
            "https://hub.example/org/m:Q8_0.gguf": {"done": 5, "total": 10}
        }
        hub.gate.set()
        wait_for(lambda: any(e["event"] == "download_finished" for e in seen))
        data = {m["id"]: m for m in c.get("/models").json()["data"]}  # lists the cache again
        assert (
            data["org/m:Q8_0"]["status"]["value"] == "unloaded" and data["org/m:Q8_0"]["can_remove"]
        )
        assert (
            c.post("/tokenize", json={"model": "org/m:Q8_0", "content": "x"}).status_code == 503
        )  # no child
        assert c.delete("/models?model=org/m:Q8_0").json() == {"success": True}
        assert "org/m:Q8_0" not in {m["id"] for m in c.get("/models").json()["data"]}
        assert seen[-1] == {"model": "org/m:Q8_0", "event": "model_remove", "data": {}}
        assert c.delete("/models?model=org/m:Q8_0").status_code == 400
        assert c.delete("/models").status_code == 400
    finally:
        router.stop()


def test_a_sleeping_child_is_running_and_takes_requests(make):
    r = make(models_max=1)
    child = use(r, "a")
    r._on_message(child, b'{"event": "sleeping"}')
    assert status(r, "a") is ModelStatus.SLEEPING
    assert next(m for m in r.models_info() if m["id"] == "a")["status"]["value"] == "sleeping"
    assert use(r, "a") is child  # no reload: the child wakes itself
    r._on_message(child, b'{"event": "ready"}')
    assert status(r, "a") is ModelStatus.LOADED
    r._on_message(child, b'{"event": "sleeping"}')
    use(r, "b")  # a sleeping model is idle: it gives its slot up
    assert status(r, "a") is ModelStatus.UNLOADED


def test_aliases_route_to_their_model_and_children_get_the_preset_flags(make):
    from engine.router.presets import ModelSpec

    spec = ModelSpec(
        "m",
        "preset",
        "/m.gguf",
        (("--model", "/m.gguf"), ("--ctx-size", "2048"), ("--no-jinja", "")),
        aliases=("mm",),
        tags=("t",),
    )
    r = FakeRouter([], catalogue=lambda: {"m": spec}).start()
    try:
        child = use(r, "mm")
        assert child.name == "m"
        cmd = child.args
        assert cmd[cmd.index("--ctx-size") + 1] == "2048" and "--no-jinja" in cmd
        assert cmd[cmd.index("--alias") + 1] == "m" and cmd[cmd.index("--host") + 1] == "127.0.0.1"
        info = r.models_info()[0]
        assert info["aliases"] == ["mm"] and info["tags"] == ["t"] and info["source"] == "preset"
    finally:
        r.stop()
