"""engine/hub/client.py against a hostile or compromised Hub and a tampered cache: names from a listing
never create or replace anything outside the Hugging Face cache, listing and DELETE /models never
follow a planted link out of it, and a repo id huggingface_hub rejects is a 400, not a 500.
A local Hub-shaped server (tests/hub_server.py); never the internet."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

import hub_server
from engine.errors import HubError
from engine.hub import client as hub
from engine.hub.session import hub_errors
from engine.router.hub_access import HubAccess

MODEL = b"GGUF" + bytes(60)  # listed and served as is: the transfer never parses it
SHA = hashlib.sha1(b"evil").hexdigest()
UP = "../../../../../"  # from snapshots/<commit>/ of the cache to tmp_path


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "outside.gguf").write_bytes(b"precious")
    return tmp_path


@pytest.fixture
def serve(env, monkeypatch):
    servers = []

    def _serve(files: dict[str, bytes], **kw):
        srv = hub_server.start(
            env / "payloads", {"evil/repo": files, "good/repo": {"g-Q8_0.gguf": MODEL}}, **kw
        )
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        servers.append(srv)
        return srv

    yield _serve
    for srv in servers:
        srv.stop()


def _outside_state(root: Path) -> dict[str, bytes | str]:
    """Everything under tmp_path but the cache and the server's payloads: name -> bytes or link."""
    out: dict[str, bytes | str] = {}
    for top, dirs, files in os.walk(root):
        rel = Path(top).relative_to(root)
        if rel.parts[:1] in (("hf",), ("payloads",)):
            continue
        for name in dirs + files:
            p = Path(top) / name
            out[str(p.relative_to(root))] = (
                f"-> {os.readlink(p)}"
                if p.is_symlink()
                else p.read_bytes()
                if p.is_file()
                else "dir"
            )
    return out


# -- names from the listing ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "../x.gguf",
        "a/../../x.gguf",
        "..",
        "/abs/x.gguf",
        "a\\..\\x.gguf",
        "a//x.gguf",
        "a/./x.gguf",
        "a/",
        "",
        "x\0.gguf",
        "x\n.gguf",
        "C:x.gguf",
        "a/\x7f.gguf",
    ],
)
def test_hub_check_filename_refuses_what_could_leave_the_snapshot(name):
    with pytest.raises(HubError) as e:
        hub.check_filename(name)
    assert e.value.reason == HubError.HUB and "unsafe" in str(e.value)


@pytest.mark.parametrize(
    "name", ["m-Q8_0.gguf", "Q8_0/m-00001-of-00002.gguf", "a b/..c.gguf", "x..gguf"]
)
def test_hub_check_filename_takes_hub_paths(name):
    assert hub.check_filename(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "../../outside-Q8_0.gguf",
        UP + "outside/outside.gguf",
        "/ABS/x-Q8_0.gguf",
        "sub/../../../x-Q8_0.gguf",
        "a\\..\\..\\x-Q8_0.gguf",
    ],
)
def test_hub_hostile_rfilename_is_refused_and_writes_nothing(serve, env, name):
    name = name.replace("/ABS", str(env / "outside"))
    serve({name: MODEL, "fine-Q4_K_M.gguf": MODEL})
    before = _outside_state(env)
    with pytest.raises(HubError) as e:
        hub.repo("evil/repo")
    assert name in str(e.value) and "unsafe" in str(e.value)
    for call in (
        lambda: hub.resolve("evil/repo"),
        lambda: hub.download(hub.resolve("evil/repo:Q8_0")),
    ):
        with pytest.raises(HubError):
            call()
    assert _outside_state(env) == before
    assert (env / "outside" / "outside.gguf").read_bytes() == b"precious"
    cache = env / "hf" / "hub"
    assert not list(cache.rglob("*outside*")) and not list(cache.rglob("*.gguf"))


@pytest.mark.parametrize("sha", ["../../x", UP[3:] + "outside", "main/../../x", "", "a" * 39 + "/"])
def test_hub_hostile_commit_is_refused_and_writes_nothing(serve, env, sha):
    serve({"outside.gguf": MODEL}, commits={"evil/repo": sha or "-"})
    before = _outside_state(env)
    with pytest.raises(HubError) as e:
        hub.download(hub.resolve("evil/repo"))
    assert "commit" in str(e.value)
    assert _outside_state(env) == before
    assert not (env / "hf" / "hub" / "x").exists()


def test_hub_hostile_repo_id_is_refused(serve, env):
    serve({"m-Q8_0.gguf": MODEL}, ids={"evil/repo": "../../../outside"})
    with pytest.raises(HubError) as e:
        hub.repo("evil/repo")
    assert "../../../outside" in str(e.value)
    # a search leaves such a repository out and keeps the others
    assert [r.repo_id for r in hub.search("repo")] == ["good/repo"]


