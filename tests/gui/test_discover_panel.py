"""The Discover panel (model picker): search the Hub, fit before download, download with pause,
resume and cancel across restarts, tokens and errors.

Two kinds of test: the panel's logic on FakeHub (fast, canned), and the panel on the real
HubAdapter (engine.hub.client and huggingface_hub) against tests/hub_server.py, a local Hub-shaped HTTP
server, with real tiny GGUFs as payloads. No test reaches the internet: HF_ENDPOINT points at the
local server (or at a closed port) and HF_HOME at a temporary directory.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

import hub_server
from app.dto import LoadParams
from app.engine_adapter import EngineAdapter, HubAdapter
from app.item_models.hub_download_table_model import (
    DONE,
    DOWNLOADING,
    PAUSED,
    HubDownloadTableModel,
)
from app.item_models.hub_file_table_model import HubFileTableModel
from app.item_models.hub_repo_table_model import HubRepoTableModel
from app.machine import free_port
from app.main_window import TAB_MODELS
from engine.errors import HubError
from ggufgen import write_tiny_model

from .fake_engine import FakeEngine, FakeHub

REPO, GATED = "alice/tiny-llama-GGUF", "carol/gated-llama-GGUF"


@pytest.fixture(autouse=True)
def no_exception_escapes_a_slot(qtbot):
    with qtbot.captureExceptions() as exceptions:
        yield
    assert not exceptions, exceptions


def discover(window):
    window.tabs.setCurrentIndex(TAB_MODELS)
    window.picker.sources.setCurrentIndex(1)
    return window.picker.discover


def search(panel, qtbot, text: str, n_repos: int | None = None) -> None:
    panel.query.setText(text)
    panel.search()
    qtbot.waitUntil(lambda: not panel.repos_label.text().startswith("Searching"), timeout=10_000)
    if n_repos is not None:
        assert panel.repos.rowCount() == n_repos, panel.repos_label.text()


def select_file(panel, qtbot, filename: str):
    proxy = panel.file_table.model()
    qtbot.waitUntil(lambda: panel.files.row_of(filename) >= 0, timeout=10_000)
    panel.file_table.setCurrentIndex(
        proxy.mapFromSource(panel.files.index(panel.files.row_of(filename), 0))
    )
    qtbot.waitUntil(
        lambda: panel.files.fit(filename) is not None or bool(panel.files.fit_error(filename)),
        timeout=30_000,
    )
    return panel.files.fit(filename)


def picker_paths(window) -> list[str]:
    files = window.picker.files
    return [files.info(r).path for r in range(files.rowCount())]


# -- the panel's logic on FakeHub -----------------------------------------------------------------


@pytest.fixture
def fake_hub(tmp_path) -> FakeHub:
    return FakeHub(root=str(tmp_path / "fake-hf"), chunks=40, step_s=0.02)


@pytest.fixture
def fake_window(make_window, fake_hub):
    return make_window(FakeEngine(hub=fake_hub))


def test_search_lists_repos_and_checks_only_the_selected_file(fake_window, fake_hub, qtbot):
    panel = discover(fake_window)
    search(panel, qtbot, "gguf", n_repos=2)
    qtbot.waitUntil(lambda: panel.files.rowCount() == 2, timeout=5000)
    q4 = select_file(panel, qtbot, "tiny-llama-Q4_K_M.gguf")  # the default file, selected for us
    assert q4.supported and q4.verdict == "fits"
    assert "fits" in panel.fit_label.text() and panel.download_button.text().startswith(
        "Download ("
    )
    fits = [c for c in fake_hub.calls if c[0] == "fit"]
    assert fits == [("fit", f"{REPO}:tiny-llama-Q4_K_M.gguf", None)]  # lazily: not the Q8_0 file
    q8_row = panel.files.row_of("tiny-llama-Q8_0.gguf")
    assert panel.files.index(q8_row, 2).data() == "not checked"
    q8 = select_file(panel, qtbot, "tiny-llama-Q8_0.gguf")
    assert q8.verdict == "does not fit" and panel.files.index(q8_row, 3).data().startswith(
        "too big"
    )
    assert panel.download_button.text().startswith("Download anyway")


def test_an_older_search_never_replaces_a_newer_one(fake_window, fake_hub, qtbot):
    panel = discover(fake_window)
    fake_hub.delays["alice"] = 0.8  # the first search answers last
    panel.query.setText("alice")
    panel.search()
    search(panel, qtbot, "bob", n_repos=1)
    qtbot.waitUntil(lambda: len([c for c in fake_hub.calls if c[0] == "search"]) == 2, timeout=5000)
    qtbot.waitUntil(lambda: not fake_window.ctx.pool.busy(), timeout=5000)
    assert panel.repos.repo(0).repo_id == "bob/mamba-GGUF" and panel.repos.rowCount() == 1
    assert panel.files.repo_id == "bob/mamba-GGUF"


def test_unsupported_model_is_said_before_download(fake_window, qtbot):
    panel = discover(fake_window)
    search(panel, qtbot, "mamba", n_repos=1)
    fit = select_file(panel, qtbot, "mamba-IQ4_XS.gguf")
    assert not fit.supported
    row = panel.files.row_of("mamba-IQ4_XS.gguf")
    assert panel.files.index(row, 2).data() == "✗ not supported"
    assert (
        "Not supported by this engine" in panel.fit_label.text()
        and "mamba" in panel.fit_label.text()
    )
    assert panel.download_button.text().startswith("Download anyway")
    assert "cannot run it" in panel.download_button.toolTip()


@pytest.mark.parametrize(
    "reason, words, asks_token",
    [
        (HubError.AUTH, "needs a Hugging Face token", True),
        (HubError.NOT_FOUND, "canned failure", False),
        (HubError.OFFLINE, "No connection to the Hugging Face Hub", False),
    ],
)
def test_hub_errors_are_shown_plainly(fake_window, fake_hub, qtbot, reason, words, asks_token):
    panel = discover(fake_window)
    fake_hub.fail[REPO] = reason
    search(panel, qtbot, "alice", n_repos=1)
    qtbot.waitUntil(lambda: panel.error.isVisibleTo(panel), timeout=5000)
    assert words in panel.error.text()
    assert panel.token_row.isVisibleTo(panel) == asks_token


def test_a_token_typed_in_retries_the_call_with_it(fake_window, fake_hub, qtbot):
    panel = discover(fake_window)
    fake_hub.fail[REPO] = HubError.AUTH
    search(panel, qtbot, "alice", n_repos=1)
    qtbot.waitUntil(lambda: panel.token_row.isVisibleTo(panel), timeout=5000)
    del fake_hub.fail[REPO]
    panel.token_edit.setText("hf_secret")
    panel.use_token()
    qtbot.waitUntil(lambda: panel.files.rowCount() == 2, timeout=5000)
    assert ("files", REPO, "hf_secret") in fake_hub.calls
    assert not panel.error.isVisibleTo(panel) and not panel.token_row.isVisibleTo(panel)


def test_download_pause_survives_a_restart_and_resumes(make_window, fake_hub, data_dir, qtbot):
    w = make_window(FakeEngine(hub=fake_hub))
    panel = discover(w)
    search(panel, qtbot, "alice", n_repos=1)
    select_file(panel, qtbot, "tiny-llama-Q8_0.gguf")
    panel.download_selected()
    d = panel.downloads.model.download(0)
    qtbot.waitUntil(lambda: d.done > 0 and d.rate > 0, timeout=5000)
    assert panel.download_button.text() == "Downloading…" and not panel.download_button.isEnabled()
    assert (
        "/s" in panel.downloads.model.index(0, 2).data()
        and ":" in panel.downloads.model.index(0, 3).data()
    )
    panel.downloads.pause(d)
    qtbot.waitUntil(lambda: d.state == PAUSED, timeout=5000)
    assert 0 < fake_hub.partial[(REPO, "tiny-llama-Q8_0.gguf")] < fake_hub.chunks
    w.close()  # the app quits with the download paused

    w2 = make_window(FakeEngine(hub=fake_hub), data_dir)
    assert w2.picker.sources.currentIndex() == 1  # the picker opens on them
    panel2 = discover(w2)
    assert panel2.downloads.model.rowCount() == 1
    again = panel2.downloads.model.download(0)
    assert again.state == PAUSED and again.earlier and again.done > 0
    assert panel2.earlier_label.text() == "1 unfinished from the last session"
    with qtbot.waitSignal(panel2.model_downloaded, timeout=10_000) as blocker:
        panel2.resume_all()
    assert again.state == DONE
    qtbot.waitUntil(lambda: blocker.args[0] in picker_paths(w2), timeout=5000)
    w2.close()
    w3 = make_window(FakeEngine(hub=fake_hub), data_dir)
    assert discover(w3).downloads.model.rowCount() == 0  # done: not offered again


def test_cancel_discards_the_partial_download(fake_window, fake_hub, qtbot):
    panel = discover(fake_window)
    search(panel, qtbot, "alice", n_repos=1)
    select_file(panel, qtbot, "tiny-llama-Q8_0.gguf")
    panel.download_selected()
    d = panel.downloads.model.download(0)
    qtbot.waitUntil(lambda: d.done > 0, timeout=5000)
    panel.download_table.setCurrentIndex(panel.downloads.model.index(0, 0))
    panel.cancel_button.click()
    qtbot.waitUntil(lambda: panel.downloads.model.rowCount() == 0, timeout=5000)
    assert (REPO, "tiny-llama-Q8_0.gguf") not in fake_hub.partial
    assert not any("tiny-llama" in p for p in picker_paths(fake_window))


def test_item_models_pass_the_model_tester(qtmodeltester):
    from app.dto import HubFileInfo, HubFitInfo, HubRepoInfo
    from app.item_models.hub_download_table_model import Download

    repos = HubRepoTableModel()
    repos.set_repos([HubRepoInfo("a/b", 10, 2, True, 3), HubRepoInfo("c/d")])
    qtmodeltester.check(repos, force_py=True)
    files = HubFileTableModel()
    files.set_files(
        "a/b",
        [
            HubFileInfo("a/b", "x-Q4_0.gguf", "Q4_0", 100, 1, None, True),
            HubFileInfo("a/b", "x.gguf", "", None, 3),
        ],
    )
    files.set_checking("x.gguf")
    files.set_fit(
        "a/b", HubFitInfo("a/b", "x-Q4_0.gguf", "tight", True, n_ctx=256, needed_bytes=90)
    )
    files.set_fit("other/repo", HubFitInfo("other/repo", "x.gguf", "fits", True))  # dropped
    assert files.fit("x.gguf") is None and files.index(1, 2).data() == "checking…"
    qtmodeltester.check(files, force_py=True)
    downloads = HubDownloadTableModel()
    downloads.add(Download("a/b", "x-Q4_0.gguf", "Q4_0", 100, 40, DOWNLOADING, rate=20.0))
    downloads.add(Download("c/d", "y.gguf", earlier=True))
    assert (
        downloads.index(0, 1).data() == "40% · 40 B of 100 B"
        and downloads.index(0, 3).data() == "0:03"
    )
    assert downloads.index(1, 4).data() == "paused (last session)"
    qtmodeltester.check(downloads, force_py=True)


# -- the real client against a local Hub-shaped server --------------------------------------------

FakeDisk = collections.namedtuple("FakeDisk", "total used free")


@pytest.fixture(scope="module")
def payloads(tmp_path_factory):
    d = tmp_path_factory.mktemp("hub-payloads")
    small = write_tiny_model(d / "small.gguf")
    big = write_tiny_model(d / "big.gguf", n_embd=256, n_ff=1024, n_layer=4, seed=1)  # ~4 MiB
    return small, big


@pytest.fixture
def hub(tmp_path, monkeypatch, payloads):
    small, big = payloads
    server = hub_server.start(
        tmp_path,
        {
            REPO: {
                "tiny-llama-Q4_K_M.gguf": big,
                "tiny-llama-Q8_0.gguf": small,
                "README.md": b"# tiny",
            },
            GATED: {"gated-llama-Q8_0.gguf": small},
        },
        gated=(GATED,),
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


def blobs(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "hf-home" / "hub").glob("models--*/blobs/*"))


def test_real_search_and_fit_read_only_the_header(hub_window, hub, qtbot):
    panel = discover(hub_window)
    search(panel, qtbot, "tiny", n_repos=1)
    qtbot.waitUntil(lambda: panel.files.rowCount() == 2, timeout=10_000)
    q4 = select_file(panel, qtbot, "tiny-llama-Q4_K_M.gguf")
    size = panel.files.file(panel.files.row_of("tiny-llama-Q4_K_M.gguf")).size_bytes
    assert q4 is not None and q4.supported and q4.arch == "llama" and q4.verdict == "fits"
    assert 0 < q4.bytes_read < size  # the header, by ranges, not the file
    assert all(
        rng
        for method, path, rng, _status, _n in hub.log
        if path.startswith("/cdn/") and method == "GET"
    )
    assert "llama" in panel.fit_label.text() and "fits" in panel.fit_label.text()


def test_real_download_appears_in_the_picker_and_loads(hub_window, hub, qtbot, tmp_path):
    panel = discover(hub_window)
    search(panel, qtbot, "tiny", n_repos=1)
    select_file(panel, qtbot, "tiny-llama-Q8_0.gguf")
    with qtbot.waitSignal(panel.model_downloaded, timeout=30_000) as blocker:
        panel.download_button.click()
    path = blocker.args[0]
    assert (
        path.startswith(str(tmp_path / "hf-home" / "hub"))
        and Path(path).name == "tiny-llama-Q8_0.gguf"
    )
    qtbot.waitUntil(lambda: path in picker_paths(hub_window), timeout=5000)
    assert (
        panel.load_button.isVisibleTo(panel)
        and "downloaded" in panel.files.index(panel.files.row_of("tiny-llama-Q8_0.gguf"), 4).data()
    )
    with qtbot.waitSignal(hub_window.ctx.llm_loaded, timeout=10_000):
        panel.load_button.click()
    assert hub_window.ctx.session.path == path


def test_real_engine_loads_what_was_downloaded(make_window, hub, qtbot):
    """The whole path on the real engine: the header fit, the download into the HF cache, the
    picker's inspection of the cached file (a snapshot symlink) and the load."""
    w = make_window(EngineAdapter())
    w.picker.load_panel.set_params(LoadParams(n_ctx=256, n_seq_max=1, n_batch=64, n_ubatch=64))
    panel = discover(w)
    search(panel, qtbot, "tiny", n_repos=1)
    assert select_file(panel, qtbot, "tiny-llama-Q8_0.gguf").supported
    with qtbot.waitSignal(panel.model_downloaded, timeout=30_000) as blocker:
        panel.download_selected()
    with qtbot.waitSignal(w.ctx.llm_loaded, timeout=300_000):
        panel.load_button.click()
    assert w.ctx.session.path == blocker.args[0] and w.ctx.session.arch == "llama"


