"""engine/hub/client.py and -hf over a local Hub-shaped server (tests/hub_server.py): search, quant
choice, range-read fit, download into the HF cache, resume, cancel, split sets, auth errors,
offline use, the CLI and the router's listing. Never the internet."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest
from gguf import GGUFWriter

import hub_server
from engine.errors import HubError
from engine.hub import client as hub
from engine.hub import fit as hub_fit
from ggufgen import write_tiny_model

TOKEN = "hf_" + "k" * 34


def _unknown_arch_gguf(path):
    w = GGUFWriter(str(path), "mamba9")
    w.add_name("not-a-supported-arch")
    import numpy as np

    w.add_tensor("token_embd.weight", np.zeros((16, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def payloads(tmp_path_factory):
    d = tmp_path_factory.mktemp("hub-payloads")
    (d / "split").mkdir()
    return {
        "small": write_tiny_model(d / "small.gguf", seed=1),
        # ~8 MB of weights behind a small header: what a range read should skip
        "big": write_tiny_model(
            d / "big.gguf", n_embd=512, n_head=8, n_head_kv=4, n_ff=1536, seed=2
        ),
        "split": write_tiny_model(d / "split" / "tiny-Q8_0.gguf", split_max_tensors=8),
        "weird": _unknown_arch_gguf(d / "weird.gguf"),
    }


@pytest.fixture
def server(tmp_path, monkeypatch, payloads):
    split = sorted(payloads["split"].parent.glob("*.gguf"))
    repos = {
        "acme/Tiny-GGUF": {
            "tiny-Q8_0.gguf": payloads["small"],
            "tiny-Q4_K_M.gguf": payloads["big"],
            "mmproj-tiny-F16.gguf": b"not a model",
            "README.md": b"# tiny",
        },
        "acme/Split-GGUF": {f"Q8_0/{p.name}": p for p in split},
        "acme/Gated-GGUF": {"g-Q4_K_M.gguf": payloads["small"]},
        "acme/Private-GGUF": {"p-Q4_K_M.gguf": payloads["small"]},
        "acme/NoGGUF": {"model.safetensors": b"\0" * 64, "README.md": b"# none"},
        "acme/Weird-GGUF": {"weird-Q4_0.gguf": payloads["weird"]},
    }
    srv = hub_server.start(
        tmp_path, repos, gated=("acme/Gated-GGUF",), private=("acme/Private-GGUF",), token=TOKEN
    )
    monkeypatch.setenv("HF_ENDPOINT", srv.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in (
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN",
        "HF_HUB_OFFLINE",
        "LLAMA_ARG_HF_REPO",
        "LLAMA_ARG_HF_FILE",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hub, "_RETRY_PAUSE_S", 0.01)
    # huggingface_hub's user agent fetches an "agent harness" list from the endpoint it was
    # imported with (maybe the real Hub): no such call from the tests
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    yield srv
    srv.stop()


def _cdn_gets(srv):
    return [entry for entry in srv.log if entry[1].startswith("/cdn/")]


# -- listing and choice -------------------------------------------------------------------------


def test_hub_search_lists_gguf_repos_with_model_files(server):
    repos = hub.search("gguf")
    ids = [r.repo_id for r in repos]
    assert "acme/Tiny-GGUF" in ids and "acme/NoGGUF" not in ids and "acme/Private-GGUF" not in ids
    tiny = repos[ids.index("acme/Tiny-GGUF")]
    assert sorted(f.quant for f in tiny.files) == ["Q4_K_M", "Q8_0"]  # mmproj is not a model
    assert [r[1] for r in server.log] == ["/api/models"]  # one call
    sizes = {f.quant: f.size for f in hub.repo("acme/Tiny-GGUF").files}
    assert sizes["Q8_0"] == os.path.getsize(server.repos["acme/Tiny-GGUF"].files["tiny-Q8_0.gguf"])


def test_hub_resolve_picks_quants_like_llama_cpp(server):
    assert hub.resolve("acme/Tiny-GGUF").filename == "tiny-Q4_K_M.gguf"  # the default tag
    assert hub.resolve("acme/Tiny-GGUF:q8_0").filename == "tiny-Q8_0.gguf"  # case-insensitive
    assert hub.resolve("acme/Tiny-GGUF", filename="TINY-q8_0.gguf").filename == "tiny-Q8_0.gguf"
    assert hub.resolve("acme/Weird-GGUF").filename == "weird-Q4_0.gguf"  # no Q4_K_M/Q8_0: the first
    with pytest.raises(HubError, match=r"no 'Q5_K_S' file \(quants there: Q8_0, Q4_K_M\)") as e:
        hub.resolve("acme/Tiny-GGUF:Q5_K_S")
    assert e.value.reason == HubError.QUANT_NOT_FOUND and e.value.available == ("Q8_0", "Q4_K_M")


def test_hub_resolve_errors_are_one_line(server):
    cases = [
        ("acme/NoGGUF", HubError.NO_GGUF, "no GGUF model files"),
        # the Hub answers 401 for a missing repo as for a private one, when no token is sent
        ("acme/Missing-GGUF", HubError.AUTH, "not found, or private"),
        ("acme/Private-GGUF", HubError.AUTH, "-hft"),
        ("not-a-repo", HubError.NOT_FOUND, "expected <user>/<model>"),
    ]
    for spec, reason, text in cases:
        with pytest.raises(HubError) as e:
            hub.resolve(spec)
        assert e.value.reason == reason and text in str(e.value) and "\n" not in str(e.value)
    assert hub.resolve("acme/Private-GGUF", token=TOKEN).quant == "Q4_K_M"
    with pytest.raises(HubError, match="no such repository") as e:
        hub.resolve("acme/Missing-GGUF", token=TOKEN)
    assert e.value.reason == HubError.NOT_FOUND


def test_hub_gated_repo_needs_a_token(server):
    f = hub.resolve("acme/Gated-GGUF")  # the listing is public, the files are not
    for call in (lambda: hub_fit.remote_fit(f), lambda: hub.download(f)):
        with pytest.raises(HubError, match="gated repository.*HF_TOKEN.*hf auth login") as e:
            call()
        assert e.value.reason == HubError.AUTH
    with pytest.raises(HubError, match="no access") as e:
        hub_fit.remote_fit(f, token="hf_" + "w" * 34)  # a token without access: 403
    assert hub.download(f, token=TOKEN).is_file()


# -- fit -------------------------------------------------------------------------------------------


def test_hub_fit_reads_the_header_only(server):
    f = hub.resolve("acme/Tiny-GGUF:Q4_K_M")
    fit = hub_fit.remote_fit(f)
    assert fit.supported and (fit.arch, fit.n_ctx_train, fit.has_chat_template) == (
        "llama",
        256,
        True,
    )
    assert fit.verdict == hub_fit.FITS and fit.memory is not None and fit.memory.weights_bytes > 0
    assert fit.bytes_read < f.size / 3, (fit.bytes_read, f.size)
    assert all(entry[2] and entry[2].startswith("bytes=") for entry in _cdn_gets(server))
    assert fit.quant_bytes["Q8_0"] > 0 and fit.n_params > 1_000_000


def test_hub_fit_says_unsupported_up_front(server):
    fit = hub_fit.remote_fit(hub.resolve("acme/Weird-GGUF"))
    assert not fit.supported and not fit.arch_supported and "mamba9" in fit.summary()


# -- download ----------------------------------------------------------------------------------------


def test_hub_download_lands_in_the_hf_cache(server, tmp_path):
    from huggingface_hub import try_to_load_from_cache

    f = hub.resolve("acme/Tiny-GGUF")
    seen = []
    path = hub.download(f, progress=lambda done, total: seen.append((done, total)))
    src = server.repos["acme/Tiny-GGUF"].files["tiny-Q4_K_M.gguf"]
    assert path.read_bytes() == src.read_bytes() and seen[-1] == (f.size, f.size)
    assert str(path).startswith(
        str(tmp_path / "hf" / "hub" / "models--acme--Tiny-GGUF" / "snapshots")
    )
    assert path.is_symlink() and not list(path.parent.parent.parent.glob("blobs/*.incomplete"))
    # huggingface_hub itself finds it (same cache layout, refs/main written)
    assert try_to_load_from_cache(
        "acme/Tiny-GGUF", "tiny-Q4_K_M.gguf", cache_dir=tmp_path / "hf" / "hub"
    ) == str(path)
    n = len(_cdn_gets(server))
    again = hub.resolve("acme/Tiny-GGUF")
    assert again.local_path == path and hub.download(again) == path and len(_cdn_gets(server)) == n
    assert [(m.spec, m.local_path) for m in hub.cached_models()] == [
        ("acme/Tiny-GGUF:Q4_K_M", path)
    ]


def test_hub_download_reconnects_after_a_dropped_connection(server):
    f = hub.resolve("acme/Tiny-GGUF")
    server.drops["tiny-Q4_K_M.gguf"] = [300_000]
    path = hub.download(f)
    assert _sha(path) == f.parts[0].sha256
    assert any(entry[2] == "bytes=300000-" and entry[3] == 206 for entry in _cdn_gets(server))


def test_hub_interrupted_download_resumes_on_the_next_call(server, monkeypatch):
    monkeypatch.setattr(hub, "_RETRIES", 0)
    f = hub.resolve("acme/Tiny-GGUF")
    server.drops["tiny-Q4_K_M.gguf"] = [200_000]
    with pytest.raises(HubError, match="interrupted.*run the same command again to resume") as e:
        hub.download(f)
    assert e.value.reason == HubError.INTERRUPTED
    assert hub.resolve("acme/Tiny-GGUF").local_path is None  # nothing half-written is a model
    partial = list(hub.cache_dir().glob("models--acme--Tiny-GGUF/blobs/*.incomplete"))
    assert [p.stat().st_size for p in partial] == [200_000]
    path = hub.download(f)  # a new call, as after a restart
    assert _sha(path) == f.parts[0].sha256 and _cdn_gets(server)[-1][2] == "bytes=200000-"


def test_hub_cancel_keeps_a_resumable_partial_file(server):
    f = hub.resolve("acme/Tiny-GGUF")
    cancel = threading.Event()
    server.chunk_delay_s = 0.002
    with pytest.raises(HubError) as e:
        hub.download(f, progress=lambda done, total: done > 0 and cancel.set(), cancel=cancel)
    assert e.value.reason == HubError.CANCELLED and hub.resolve("acme/Tiny-GGUF").local_path is None
    kept = sum(
        p.stat().st_size for p in hub.cache_dir().glob("models--acme--Tiny-GGUF/blobs/*.incomplete")
    )
    assert 0 < kept < f.size
    server.chunk_delay_s = 0
    assert _sha(hub.download(f)) == f.parts[0].sha256
    assert _cdn_gets(server)[-1][2] == f"bytes={kept}-"


def test_hub_discard_partial_deletes_only_the_unfinished_blob(server):
    done = hub.resolve("acme/Tiny-GGUF:Q8_0")
    hub.download(done)
    f = hub.resolve("acme/Tiny-GGUF")
    cancel = threading.Event()
    server.chunk_delay_s = 0.002
    with pytest.raises(HubError):
        hub.download(f, progress=lambda done_, total: done_ > 0 and cancel.set(), cancel=cancel)
    blobs = hub.cache_dir() / "models--acme--Tiny-GGUF" / "blobs"
    assert list(blobs.glob("*.incomplete"))
    hub.discard_partial(f)
    hub.discard_partial(done)  # nothing unfinished: a no-op
    assert not list(blobs.glob("*.incomplete"))
    assert hub.resolve("acme/Tiny-GGUF:Q8_0").local_path is not None


def test_hub_corrupt_download_is_deleted(server):
    repo = server.repos["acme/Tiny-GGUF"]
    src = repo.files["tiny-Q8_0.gguf"]
    copy = src.with_name("tampered.gguf")
    copy.write_bytes(src.read_bytes())
    repo.files["tiny-Q8_0.gguf"] = copy
    repo.meta("tiny-Q8_0.gguf")  # the listing's sha256 is of the original bytes
    data = bytearray(copy.read_bytes())
    data[-1] ^= 0xFF
    copy.write_bytes(bytes(data))
    with pytest.raises(HubError, match="corrupt") as e:
        hub.download(hub.resolve("acme/Tiny-GGUF:Q8_0"))
    assert e.value.reason == HubError.CORRUPT
    assert not list(hub.cache_dir().glob("models--acme--Tiny-GGUF/blobs/*"))


def test_hub_disk_full_is_said_before_downloading(server, monkeypatch):
    import shutil

    monkeypatch.setattr(
        shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000)
    )
    with pytest.raises(HubError, match="not enough disk space") as e:
        hub.download(hub.resolve("acme/Tiny-GGUF"))
    assert e.value.reason == HubError.DISK_FULL and not _cdn_gets(server)


# -- split sets ----------------------------------------------------------------------------------------


def test_hub_split_set_downloads_together_and_loads_as_one_model(server, payloads):
    from engine.context import Context, ContextParams
    from engine.generate import generate
    from engine.model import load_model
    from engine.sampling import SamplingParams

    f = hub.resolve("acme/Split-GGUF")
    assert (
        f.is_split
        and f.quant == "Q8_0"
        and [p.filename for p in f.parts]
        == [f"Q8_0/tiny-Q8_0-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    )
    fit = hub_fit.remote_fit(f)
    assert fit.supported and fit.n_params > 0 and len({e[1] for e in _cdn_gets(server)}) == 3
    path = hub.download(f)
    assert sorted(p.name for p in path.parent.iterdir()) == [
        p.filename.split("/")[1] for p in f.parts
    ]

    def tokens(p):
        model = load_model(p)
        ctx = Context(model, ContextParams(n_ctx=64))
        prompt = model.tokenizer.encode("hello world", add_special=True)
        return [
            s.token
            for s in generate(
                ctx, model.tokenizer, prompt, SamplingParams(temperature=0), n_predict=3
            )
        ]

    reference = write_tiny_model(
        payloads["split"].parent.parent / "unsplit.gguf"
    )  # same seed, one file
    assert tokens(path) == tokens(reference)


# -- offline -----------------------------------------------------------------------------------------


def test_hub_offline_resolves_from_the_cache(server, monkeypatch):
    path = hub.download(hub.resolve("acme/Tiny-GGUF:Q4_K_M"))
    server.stop()  # no network
    assert hub.resolve("acme/Tiny-GGUF").local_path == path
    with pytest.raises(HubError, match="cannot reach") as e:
        hub.search("tiny")
    assert e.value.reason == HubError.OFFLINE
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.resolve("acme/Tiny-GGUF:q4_k_m").local_path == path
    assert hub.download(hub.resolve("acme/Tiny-GGUF")) == path
    for spec in ("acme/Tiny-GGUF:Q8_0", "acme/Split-GGUF"):
        with pytest.raises(HubError) as e:
            hub.resolve(spec)
        assert e.value.reason in (HubError.OFFLINE, HubError.QUANT_NOT_FOUND)


# -- CLI and router ------------------------------------------------------------------------------------


def test_cli_hf_flag_on_generate_and_info(server, capsys):
    from engine.cli import main

    assert main(["info", "-hf", "acme/Tiny-GGUF:Q8_0", "-c", "128"]) == 0
    out = capsys.readouterr()
    assert "architecture" in out.out and "llama" in out.out and "tiny-Q8_0.gguf" in out.out
    assert "Q8_0" in out.err and "FITS" in out.err  # the fit, printed before the download
    assert (
        main(
            [
                "generate",
                "-hf",
                "acme/Tiny-GGUF",
                "-hff",
                "tiny-q8_0.gguf",
                "-p",
                "hello",
                "-n",
                "3",
                "--temp",
                "0",
                "-c",
                "64",
                "--no-mmproj",  # the fixture's mmproj is not a projector
            ]
        )
        == 0
    )
    assert main(["generate", "-hff", "x.gguf", "-p", "hi"]) == 1
    assert "give -hf" in capsys.readouterr().err


def test_cli_gui_hf_opens_the_app_on_the_downloaded_file(server, monkeypatch):
    import app.main
    from engine.cli import main

    opened = []
    monkeypatch.setattr(app.main, "run", lambda args: opened.append(args.model) or 0)
    assert main(["gui", "-hf", "acme/Tiny-GGUF:Q8_0"]) == 0
    assert opened == [str(hub.resolve("acme/Tiny-GGUF:Q8_0").local_path)]


def test_cli_models_search_fit_and_pull(server, capsys):
    from engine.cli import main

    assert main(["models", "search", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "acme/Tiny-GGUF" in out and "Q4_K_M" in out and "MiB" in out
    assert main(["models", "fit", "acme/Tiny-GGUF"]) == 0
    assert "FITS" in capsys.readouterr().out and not any(e[2] is None for e in _cdn_gets(server))
    assert main(["models", "pull", "acme/Weird-GGUF"]) == 1  # refused before the download
    assert "cannot run it" in capsys.readouterr().err and all(e[2] for e in _cdn_gets(server))
    assert main(["models", "pull", "acme/Tiny-GGUF:Q8_0"]) == 0
    assert capsys.readouterr().out.strip().endswith("tiny-Q8_0.gguf")
    assert main(["models", "list"]) == 0
    assert "acme/Tiny-GGUF:Q8_0" in capsys.readouterr().out


def test_router_lists_the_hf_cache(server):
    from engine.router.hub_access import discover_hub_models

    assert discover_hub_models() == {}
    path = hub.download(hub.resolve("acme/Split-GGUF"))
    assert discover_hub_models() == {"acme/Split-GGUF:Q8_0": path}


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.model
def test_hub_fit_of_a_starter_model_reads_only_its_header(tmp_path, monkeypatch, smollm2_path):
    from huggingface_hub import constants

    srv = hub_server.start(tmp_path, {"starter/SmolLM2-GGUF": {smollm2_path.name: smollm2_path}})
    monkeypatch.setenv("HF_ENDPOINT", srv.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    try:
        f = hub.resolve("starter/SmolLM2-GGUF")
        fit = hub_fit.remote_fit(f)
        assert (
            fit.supported
            and fit.arch == "llama"
            and fit.has_chat_template
            and fit.n_ctx_train == 8192
        )
        assert fit.bytes_read <= 4 << 20 and f.size > 90 << 20  # a few MB of a 94 MiB file
        from engine.model_info import inspect_model

        assert (
            fit.memory is not None
            and fit.memory.weights_bytes == inspect_model(smollm2_path).weights_bytes
        )
    finally:
        srv.stop()


def test_serve_hf_downloads_then_serves(server):
    import json
    import subprocess
    import sys
    from pathlib import Path

    import httpx

    env = dict(os.environ, HF_HUB_DISABLE_TELEMETRY="1")
    cmd = [
        sys.executable,
        "-m",
        "engine",
        "serve",
        "-hf",
        "acme/Tiny-GGUF:Q8_0",
        "--port",
        "0",
        "-c",
        "128",
        "--ready-json",
        "--no-mmproj",  # the fixture's mmproj is not a projector
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            event = json.loads(line)
            if event["event"] == "ready":
                break
        models = httpx.get(f"{event['url']}/v1/models", timeout=10).json()["data"]
        assert "tiny-Q8_0" in models[0]["id"]
        assert (
            hub.resolve("acme/Tiny-GGUF:Q8_0").local_path is not None
        )  # downloaded into the cache
    finally:
        proc.terminate()
        proc.wait(30)