def test_hub_search_leaves_out_a_repo_with_unsafe_names(serve):
    serve({"../m-Q8_0.gguf": MODEL})
    assert [r.repo_id for r in hub.search("repo")] == ["good/repo"]
    assert hub.download(hub.resolve("good/repo")).read_bytes() == MODEL


def test_hub_repo_id_hf_rejects_is_a_hub_error(serve):
    serve({})
    for bad in ("a" * 150 + "/" + "b" * 149, "a--b/c", "a/b.git", "a/b/c"):
        with pytest.raises(HubError) as e:
            hub.resolve(bad)
        assert e.value.reason == HubError.NOT_FOUND
        with pytest.raises(HubError) as e:
            hub.repo(bad)
        assert e.value.reason == HubError.NOT_FOUND


def test_hub_errors_maps_what_huggingface_hub_refuses_to_send():
    from huggingface_hub import ModelInfo
    from huggingface_hub.utils import validate_repo_id

    with pytest.raises(HubError) as e, hub_errors("x" * 300):
        validate_repo_id("x" * 300)
    assert e.value.reason == HubError.NOT_FOUND and "96" in str(e.value)
    with pytest.raises(HubError) as e, hub_errors("evil/repo"):
        ModelInfo(**{"id": "evil/repo", "siblings": [{"size": 1}]})  # a listing that is not one
    assert e.value.reason == HubError.HUB


def test_hub_listing_with_a_bad_size_is_refused(serve, monkeypatch):
    serve({"m-Q8_0.gguf": MODEL})
    from huggingface_hub import HfApi

    real = HfApi.model_info

    def model_info(self, *a, **kw):
        info = real(self, *a, **kw)
        info.siblings[0].size = "64"
        return info

    monkeypatch.setattr(HfApi, "model_info", model_info)
    with pytest.raises(HubError) as e:
        hub.repo("evil/repo")
    assert "invalid size '64'" in str(e.value)


# -- a tampered cache -----------------------------------------------------------------------------------


def _rdir(env: Path, repo_id: str = "evil/repo") -> Path:
    return env / "hf" / "hub" / ("models--" + repo_id.replace("/", "--"))


def _plant_model(
    env: Path, repo_id: str = "evil/repo", name: str = "m-Q8_0.gguf"
) -> tuple[Path, Path]:
    """A model cached as huggingface_hub caches it; returns (link, blob)."""
    rdir = _rdir(env, repo_id)
    blob = rdir / "blobs" / hashlib.sha256(MODEL + repo_id.encode()).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(MODEL)
    link = rdir / "snapshots" / SHA / name
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (rdir / "refs").mkdir()
    (rdir / "refs" / "main").write_text(SHA)
    return link, blob


@pytest.mark.parametrize(
    "kind", ["absolute link", "relative link", "snapshot dir link", "nested dir link"]
)
def test_hub_remove_never_deletes_outside_the_cache(env, kind):
    outside = env / "outside"
    target = outside / "target-Q8_0.gguf"
    target.write_bytes(MODEL)
    snap = _rdir(env) / "snapshots" / SHA
    (_rdir(env) / "refs").mkdir(parents=True)
    (_rdir(env) / "refs" / "main").write_text(SHA)
    name = "m-Q8_0.gguf"
    if kind == "absolute link":
        snap.mkdir(parents=True)
        (snap / name).symlink_to(target)
    elif kind == "relative link":
        snap.mkdir(parents=True)
        (snap / name).symlink_to(os.path.relpath(target, snap))
    elif kind == "snapshot dir link":
        (outside / name).write_bytes(MODEL)
        snap.parent.mkdir(parents=True)
        snap.symlink_to(outside, target_is_directory=True)
    else:
        (outside / name).write_bytes(MODEL)
        snap.mkdir(parents=True)
        (snap / "sub").symlink_to(outside, target_is_directory=True)
        name = "sub/" + name
    before = _outside_state(env)
    assert [
        f.spec for f in hub.cached_models()
    ] == []  # the listing does not leave the cache either
    assert HubAccess().remove("evil/repo:Q8_0") is False
    part = hub.HubPart(name, len(MODEL))
    planted = hub.HubFile("evil/repo", name, "Q8_0", (part,), SHA, local_path=snap / name)
    hub.remove_cached(planted)  # even when handed the file: only the cache's own entries go
    assert _outside_state(env) == before
    assert target.read_bytes() == MODEL


def test_hub_remove_deletes_the_cache_own_link_and_blob(env):
    link, blob = _plant_model(env)
    other_link, other_blob = _plant_model(env, "good/repo")
    assert sorted(f.spec for f in hub.cached_models()) == ["evil/repo:Q8_0", "good/repo:Q8_0"]
    assert HubAccess().remove("evil/repo:Q8_0") is True
    assert not link.is_symlink() and not blob.exists()
    assert other_link.resolve() == other_blob.resolve() and other_blob.read_bytes() == MODEL
    assert [f.spec for f in hub.cached_models()] == ["good/repo:Q8_0"]