def test_real_pause_keeps_the_partial_file_and_resume_completes(hub_window, hub, qtbot, tmp_path):
    panel = discover(hub_window)
    search(panel, qtbot, "tiny", n_repos=1)
    select_file(panel, qtbot, "tiny-llama-Q4_K_M.gguf")
    hub.chunk_delay_s = 0.03  # ~2 MiB/s: long enough to pause half-way
    panel.download_selected()
    d = panel.downloads.model.download(0)
    qtbot.waitUntil(lambda: d.done >= 1 << 20, timeout=20_000)
    panel.downloads.pause(d)
    qtbot.waitUntil(lambda: d.state == PAUSED, timeout=20_000)
    partial = [b for b in blobs(tmp_path) if b.name.endswith(".incomplete")]
    assert len(partial) == 1 and 0 < partial[0].stat().st_size < d.total
    assert not any("tiny-llama-Q4_K_M" in p for p in picker_paths(hub_window))
    assert HubAdapter().cached_models() == []  # nothing half-written is a model
    have = partial[0].stat().st_size
    hub.chunk_delay_s = 0.0
    with qtbot.waitSignal(panel.model_downloaded, timeout=30_000) as blocker:
        panel.downloads.resume(d)
    assert d.state == DONE and Path(blocker.args[0]).stat().st_size == d.total
    assert ("GET", f"bytes={have}-") in {
        (m, rng) for m, path, rng, _s, _n in hub.log if path.startswith("/cdn/")
    }
    qtbot.waitUntil(lambda: blocker.args[0] in picker_paths(hub_window), timeout=5000)


