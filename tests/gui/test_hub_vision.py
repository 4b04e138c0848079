"""Vision models from the Hub in the app: a repository with projector (mmproj) GGUFs is marked in
the Discover list, a model of it downloads with the projector llama.cpp's -hf brings (beside it,
one progress bar over both), and the model list pairs the two. The real HubAdapter against
tests/hub_server.py's local Hub, never the internet."""

from __future__ import annotations

from pathlib import Path

import pytest

import hub_server
from app.engine_adapter import HubAdapter
from app.item_models.hub_download_table_model import DONE, PAUSED
from app.main_window import TAB_MODELS
from ggufgen import write_tiny_model
from mmprojgen import write_tiny_vlm_pair

from .fake_engine import FakeEngine

VLM, TEXT = "acme/TinyVLM-GGUF", "acme/Text-GGUF"


@pytest.fixture(autouse=True)
def no_exception_escapes_a_slot(qtbot):
    with qtbot.captureExceptions() as exceptions:
        yield
    assert not exceptions, exceptions


@pytest.fixture(scope="module")
def payloads(tmp_path_factory):
    d = tmp_path_factory.mktemp("vlm-payloads")
    lm, mm = write_tiny_vlm_pair(d / "vlm", "gemma3")
    return {"lm": lm, "mm": mm, "text": write_tiny_model(d / "text.gguf")}


@pytest.fixture
def hub(tmp_path, monkeypatch, payloads):
    server = hub_server.start(
        tmp_path / "srv",
        {
            VLM: {
                "tiny-vlm-Q8_0.gguf": payloads["lm"],
                "mmproj-tiny-vlm-Q8_0.gguf": payloads["mm"],  # closest to Q8_0: the pick
                "mmproj-tiny-vlm-F16.gguf": b"never fetched",
            },
            TEXT: {"text-Q8_0.gguf": payloads["text"]},
        },
    )
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    yield server
    server.stop()


@pytest.fixture
def hub_window(make_window, hub):
    return make_window(FakeEngine(hub=HubAdapter()))


def discover(window, qtbot, text: str):
    window.tabs.setCurrentIndex(TAB_MODELS)
    window.picker.sources.setCurrentIndex(1)
    panel = window.picker.discover
    panel.query.setText(text)
    panel.search()
    qtbot.waitUntil(lambda: not panel.repos_label.text().startswith("Searching"), timeout=10_000)
    return panel


def open_repo(panel, qtbot, repo_id: str, filename: str):
    proxy = panel.repo_table.model()
    panel.repo_table.setCurrentIndex(proxy.mapFromSource(panel.repos.index_of(repo_id)))
    qtbot.waitUntil(lambda: panel.files.row_of(filename) >= 0, timeout=10_000)
    files_proxy = panel.file_table.model()
    panel.file_table.setCurrentIndex(
        files_proxy.mapFromSource(panel.files.index(panel.files.row_of(filename), 0))
    )
    return panel.files.file(panel.files.row_of(filename))


def _fetched(server) -> list[str]:
    return [e[1].rsplit("/", 1)[-1] for e in server.log if e[0] == "GET" and "/resolve/" in e[1]]


def test_adapter_marks_vision_repos_and_pairs_each_model(hub, payloads):
    adapter = HubAdapter()
    found = {r.repo_id: r for r in adapter.search("acme", None)}
    assert found[VLM].vision and not found[TEXT].vision
    assert found[VLM].n_files == 1  # projectors are not models
    (f,) = adapter.files(VLM, None)
    assert f.mmproj == "mmproj-tiny-vlm-Q8_0.gguf"
    assert f.mmproj_bytes == Path(payloads["mm"]).stat().st_size
    assert f.download_bytes == f.size_bytes + f.mmproj_bytes
    (t,) = adapter.files(TEXT, None)
    assert (t.mmproj, t.mmproj_bytes, t.download_bytes) == ("", None, t.size_bytes)


