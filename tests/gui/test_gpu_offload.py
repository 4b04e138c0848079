"""GPU offload in the app (issue 15): the backends panel's device list, the load panel's GPU
layers control and CPU / GPU estimate with its VRAM warning, the dashboard's per-device bars,
and the real adapter's estimate and load with a fake GL0 device."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from app.dto import LoadParams
from app.engine_adapter import EngineAdapter
from app.settings import load_settings

from .conftest import load
from .fake_engine import (
    COMPUTE_BYTES,
    FAKE_CPU,
    FAKE_GL0,
    FAKE_GL0_MISSING,
    HEAD_BYTES,
    LAYER_BYTES,
    N_LAYER,
    FakeEngine,
)


def _window(make_window, qtbot, *devices):
    w = make_window(FakeEngine(devices=[FAKE_CPU, *devices]))
    qtbot.waitUntil(lambda: bool(w.ctx.devices), timeout=3000)
    return w


def _open(w, qtbot, path):
    w.picker.open_path(path)
    panel = w.picker.load_panel
    qtbot.waitUntil(
        lambda: panel.info is not None and "RAM is free" in panel.estimate_label.text(),
        timeout=3000,
    )
    return panel


def _segments(bar) -> dict[str, float]:
    return {s.label: s.value for s in bar.segments}


# backends panel -------------------------------------------------------------------------------
def test_backends_panel_lists_every_device(make_window, qtbot):
    w = _window(make_window, qtbot, FAKE_GL0)
    panel = w.dashboard.backends
    assert list(panel.device_labels) == ["CPU", "GL0"]
    gl = panel.device_labels["GL0"].text()
    assert (
        FAKE_GL0.description in gl
        and "8.0 GiB total · 6.0 GiB free" in gl
        and gl.endswith("· available")
    )
    assert "GL 4.5, compute" in gl
    assert panel.labels["CPU"].text() not in ("", "…")  # the CPU rows stay
    # a listed GL device names its renderer: the display's renderer rows step aside
    assert not panel.form.isRowVisible(panel.labels["OpenGL renderer"])


def test_backends_panel_says_why_a_device_cannot_be_used(make_window, qtbot):
    w = _window(make_window, qtbot, FAKE_GL0_MISSING)
    text = w.dashboard.backends.device_labels["GL0"].text()
    assert "memory size not reported" in text
    assert "not available: OpenGL 3.3 only: compute shaders need 4.3" in text


def test_backends_panel_with_the_cpu_alone_keeps_the_opengl_rows(make_window, qtbot):
    w = _window(make_window, qtbot)
    panel = w.dashboard.backends
    assert list(panel.device_labels) == ["CPU", "GPU"]
    assert "none found" in panel.device_labels["GPU"].text()
    assert panel.form.isRowVisible(panel.labels["OpenGL renderer"])


# load panel: the GPU layers control -----------------------------------------------------------
@pytest.mark.parametrize(
    "devices, why", [((), "No GPU device found"), ((FAKE_GL0_MISSING,), "compute shaders need 4.3")]
)
def test_gpu_layers_disabled_with_the_reason(make_window, qtbot, gguf_path, devices, why):
    w = _window(make_window, qtbot, *devices)
    panel = _open(w, qtbot, gguf_path)
    assert not panel.n_gpu_layers.isEnabled() and not panel.gpu_all.isEnabled()
    assert why in panel.n_gpu_layers.toolTip()
    assert not panel.gpu_bar.isVisibleTo(panel)  # nothing offloaded, no GPU bar


def test_gpu_layers_range_follows_the_model(make_window, qtbot, gguf_path):
    w = _window(make_window, qtbot, FAKE_GL0)
    panel = _open(w, qtbot, gguf_path)
    assert panel.n_gpu_layers.isEnabled()
    assert (panel.n_gpu_layers.minimum(), panel.n_gpu_layers.maximum()) == (0, N_LAYER + 1)
    assert "GL0" in panel.n_gpu_layers.toolTip()
    panel.gpu_all.setChecked(True)
    assert not panel.n_gpu_layers.isEnabled() and panel.params().n_gpu_layers == -1
    panel.gpu_all.setChecked(False)
    panel.n_gpu_layers.setValue(3)
    assert panel.params().n_gpu_layers == 3


@pytest.mark.parametrize("n_gpu", [1, N_LAYER, N_LAYER + 1, -1])
def test_estimate_shows_the_cpu_gpu_split(make_window, qtbot, gguf_path, n_gpu):
    w = _window(make_window, qtbot, FAKE_GL0)
    panel = _open(w, qtbot, gguf_path)
    panel.set_params(replace(panel.params(), n_gpu_layers=n_gpu))
    on = N_LAYER if n_gpu < 0 else min(n_gpu, N_LAYER)
    head = HEAD_BYTES if n_gpu < 0 or n_gpu > N_LAYER else 0
    qtbot.waitUntil(
        lambda: _segments(panel.gpu_bar).get("Weights") == on * LAYER_BYTES + head, timeout=3000
    )
    assert panel.gpu_bar.isVisibleTo(panel) and panel.ram_title.isVisibleTo(panel)
    assert panel.ram_title.text() == f"CPU (RAM): {N_LAYER - on} layer" + (
        "" if N_LAYER - on == 1 else "s"
    )
    gpu, cpu = _segments(panel.gpu_bar), _segments(panel.estimate_bar)
    assert gpu["Compute"] == cpu["Compute"] == COMPUTE_BYTES
    assert (
        cpu["KV cache"] + gpu["KV cache"]
        == w.ctx.engine.estimate(gguf_path, panel.params()).kv_bytes
    )
    assert panel.gpu_bar.capacity == FAKE_GL0.free_bytes
    assert f"GL0 (GPU memory): {on} layer" in panel.gpu_title.text()
    assert (
        "The CPU needs" in panel.estimate_label.text()
        and "GL0 needs about" in panel.estimate_label.text()
    )
    assert panel.estimate_label.styleSheet() == ""  # fits: no warning colour
    panel.gpu_all.setChecked(False)
    panel.n_gpu_layers.setValue(0)
    qtbot.waitUntil(lambda: not panel.gpu_bar.isVisibleTo(panel), timeout=3000)


def test_estimate_warns_when_the_gpu_share_does_not_fit(make_window, qtbot, gguf_path):
    small = replace(FAKE_GL0, free_bytes=COMPUTE_BYTES)  # room for the scratch, not the layers
    w = _window(make_window, qtbot, small)
    panel = _open(w, qtbot, gguf_path)
    panel.n_gpu_layers.setValue(2)
    qtbot.waitUntil(
        lambda: "will not fit in GPU memory" in panel.estimate_label.text(), timeout=3000
    )
    assert "#d9534f" in panel.estimate_label.styleSheet()
    assert "use fewer GPU layers" in panel.estimate_label.text()


def test_estimate_says_when_the_gpu_memory_is_unknown(make_window, qtbot, gguf_path):
    w = _window(make_window, qtbot, replace(FAKE_GL0, total_bytes=None, free_bytes=None))
    panel = _open(w, qtbot, gguf_path)
    panel.n_gpu_layers.setValue(1)
    qtbot.waitUntil(
        lambda: "does not report its memory" in panel.estimate_label.text(), timeout=3000
    )


def test_load_passes_gpu_layers_and_settings_keep_them(make_window, qtbot, gguf_path):
    w = _window(make_window, qtbot, FAKE_GL0)
    panel = _open(w, qtbot, gguf_path)
    panel.n_gpu_layers.setValue(3)
    with qtbot.waitSignal(w.ctx.llm_loaded, timeout=5000):
        panel.start_load()
    assert w.ctx.engine.sessions[-1].params.n_gpu_layers == 3
    assert w.ctx.save()
    assert load_settings(w.ctx.qsettings).load.n_gpu_layers == 3


def test_settings_restore_all_layers(make_window, qtbot, gguf_path):
    w = _window(make_window, qtbot, FAKE_GL0)
    w.picker.load_panel.set_params(LoadParams(n_gpu_layers=-1))
    panel = _open(w, qtbot, gguf_path)
    assert panel.gpu_all.isChecked() and panel.params().n_gpu_layers == -1


# dashboard ------------------------------------------------------------------------------------
def test_dashboard_shows_one_bar_per_device(make_window, qtbot, gguf_path):
    w = _window(make_window, qtbot, FAKE_GL0)
    w.picker.load_panel.set_params(LoadParams(n_ctx=1024, n_gpu_layers=2))
    load(w, qtbot, gguf_path)
    d = w.dashboard
    qtbot.waitUntil(lambda: d.device_box.isVisibleTo(d), timeout=5000)
    shares = {s.device: s for s in d.figures.devices}
    assert list(d.device_bars) == ["CPU", "GL0"]
    for name, bar in d.device_bars.items():
        seg = _segments(bar)
        assert (seg["Weights"], seg["KV cache"], seg["Compute"]) == (
            shares[name].weights_bytes,
            shares[name].kv_bytes,
            shares[name].compute_bytes,
        )
    assert d.device_bars["GL0"].capacity == FAKE_GL0.total_bytes
    assert d.device_bars["CPU"].capacity == 0
    assert d.device_titles["GL0"].text().startswith("GL0: 2 layers")
    assert _segments(d.bar)["Compute"] == 2 * COMPUTE_BYTES  # the totals stay the sums


def test_dashboard_single_device_keeps_the_single_view(make_window, qtbot, gguf_path):
    w = _window(make_window, qtbot, FAKE_GL0)
    w.picker.load_panel.set_params(LoadParams(n_gpu_layers=0))
    load(w, qtbot, gguf_path)
    qtbot.waitUntil(lambda: w.dashboard.figures.devices != (), timeout=5000)
    assert not w.dashboard.device_box.isVisibleTo(w.dashboard)


# the real adapter, with a fake GL0 in the engine's registry ---------------------------------
@pytest.fixture
def gl0_registry(monkeypatch):
    import engine.backends as backends
    from engine.backends import DeviceInfo

    gl0 = DeviceInfo("GL0", "OpenGL", FAKE_GL0.description, 8 << 30, 6 << 30, ("GL 4.5",))
    monkeypatch.setattr(backends, "_gpu_devices", lambda: [gl0])
    backends.list_devices(refresh=True)
    yield gl0
    monkeypatch.undo()
    backends.list_devices(refresh=True)


def test_adapter_lists_devices_and_splits_the_estimate(gl0_registry, tiny_llama_path):
    adapter = EngineAdapter()
    assert [d.name for d in adapter.devices()] == ["CPU", "GL0"]
    info = adapter.inspect(str(tiny_llama_path))
    base = LoadParams(n_ctx=256, n_seq_max=1, n_batch=64, n_ubatch=64)
    assert [s.device for s in adapter.estimate(info.path, base).devices] == ["CPU"]
    fig = adapter.estimate(info.path, replace(base, n_gpu_layers=2))  # the head and the last layer
    cpu, gl0 = fig.devices
    assert (gl0.device, gl0.n_layers, cpu.n_layers) == ("GL0", 1, info.n_layer - 1)
    assert gl0.capacity_bytes == 6 << 30 and gl0.verdict == "fits" and cpu.verdict == ""
    assert (
        fig.compute_bytes == 2 * gl0.compute_bytes and fig.kv_bytes == cpu.kv_bytes + gl0.kv_bytes
    )
    every = adapter.estimate(info.path, replace(base, n_gpu_layers=-1)).devices
    assert every[1].n_layers == info.n_layer and every[0].n_layers == 0
    but_first = adapter.estimate(info.path, replace(base, n_gpu_layers=info.n_layer)).devices
    assert every[1].weights_bytes > but_first[1].weights_bytes  # "all" moves the first layer too


def test_adapter_without_a_usable_gpu_estimates_the_cpu_alone(tiny_llama_path, monkeypatch):
    import engine.backends as backends
    from engine.backends import DeviceInfo

    off = DeviceInfo("GL0", "OpenGL", "EGL", None, None, (), False, "no GL 4.3")
    monkeypatch.setattr(backends, "_gpu_devices", lambda: [off])
    backends.list_devices(refresh=True)
    try:
        fig = EngineAdapter().estimate(str(tiny_llama_path), LoadParams(n_ctx=256, n_gpu_layers=2))
        assert [s.device for s in fig.devices] == ["CPU"]
    finally:
        monkeypatch.undo()
        backends.list_devices(refresh=True)


def test_adapter_load_passes_gpu_layers_to_the_engine(gl0_registry, tiny_llama_path, monkeypatch):
    import engine.model

    real, seen = engine.model.load_model, {}

    def recording(path, n_threads=None, progress=None, **kw):
        seen.update(kw)  # the GPU itself is the gl backend's to test: load on the CPU here
        return real(path, n_threads, progress)

    monkeypatch.setattr(engine.model, "load_model", recording)
    adapter = EngineAdapter()
    info = adapter.inspect(str(tiny_llama_path))
    session = adapter.load(
        info.path,
        LoadParams(n_ctx=256, n_seq_max=1, n_batch=64, n_ubatch=64, n_gpu_layers=-1),
        lambda f, m: None,
        threading.Event(),
    )
    try:
        gpu = {k: seen.get(k) for k in ("n_gpu_layers", "device")}
        assert gpu == {"n_gpu_layers": info.n_layer + 1, "device": "GL0"}
    finally:
        session.close()