def test_real_download_interrupted_by_quitting_resumes_at_the_next_start(
    make_window, hub, qtbot, tmp_path, data_dir
):
    w = make_window(FakeEngine(hub=HubAdapter()))
    panel = discover(w)
    search(panel, qtbot, "tiny", n_repos=1)
    select_file(panel, qtbot, "tiny-llama-Q4_K_M.gguf")
    hub.chunk_delay_s = 0.03
    panel.download_selected()
    d = panel.downloads.model.download(0)
    qtbot.waitUntil(lambda: d.done >= 1 << 20, timeout=20_000)
    w.close()  # quits mid-download: the worker is cancelled, the partial file stays
    partial = [b for b in blobs(tmp_path) if b.name.endswith(".incomplete")]
    assert len(partial) == 1 and partial[0].stat().st_size >= 1 << 20
    have = partial[0].stat().st_size
    hub.chunk_delay_s = 0.0
    w2 = make_window(FakeEngine(hub=HubAdapter()), data_dir)
    panel2 = discover(w2)
    assert panel2.downloads.model.rowCount() == 1 and panel2.earlier_label.text()
    with qtbot.waitSignal(panel2.model_downloaded, timeout=30_000) as blocker:
        panel2.resume_all()
    assert ("GET", f"bytes={have}-") in {
        (m, rng) for m, path, rng, _s, _n in hub.log if path.startswith("/cdn/")
    }
    assert Path(blocker.args[0]).stat().st_size == panel2.downloads.model.download(0).total


