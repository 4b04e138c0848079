"""WorkerPool: a worker's signals reach receivers connected after start(), and a pool shut
down before its workers launched starts none."""

from __future__ import annotations

import time

from app.workers import CallWorker, WorkerPool


def _boom() -> None:
    raise RuntimeError("failed at once")


def test_a_worker_that_fails_at_once_reaches_a_receiver_connected_after_start(qtbot):
    pool = WorkerPool()
    got: list[str] = []
    worker = pool.start(CallWorker(_boom))
    time.sleep(0.05)  # the caller's own work before it connects: the worker must not run yet
    worker.failed.connect(got.append)
    qtbot.waitUntil(lambda: bool(got), timeout=3000)
    assert "failed at once" in got[0]
    qtbot.waitUntil(lambda: not pool.busy(), timeout=3000)


def test_shutdown_before_launch_runs_nothing(qtbot):
    pool = WorkerPool()
    ran: list[int] = []
    pool.start(CallWorker(lambda: ran.append(1)))
    pool.shutdown()
    qtbot.wait(100)
    assert ran == [] and not pool.busy()