def test_hub_remove_keeps_a_blob_another_commit_still_links(env):
    link, blob = _plant_model(env)
    newer = _rdir(env) / "snapshots" / ("b" * 40) / link.name  # the same file in a later commit
    newer.parent.mkdir(parents=True)
    newer.symlink_to(os.path.relpath(blob, newer.parent))
    part = hub.HubPart(link.name, len(MODEL))
    assert (
        hub.remove_cached(hub.HubFile("evil/repo", link.name, "Q8_0", (part,), SHA, link)) is True
    )
    assert not link.is_symlink()
    assert newer.read_bytes() == MODEL  # the other commit's model is whole
    newer_file = hub.HubFile("evil/repo", link.name, "Q8_0", (part,), "b" * 40, newer)
    assert hub.remove_cached(newer_file) is True and not blob.exists()  # the last link takes it


def test_hub_remove_leaves_a_link_into_another_repo_blob(env):
    _other_link, other_blob = _plant_model(env, "good/repo")
    snap = _rdir(env) / "snapshots" / SHA
    snap.mkdir(parents=True)
    (snap / "m-Q8_0.gguf").symlink_to(os.path.relpath(other_blob, snap))
    (_rdir(env) / "refs").mkdir()
    (_rdir(env) / "refs" / "main").write_text(SHA)
    assert "evil/repo:Q8_0" not in {f.spec for f in hub.cached_models()}
    part = hub.HubPart("m-Q8_0.gguf", len(MODEL))
    hub.remove_cached(
        hub.HubFile("evil/repo", part.filename, "Q8_0", (part,), SHA, snap / part.filename)
    )
    assert other_blob.read_bytes() == MODEL


@pytest.mark.parametrize("ref", [UP[3:] + "outside", "/abs"])
def test_hub_cached_models_ignore_a_ref_that_leaves_the_repo(env, ref):
    (env / "outside" / "x-Q8_0.gguf").write_bytes(MODEL)
    refs = _rdir(env) / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text(ref.replace("/abs", str(env / "outside")))
    (_rdir(env) / "snapshots").mkdir()
    assert hub.cached_models() == []


@pytest.mark.parametrize(
    "planted",
    [
        "blob link",
        "incomplete link",
        "blobs dir link",
        "snapshots dir link",
        "refs dir link",
        "repo dir link",
    ],
)
def test_hub_download_never_writes_through_a_planted_link(serve, env, planted):
    srv = serve({"m-Q8_0.gguf": MODEL}, commits={"evil/repo": SHA})
    sha256 = srv.repos["evil/repo"].meta("m-Q8_0.gguf")[1]
    victim = env / "outside" / "outside.gguf"
    rdir = _rdir(env)
    rdir.parent.mkdir(parents=True)
    if planted == "repo dir link":
        rdir.symlink_to(env / "outside", target_is_directory=True)
    else:
        rdir.mkdir()
    if planted in ("blob link", "incomplete link"):
        (rdir / "blobs").mkdir()
        (
            rdir / "blobs" / (sha256 + (".incomplete" if planted == "incomplete link" else ""))
        ).symlink_to(victim)
    elif planted.endswith("dir link") and planted != "repo dir link":
        (rdir / planted.split()[0]).symlink_to(env / "outside", target_is_directory=True)
    before = _outside_state(env)
    try:
        path = hub.download(hub.resolve("evil/repo"))
    except HubError as e:
        assert "outside" in str(e) or "cache" in str(e)
    else:  # a planted blob link is not the cache's: it is replaced by the real blob
        assert path.read_bytes() == MODEL
        assert os.path.realpath(path).startswith(os.path.realpath(rdir / "blobs"))
    assert _outside_state(env) == before
    assert victim.read_bytes() == b"precious"


# -- the router's HTTP routes ---------------------------------------------------------------------------


@pytest.fixture
def router_client():
    from fastapi.testclient import TestClient

    from engine.router.proxy import create_router_app
    from engine.router.supervisor import Router
    from engine.server import ServerOptions, ServerState

    router = Router({}, []).start()
    state = ServerState(ServerOptions())
    with TestClient(create_router_app(router, state)) as client:
        yield client
    router.stop()


def test_router_post_models_bad_repo_id_is_a_400(serve, router_client):
    serve({"m-Q8_0.gguf": MODEL})
    for bad in ("a" * 150 + "/" + "b" * 149, "a/b/c", "a--b/c:Q8_0"):
        r = router_client.post("/models", json={"model": bad})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert "validation failed" in r.json()["error"]["message"]
    assert (
        router_client.delete("/models", params={"model": "a" * 150 + "/" + "b" * 149}).status_code
        == 400
    )


def test_router_post_models_hostile_listing_is_a_400_and_writes_nothing(serve, env, router_client):
    serve({UP + "outside/outside.gguf": MODEL})
    before = _outside_state(env)
    r = router_client.post("/models", json={"model": "evil/repo"})
    assert r.status_code == 400, r.text
    assert "unsafe" in r.json()["error"]["message"]
    assert _outside_state(env) == before
