"""The dashboard timeline follows the last reply; the backends panel's OpenGL line falls back to
the engine's own GL device when Qt's offscreen platform has no GL context."""

from __future__ import annotations

import time

import pytest
from PySide6.QtGui import QColor

from app import gl_info
from app.dto import DeviceDesc
from app.widgets.timeline_chart import MAX_WINDOW_S, MIN_WINDOW_S, WINDOW_S, Series, TimelineChart


@pytest.fixture
def chart(qtbot):
    c = TimelineChart(
        [Series("RSS", QColor("gray")), Series("tokens/s", QColor("orange"), right_axis=True)]
    )
    qtbot.addWidget(c)
    return c


def test_timeline_spans_the_last_reply_not_a_fixed_window(chart, qtbot):
    now = time.monotonic()
    for i in range(300):  # five minutes of memory polls
        chart.add("RSS", 1e8, t=now - 300 + i)
    assert chart.span_s(now) == WINDOW_S  # no reply yet: the default window
    for i in range(20):  # an old reply, then one of 20 s that ended 1 s ago
        chart.add("tokens/s", 50.0, t=now - 200 + i)
    for i in range(21):
        chart.add("tokens/s", 80.0, t=now - 21 + i)
    span = chart.span_s(now)
    assert 21 < span <= 21 + 2.5  # the last reply (and a little before it) fills the chart
    chart.series["tokens/s"].points.clear()
    for i in range(3):  # a reply of 2 s: no narrower than MIN_WINDOW_S
        chart.add("tokens/s", 80.0, t=now - 3 + i)
    assert chart.span_s(now) == MIN_WINDOW_S
    chart.series["tokens/s"].points.clear()
    for i in range(21):
        chart.add("tokens/s", 80.0, t=now - 21 + i)
    chart.window_s = 60.0  # zoomed by the user
    assert chart.span_s(now) == 60.0
    chart.mouseDoubleClickEvent(None)  # back to following the data
    assert chart.span_s(now) == span
    assert chart.span_s(now + 10_000) == MAX_WINDOW_S
    chart.resize(600, 220)
    chart.show()
    qtbot.waitExposed(chart)
    chart.grab()  # paints with the followed span


def test_opengl_info_falls_back_to_the_engines_gl_device(monkeypatch):
    """Without a Qt GL context the line shows the engine's own OpenGL device (its EGL context),
    and an unavailable device is never shown as if it were there."""
    monkeypatch.setattr(gl_info, "_qt_info", lambda: None)
    cpu = DeviceDesc("CPU", "CPU", "Some CPU")
    gl = DeviceDesc(
        "GL0",
        "OpenGL",
        "llvmpipe (LLVM 15.0.6, 256 bits) (4.5 (Core Profile) Mesa 22.3.6)",
        caps=("GL 4.5", "compute", "EGL surfaceless"),
    )
    renderer, version = gl_info.opengl_info([cpu, gl])
    assert renderer.startswith("llvmpipe (LLVM 15.0.6") and "EGL surfaceless" in renderer
    assert version == "GL 4.5"
    lost = DeviceDesc("GL0", "OpenGL", "not available", available=False, reason="no EGL")
    assert gl_info.opengl_info([cpu, lost]) == (gl_info.NOT_AVAILABLE, gl_info.NOT_AVAILABLE)


def test_opengl_line_follows_the_devices_the_engine_found(qtbot):
    """The panel asks the real engine for its devices: where the engine has a GL device, the line
    names it (this machine's Mesa EGL in CI); where it has none, 'not available'."""
    from engine.backends import list_devices

    devices = [
        DeviceDesc(
            d.name,
            d.backend,
            d.description,
            d.total_bytes,
            d.free_bytes,
            d.caps,
            d.available,
            d.reason,
        )
        for d in list_devices()
    ]
    renderer, version = gl_info._device_info(devices) or (
        gl_info.NOT_AVAILABLE,
        gl_info.NOT_AVAILABLE,
    )
    gl = next((d for d in devices if d.backend == "OpenGL"), None)
    assert gl is not None  # discovery always lists GL0, available or not
    if gl.available:
        assert gl.description in renderer and version.startswith("GL ")
    else:
        assert (renderer, version) == (gl_info.NOT_AVAILABLE, gl_info.NOT_AVAILABLE)
