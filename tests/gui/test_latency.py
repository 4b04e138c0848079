"""The GUI thread stays responsive while the engine works: event-loop latency p95.

A wall-clock guard, marked `perf` (deselected by default): run `pytest -m perf`, or
`python tests/bench_latency.py` for the figures."""

from __future__ import annotations

import time

import pytest
from PySide6.QtCore import QTimer

from .conftest import load
from .fake_engine import FakeEngine

TICK_MS = 10
# p95 lateness of a 10 ms timer tick; the GUI's target is under 50 ms. Measured 6.8-7.8 ms
# with the fake engine on the 2-core development machine with other test runs beside it
# (load average 3). The bound is 7x that: a busy machine delays every timer of every
# process, while the regression it is for (engine work on the GUI thread) costs whole
# decode steps per tick.
P95_LIMIT_MS = 50.0


class LatencyProbe:
    """A 10 ms timer; lateness of each tick is the event loop's latency."""

    def __init__(self):
        self.samples: list[float] = []
        self._last = time.perf_counter()
        self.timer = QTimer(interval=TICK_MS, timeout=self._tick)

    def _tick(self) -> None:
        now = time.perf_counter()
        self.samples.append(max((now - self._last) * 1000.0 - TICK_MS, 0.0))
        self._last = now

    def start(self) -> None:
        self._last = time.perf_counter()
        self.timer.start()

    def p95(self) -> float:
        s = sorted(self.samples)
        return s[int(0.95 * (len(s) - 1))]


@pytest.mark.perf
def test_event_loop_latency_while_loading_and_generating(make_window, qtbot, gguf_path, perf_figure):
    w = make_window(FakeEngine(reply=" ".join(["tok"] * 150), delay=0.01, load_time=0.6, busy=True))
    probe = LatencyProbe()
    probe.start()
    load(w, qtbot, gguf_path)
    w.chat_pane.input.setPlainText("stress")
    with qtbot.waitSignal(w.chat.busy_changed, check_params_cb=lambda b: b is False, timeout=20000):
        w.chat_pane.submit()
    probe.timer.stop()
    assert len(probe.samples) > 50
    perf_figure("GUI event-loop p95 (fake engine)", probe.p95(), "ms", at_most=P95_LIMIT_MS)