def test_real_cancel_deletes_the_partial_file(hub_window, hub, qtbot, tmp_path):
    panel = discover(hub_window)
    search(panel, qtbot, "tiny", n_repos=1)
    select_file(panel, qtbot, "tiny-llama-Q4_K_M.gguf")
    hub.chunk_delay_s = 0.03
    panel.download_selected()
    d = panel.downloads.model.download(0)
    qtbot.waitUntil(lambda: d.done >= 1 << 20, timeout=20_000)
    panel.downloads.cancel(d)
    qtbot.waitUntil(lambda: panel.downloads.model.rowCount() == 0, timeout=20_000)
    assert not [b for b in blobs(tmp_path) if b.name.endswith(".incomplete")]
    assert HubAdapter().cached_models() == [] and not any(
        "Q4_K_M" in p for p in picker_paths(hub_window)
    )


def test_real_gated_repo_asks_for_a_token_and_works_with_it(hub_window, hub, qtbot):
    panel = discover(hub_window)
    search(panel, qtbot, "gated", n_repos=1)
    qtbot.waitUntil(lambda: panel.files.rowCount() == 1, timeout=10_000)
    qtbot.waitUntil(lambda: panel.token_row.isVisibleTo(panel), timeout=10_000)  # its header: 401
    assert panel.error.text().startswith("This repository needs a Hugging Face token")
    assert "HF_TOKEN" in panel.error.text()
    panel.token_edit.setText(hub.token)
    panel.use_token()
    qtbot.waitUntil(lambda: panel.files.fit("gated-llama-Q8_0.gguf") is not None, timeout=10_000)
    fit = panel.files.fit("gated-llama-Q8_0.gguf")
    assert fit.supported and not panel.error.isVisibleTo(panel)


