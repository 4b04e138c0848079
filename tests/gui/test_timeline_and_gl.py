"""The dashboard timeline follows the last reply; the backends panel reads OpenGL through EGL
when Qt's offscreen platform has no GL context."""

from __future__ import annotations

import time

import pytest
from PySide6.QtGui import QColor

from app import gl_info
from app.widgets.timeline_chart import MAX_WINDOW_S, MIN_WINDOW_S, WINDOW_S, Series, TimelineChart


@pytest.fixture
def chart(qtbot):
    c = TimelineChart([Series("RSS", QColor("gray")), Series("tokens/s", QColor("orange"), right_axis=True)])
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


def test_opengl_info_falls_back_to_egl(monkeypatch):
    egl = gl_info._egl_info()
    if egl is None:
        pytest.skip("no EGL with a surfaceless or device platform here")
    monkeypatch.setattr(gl_info, "_qt_info", lambda: None)
    renderer, version = gl_info.opengl_info()
    assert (renderer, version) == egl and gl_info.NOT_AVAILABLE not in (renderer, version)
