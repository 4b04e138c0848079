"""The GUI thread stays responsive while the engine works: event-loop latency p95.

A wall-clock guard, marked `perf` (deselected by default): run `pytest -m perf`, or
`python tests/bench_latency.py` for the figures."""

from __future__ import annotations

import pytest

from app.bench_gui import LagProbe, percentile

from .conftest import load
from .fake_engine import FakeEngine

TICK_MS = 10
# p95 lateness of a 10 ms timer tick; the GUI's target is under 50 ms. Measured 6.8-7.8 ms
# with the fake engine on the 2-core development machine with other test runs beside it
# (load average 3). The bound is 7x that: a busy machine delays every timer of every
# process, while the regression it is for (engine work on the GUI thread) costs whole
# decode steps per tick.
P95_LIMIT_MS = 50.0


def latency_probe() -> LagProbe:
    """The app's event-loop lag probe (app/bench_gui.py) on a 10 ms timer, recording."""
    return LagProbe(TICK_MS, recording=True)


def p95(probe: LagProbe) -> float:
    return percentile(probe.gaps_ms, 0.95)


@pytest.mark.perf
def test_event_loop_latency_while_loading_and_generating(
    make_window, qtbot, gguf_path, perf_figure
):
    w = make_window(FakeEngine(reply=" ".join(["tok"] * 150), delay=0.01, load_time=0.6, busy=True))
    probe = latency_probe()
    probe.start()
    load(w, qtbot, gguf_path)
    w.chat_pane.input.setPlainText("stress")
    with qtbot.waitSignal(w.chat.busy_changed, check_params_cb=lambda b: b is False, timeout=20000):
        w.chat_pane.submit()
    probe.timer.stop()
    assert len(probe.gaps_ms) > 50
    perf_figure("GUI event-loop p95 (fake engine)", p95(probe), "ms", at_most=P95_LIMIT_MS)
