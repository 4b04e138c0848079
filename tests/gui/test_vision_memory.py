"""The vision projector on the Memory tab and in the load panel's estimate: its own rows (weights,
image encode buffer) from the real engine's figures, and rows that add up to the totals shown."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from app.dto import DeviceShare, LoadParams, MemoryFigures
from app.format import human_bytes
from app.vision_files import find_mmproj
from app.widgets.memory_dashboard import IMAGE_BUFFER, PROJECTOR, PROJECTOR_WEIGHTS
from mmprojgen import write_tiny_vlm_pair

PARAMS = LoadParams(n_ctx=256, n_seq_max=1, n_batch=64, n_ubatch=64)


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    """(adapter, model path, its paired mmproj, loaded session) over a tiny gemma3 pair."""
    from app.engine_adapter import EngineAdapter

    lm, _ = write_tiny_vlm_pair(tmp_path_factory.mktemp("vlm"), "gemma3")
    mmproj = find_mmproj(str(lm)).mmproj
    assert mmproj
    adapter = EngineAdapter()
    params = replace(PARAMS, mmproj=mmproj)
    session = adapter.load(str(lm), params, lambda f, m: None, threading.Event())
    yield adapter, str(lm), mmproj, session
    session.close()


def _segments(bar) -> dict[str, float]:
    return {s.label: s.value for s in bar.segments}


def test_estimate_adds_the_paired_projector(vlm):
    from engine.vision import estimate_projector

    adapter, lm, mmproj, _ = vlm
    text_only = adapter.estimate(lm, PARAMS)
    with_vision = adapter.estimate(lm, replace(PARAMS, mmproj=mmproj))
    weights, compute = estimate_projector(mmproj)
    assert weights > 0 and compute > 0
    assert (text_only.projector_weights_bytes, text_only.projector_compute_bytes) == (0, 0)
    assert with_vision.projector_weights_bytes == weights
    assert with_vision.projector_compute_bytes == compute
    assert with_vision.total_bytes == text_only.total_bytes + weights + compute
    # in RAM: the CPU needs it (no device share holds it)
    assert with_vision.host_bytes == text_only.host_bytes + weights + compute
    assert with_vision.devices == text_only.devices


def test_loaded_session_reports_the_projector_as_the_estimate_did(vlm):
    adapter, lm, mmproj, session = vlm
    fig = session.memory()
    est = adapter.estimate(lm, replace(PARAMS, mmproj=mmproj))
    # the file's tensor bytes, and the buffer from the same formula before and after loading
    assert fig.projector_weights_bytes == est.projector_weights_bytes > 0
    assert fig.projector_compute_bytes > 0
    parts = (
        fig.weights_bytes
        + fig.kv_bytes
        + fig.compute_bytes
        + fig.metadata_bytes
        + fig.projector_weights_bytes
        + fig.projector_compute_bytes
    )
    assert fig.total_bytes == parts


def test_estimate_and_loaded_image_buffer_agree(vlm):
    adapter, lm, mmproj, session = vlm
    est = adapter.estimate(lm, replace(PARAMS, mmproj=mmproj))
    assert est.projector_compute_bytes == session.memory().projector_compute_bytes


def test_dashboard_shows_projector_rows_that_add_up_to_the_total(window, vlm):
    d = window.dashboard
    fig = vlm[3].memory()
    d.set_figures(fig)
    assert d.figure_cards[PROJECTOR].isVisibleTo(d)
    assert d.figure_labels[PROJECTOR].text() == human_bytes(fig.projector_weights_bytes)
    detail = d.figure_labels[PROJECTOR + ".detail"].text()
    assert detail == f"+ {human_bytes(fig.projector_compute_bytes)} image buffer"
    seg = _segments(d.bar)
    assert seg[PROJECTOR_WEIGHTS] == fig.projector_weights_bytes
    assert seg[IMAGE_BUFFER] == fig.projector_compute_bytes
    assert d.bar.total() == fig.total_bytes
    assert d.figure_labels["Engine total"].text() == human_bytes(fig.total_bytes)
    assert d.figure_labels["Engine total.detail"].text() == "sum of the bar"


def test_dashboard_hides_projector_rows_for_a_text_model(window, vlm):
    d = window.dashboard
    d.set_figures(vlm[3].memory())
    fig = replace(vlm[3].memory(), projector_weights_bytes=0, projector_compute_bytes=0)
    fig = replace(fig, total_bytes=fig.total_bytes - vlm[3].memory().projector_bytes)
    d.set_figures(fig)
    assert not d.figure_cards[PROJECTOR].isVisibleTo(d)
    assert PROJECTOR_WEIGHTS not in _segments(d.bar)
    assert d.bar.total() == fig.total_bytes


def test_cpu_column_holds_the_projector_when_layers_are_offloaded(window):
    d = window.dashboard
    cpu = DeviceShare("CPU", 1000, 200, 50, 1)
    gpu = DeviceShare("GL0", 3000, 600, 70, 2)
    fig = MemoryFigures(
        weights_bytes=4000,
        kv_bytes=800,
        compute_bytes=120,
        metadata_bytes=0,
        total_bytes=4920 + 500 + 80,
        devices=(cpu, gpu),
        projector_weights_bytes=500,
        projector_compute_bytes=80,
    )
    d.set_figures(fig)
    cpu_bar, gpu_bar = d.device_bars["CPU"], d.device_bars["GL0"]
    assert _segments(cpu_bar)[PROJECTOR_WEIGHTS] == 500
    assert PROJECTOR_WEIGHTS not in _segments(gpu_bar)
    # the columns add up to the total, and each title to its bar
    assert cpu_bar.total() + gpu_bar.total() == fig.total_bytes
    assert d.device_titles["CPU"].text().endswith(human_bytes(cpu_bar.total()))
    assert cpu_bar.total() == fig.host_bytes


def test_load_panel_estimate_bar_adds_up_to_the_ram_it_names(window, vlm):
    adapter, lm, mmproj, _ = vlm
    fig = adapter.estimate(lm, replace(PARAMS, mmproj=mmproj))
    panel = window.picker.load_panel
    panel._show_estimate(fig)
    seg = _segments(panel.estimate_bar)
    assert seg[PROJECTOR_WEIGHTS] == fig.projector_weights_bytes
    assert seg[IMAGE_BUFFER] == fig.projector_compute_bytes
    assert panel.estimate_bar.total() == fig.host_bytes
    assert human_bytes(fig.host_bytes) in panel.estimate_label.text()