def test_real_disk_full_is_said_before_the_transfer(hub_window, hub, qtbot, monkeypatch, tmp_path):
    monkeypatch.setattr(
        "engine.hub.client.shutil.disk_usage", lambda _p: FakeDisk(1 << 30, 1 << 30, 1024)
    )
    panel = discover(hub_window)
    search(panel, qtbot, "tiny", n_repos=1)
    select_file(panel, qtbot, "tiny-llama-Q4_K_M.gguf")
    panel.download_selected()
    qtbot.waitUntil(lambda: panel.error.isVisibleTo(panel), timeout=10_000)
    assert "not enough disk space" in panel.error.text()
    assert panel.downloads.model.index(0, 4).data().startswith("failed: ")
    assert not [b for b in blobs(tmp_path) if b.name.endswith(".incomplete")]


def test_real_no_network_is_said_plainly(make_window, qtbot, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port('127.0.0.1')}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    panel = discover(make_window(FakeEngine(hub=HubAdapter())))
    search(panel, qtbot, "tiny", n_repos=0)
    qtbot.waitUntil(lambda: panel.error.isVisibleTo(panel), timeout=20_000)
    assert panel.error.text().startswith("No connection to the Hugging Face Hub")


def test_no_worker_starts_after_the_pool_shut_down(qtbot):
    """A timer that fires while the window closes (the load panel's estimate after a download is
    selected) must not start a thread no one waits for: destroyed while running, it aborts."""
    from app.workers import CallWorker, WorkerPool

    ran = []
    pool = WorkerPool()
    pool.shutdown()
    pool.start(CallWorker(lambda: ran.append(1)))
    assert not pool.busy()
    qtbot.wait(200)
    assert ran == []