def test_discover_marks_the_repo_and_downloads_the_projector_beside_the_model(
    hub_window, hub, qtbot, payloads
):
    panel = discover(hub_window, qtbot, "acme")
    assert "· vision" in panel.repos.index_of(VLM).data()
    assert "vision" not in panel.repos.index_of(TEXT).data()
    f = open_repo(panel, qtbot, VLM, "tiny-vlm-Q8_0.gguf")
    row = panel.files.row_of(f.filename)
    assert "+ mmproj-tiny-vlm-Q8_0.gguf" in panel.files.index(row, 4).data()
    assert "projector" in panel.files.index(row, 0).data(3)  # ToolTipRole
    progress: list[tuple[int, int]] = []
    panel.downloads.model.dataChanged.connect(
        lambda *_: progress.extend((d.done, d.total) for d in panel.downloads.model.rows())
    )
    with qtbot.waitSignal(panel.model_downloaded, timeout=30_000) as blocker:
        panel.download_selected()
    model = Path(blocker.args[0])
    mmproj = model.parent / "mmproj-tiny-vlm-Q8_0.gguf"
    assert model.name == "tiny-vlm-Q8_0.gguf" and mmproj.read_bytes() == payloads["mm"].read_bytes()
    assert "mmproj-tiny-vlm-F16.gguf" not in _fetched(hub)
    (d,) = panel.downloads.model.rows()
    both = f.size_bytes + f.mmproj_bytes
    assert d.state == DONE and d.total == both
    assert all(total == both for _done, total in progress if total)  # one bar, never shrinking
    # the model list pairs what came down, so the model loads with its projector
    qtbot.waitUntil(lambda: hub_window.picker.files.row_of(str(model)) >= 0, timeout=5000)
    info = hub_window.picker.files.info(hub_window.picker.files.row_of(str(model)))
    assert info.mmproj == str(mmproj)
    assert panel.files.file(panel.files.row_of(f.filename)).local_path == str(model)


def test_a_model_downloaded_without_its_projector_is_not_done(hub, qtbot):
    from engine.hub import client

    adapter = HubAdapter()
    model = client.download(client.resolve(VLM))  # as before this change: the model alone
    (f,) = adapter.files(VLM, None)
    assert f.local_path is None  # what -hf would bring is not all there
    fetched = len(_fetched(hub))
    seen: list[tuple[int, int]] = []
    path = adapter.download(VLM, f.filename, None, lambda d, t: seen.append((d, t)), _never())
    assert path == str(model)
    assert _fetched(hub)[fetched:] == ["mmproj-tiny-vlm-Q8_0.gguf"]  # only the projector moved
    assert seen[-1] == (f.download_bytes, f.download_bytes)
    assert adapter.files(VLM, None)[0].local_path == str(model)


def test_a_cancelled_projector_download_resumes_and_discard_removes_its_part(
    hub_window, hub, qtbot, tmp_path
):
    panel = discover(hub_window, qtbot, "acme")
    f = open_repo(panel, qtbot, VLM, "tiny-vlm-Q8_0.gguf")
    # the Hub holds the projector halfway until released: the pause lands mid-projector every
    # time (a chunk delay raced the worker's 0.1 s progress throttle and the GUI's reaction, and
    # lost when the projector's last chunk came first)
    gate = hub.gate(f.mmproj, f.mmproj_bytes // 2)
    panel.download_selected()
    (d,) = panel.downloads.model.rows()
    blobs = tmp_path / "hf-home" / "hub" / "models--acme--TinyVLM-GGUF" / "blobs"

    def partial() -> list[Path]:
        return [b for b in blobs.iterdir() if b.name.endswith(".incomplete")]

    qtbot.waitUntil(gate.reached.is_set, timeout=10_000)  # the model is in, the projector half
    qtbot.waitUntil(lambda: any(p.stat().st_size for p in partial()), timeout=10_000)
    panel.downloads.pause(d)
    gate.release()  # the next bytes reach the client, which sees the pause and stops
    qtbot.waitUntil(lambda: d.state == PAUSED, timeout=10_000)
    (part,) = partial()
    kept = part.stat().st_size
    assert 0 < kept < f.mmproj_bytes  # stopped inside the projector, its part kept
    with qtbot.waitSignal(panel.model_downloaded, timeout=10_000) as blocker:
        panel.downloads.resume(d)
    assert (Path(blocker.args[0]).parent / f.mmproj).stat().st_size == f.mmproj_bytes
    assert not partial()
    ranges = [e[2] for e in hub.log if e[0] == "GET" and e[1].startswith("/cdn/")]
    assert f"bytes={kept}-" in ranges  # resumed from the kept part, not started over


def _never():
    import threading

    return threading.Event()
