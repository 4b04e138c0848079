"""Decode speed as the person sees it: the real main window, offscreen, chatting with a model.

    python -m app.bench_gui --model PATH [-p N_PROMPT] [-n N_GEN] [-r REPS] [-t THREADS] [--json]

The model is opened and loaded through the Models tab's own path (picker, load panel, load
worker) and each repetition is a message sent from the chat input through ChatController, so
every hop between the engine and the chat view is on the clock. Timing is llama-bench's tg:
from the moment the first generated token's text reaches the chat view's item model to the
last frame that shows more of the reply, over the tokens shown in between (the prompt is
excluded; RepResult.tokens_per_s).
Every reply is exactly N tokens (greedy, end-of-generation tokens banned). A 16 ms timer on
the GUI thread measures how late the event loop turns while the reply streams.

With --json, stdout is exactly one JSON line (`ggstation bench --path gui` parses it):
    {"path": "gui", "model": ..., "n_gen": ..., "threads": ..., "samples_ts": [...],
     "avg_ts": ..., "event_loop_p95_ms": ..., "event_loop_max_ms": ..., ...}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .dto import ReplyStep
    from .main_window import MainWindow

# the event-loop probe's interval: a display frame. A stall that matters (tens of ms) delays the
# next tick whatever the interval; a 5 ms probe woke the GUI thread 200 times a second, which on
# two cores cost the decode ~0.05 ms of CPU a token (a quarter of the GUI thread's)
PROBE_MS = 16
TIMEOUT_S = 600.0


@dataclass
class RepResult:
    """One reply: when each batch of its tokens reached the chat view, and the probe's gaps."""

    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (perf_counter s, n_generated)
    n_streamed: int = 0  # arrivals shown by the chat's frames; the rest, the end's flush
    gaps_ms: list[float] = field(default_factory=list)  # event-loop lateness while streaming
    n_generated: int = 0  # the engine's final count
    n_prompt: int = 0

    def tokens_per_s(self) -> float:
        """Tokens after the first batch shown, over the time from that batch to the last one
        a frame showed. Frames show what the engine handed over by then, up to a wake-up
        interval behind the decode (engine.tasks.WAKE_INTERVAL_S; the chat asks for its frame
        interval), and so at both ends alike; the end's flush comes at once, which would count
        the first frame's lag as speed. With fewer than two frames, the flush ends the span."""
        timed = self.arrivals[: self.n_streamed] if self.n_streamed >= 2 else self.arrivals
        (t0, n0), (t1, n1) = timed[0], timed[-1]
        if t1 <= t0 or n1 <= n0:
            raise RuntimeError(
                f"too few UI updates to time ({len(self.arrivals)}); use a larger -n"
            )
        return (n1 - n0) / (t1 - t0)


class LagProbe:
    """A timer of interval_ms on the GUI thread: how late each tick comes is the event loop's
    lag. Ticks are kept in gaps_ms while `recording`."""

    def __init__(self, interval_ms: int = PROBE_MS, recording: bool = False) -> None:
        from PySide6.QtCore import Qt, QTimer

        self.interval_ms = interval_ms
        self.gaps_ms: list[float] = []
        self.recording = recording
        self._last = time.perf_counter()
        self.timer = QTimer(interval=interval_ms, timerType=Qt.TimerType.PreciseTimer)
        self.timer.timeout.connect(self._tick)

    def _tick(self) -> None:
        now = time.perf_counter()
        if self.recording:
            self.gaps_ms.append(max((now - self._last) * 1000.0 - self.interval_ms, 0.0))
        self._last = now

    def start(self) -> None:
        self._last = time.perf_counter()
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()


class ThreadClock:
    """CPU seconds each thread of this process used between start() and stop(), grouped as the
    GUI thread, the engine's scheduler thread, the app's other Python threads (workers,
    pollers) and native threads (numba's team, Qt's own). On a machine with as many compute
    threads as cores, every CPU second outside the engine is taken from the decode."""

    def __init__(self) -> None:
        self._t0: dict[int, float] = {}
        self._total0 = 0.0
        self.used: dict[str, float] = {}

    @staticmethod
    def _total() -> float:
        t = os.times()
        return t.user + t.system

    @staticmethod
    def _times() -> dict[int, float]:
        import psutil

        return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}

    def start(self) -> None:
        self._t0, self._total0 = self._times(), self._total()

    def stop(self) -> None:
        import threading

        names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
        used = {"gui": 0.0, "engine": 0.0, "app_threads": 0.0, "native": 0.0}
        main = threading.main_thread().native_id
        for tid, cpu in self._times().items():
            name = names.get(tid)
            group = (
                "gui"
                if tid == main
                else "engine"
                if name == "ggstation-scheduler"
                else "native"
                if name is None
                else "app_threads"
            )
            used[group] += cpu - self._t0.get(tid, 0.0)
        # threads that ended meanwhile (each reply's worker) are in the process's total only
        used["app_threads"] += max(self._total() - self._total0 - sum(used.values()), 0.0)
        self.used = used


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(int(q * (len(s) - 1) + 0.5), len(s) - 1)] if s else 0.0


def wait_until(cond, timeout_s: float = TIMEOUT_S, what: str = "") -> None:
    """Run the event loop until cond() holds (checked every 50 ms); raise after timeout_s."""
    from PySide6.QtCore import QEventLoop, QTimer

    if cond():
        return
    end = time.monotonic() + timeout_s
    loop = QEventLoop()
    check = QTimer(interval=50)
    check.timeout.connect(lambda: loop.quit() if cond() or time.monotonic() > end else None)
    check.start()
    loop.exec()
    check.stop()
    if not cond():
        raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what or cond}")


def build_window(data_dir: str) -> MainWindow:
    from PySide6.QtWidgets import QApplication

    from .engine_adapter import EngineAdapter
    from .main import build_context
    from .main_window import MainWindow

    QApplication.instance() or QApplication([sys.argv[0]])
    window = MainWindow(build_context(data_dir, EngineAdapter()))
    window.resize(1280, 800)
    window.show()
    return window


def load_model(window: MainWindow, path: str, n_ctx: int, n_threads: int) -> None:
    """Open and load `path` the way a person does on the Models tab."""
    from .dto import LoadParams

    picker = window.picker
    picker.open_path(path)
    wait_until(
        lambda: picker.load_panel.info is not None and picker.load_panel.info.path == path,
        60,
        "the model's metadata",
    )
    info = picker.load_panel.info
    assert info is not None
    if info.error:
        raise RuntimeError(f"{path}: {info.error}")
    picker.load_panel.set_params(LoadParams(n_ctx=n_ctx, n_threads=n_threads))
    picker.load_panel.start_load()
    error = picker.load_panel.error
    wait_until(
        lambda: window.ctx.session is not None or bool(error.text()), TIMEOUT_S, "the model to load"
    )
    if window.ctx.session is None:
        raise RuntimeError(error.text().replace("\n\n", " "))


def prompt_text(window: MainWindow, n_prompt: int) -> str:
    """A user message whose whole chat prompt (template and system prompt included) has at
    least n_prompt tokens."""
    session = window.ctx.session
    assert session is not None
    system = window.ctx.settings.system_prompt.strip()
    head = [{"role": "system", "content": system}] if system else []

    def count(text: str) -> int:
        return session.count_tokens([*head, {"role": "user", "content": text}])

    words = ["Tell me about the sea."]
    while count(" ".join(words)) < n_prompt:
        words += ["again"] * max(1, (n_prompt - count(" ".join(words))) // 2)
    return " ".join(words)


def run_reply(window: MainWindow, text: str, probe: LagProbe) -> RepResult:
    """Send `text` from the chat input and time the reply's arrival in the chat view."""
    chat, rep = window.chat, RepResult()

    def on_step(step: ReplyStep) -> None:
        reply = chat.chat_model.streaming_message()
        if step.n_generated > 0 and reply is not None and reply.content:
            if not rep.arrivals:
                probe.recording = True
            rep.arrivals.append((time.perf_counter(), step.n_generated))
            rep.n_streamed += step.finish_reason is None

    chat.new_conversation()
    chat.step_received.connect(on_step)
    probe.gaps_ms, probe.recording = [], False
    window.chat_pane.input.setPlainText(text)
    window.chat_pane.submit()
    try:
        wait_until(lambda: not chat.busy(), TIMEOUT_S, "the reply")
    finally:
        chat.step_received.disconnect(on_step)
    probe.recording = False
    rows = chat.chat_model.rowCount()
    stats = chat.chat_model.message(rows - 1).stats or {}
    if stats.get("finish_reason") not in ("length", "stop"):
        raise RuntimeError(f"the reply ended with {stats.get('finish_reason')!r}")
    rep.gaps_ms, rep.n_generated, rep.n_prompt = (
        probe.gaps_ms,
        stats["n_generated"],
        stats["n_prompt"],
    )
    # the last UI update must carry the engine's final count: nothing was lost on the way
    if not rep.arrivals or rep.arrivals[-1][1] != rep.n_generated:
        raise RuntimeError(f"the chat view got {rep.arrivals[-1:]} of {rep.n_generated} tokens")
    return rep


def bench(model: str, n_prompt: int, n_gen: int, reps: int, n_threads: int) -> dict:
    from .dto import SamplingSettings

    with tempfile.TemporaryDirectory(prefix="ggstation-bench-gui-") as data_dir:
        window = build_window(data_dir)
        try:
            load_model(window, model, n_ctx=max(1024, n_prompt + n_gen + 256), n_threads=n_threads)
            session = window.ctx.session
            assert session is not None
            window.ctx.settings.sampling = SamplingSettings(
                temperature=0.0,
                top_k=1,
                top_p=1.0,
                min_p=0.0,
                repeat_penalty=1.0,
                seed=0,
                max_tokens=n_gen,
                ignore_eos=True,
            )
            text = prompt_text(window, n_prompt)
            probe = LagProbe()
            probe.start()
            warm = SamplingSettings(
                **{**window.ctx.settings.sampling.as_dict(), "max_tokens": min(n_gen, 16)}
            )
            saved, window.ctx.settings.sampling = window.ctx.settings.sampling, warm
            run_reply(window, text, probe)  # warm-up, as llama-bench does
            window.ctx.settings.sampling = saved
            clock = ThreadClock()
            clock.start()
            results = [run_reply(window, text, probe) for _ in range(reps)]
            clock.stop()
            probe.stop()
            threads = session.n_threads
        finally:
            window.close()
    samples = [r.tokens_per_s() for r in results]
    gaps = [g for r in results for g in r.gaps_ms]
    return {
        "path": "gui",
        "model": model,
        "n_prompt": results[0].n_prompt,
        "n_gen": n_gen,
        "threads": threads,
        "samples_ts": samples,
        "avg_ts": statistics.fmean(samples),
        "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0,
        "event_loop_p50_ms": percentile(gaps, 0.50),
        "event_loop_p95_ms": percentile(gaps, 0.95),
        "event_loop_max_ms": max(gaps, default=0.0),
        # CPU ms per generated token, by thread group: where the decode's cores went
        "cpu_ms_per_token": {
            k: round(1000.0 * v / (n_gen * reps), 3) for k, v in clock.used.items()
        },
    }


def _table(r: dict) -> str:
    return "\n".join(
        [
            "| model | path | threads | test | t/s | event loop p50 / p95 / max |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
            f"| {Path(r['model']).name} | gui | {r['threads']} | tg{r['n_gen']} | "
            f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} | {r['event_loop_p50_ms']:.1f} / "
            f"{r['event_loop_p95_ms']:.1f} / {r['event_loop_max_ms']:.1f} ms |",
            "",
            "CPU ms per token: "
            + ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_ms_per_token"].items()),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.bench_gui", description=__doc__.split("\n")[0])
    p.add_argument("-m", "--model", required=True, help="GGUF model path")
    p.add_argument(
        "-p",
        "--n-prompt",
        type=int,
        default=32,
        help="at least this many prompt tokens, chat template included (default: 32)",
    )
    p.add_argument(
        "-n", "--n-gen", type=int, default=128, help="generated tokens per reply (default: 128)"
    )
    p.add_argument("-r", "--repetitions", type=int, default=5, help="timed replies (default: 5)")
    p.add_argument(
        "-t", "--threads", type=int, default=0, help="engine threads (default: all cores)"
    )
    p.add_argument("--json", action="store_true", help="one JSON line on stdout")
    args = p.parse_args(argv)
    if args.n_gen < 2 or args.repetitions < 1 or args.n_prompt < 0 or args.threads < 0:
        p.error("need -n >= 2, -r >= 1, -p >= 0, -t >= 0")
    if not Path(args.model).is_file():
        p.error(f"no such model file: {args.model}")
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        result = bench(
            str(Path(args.model).resolve()),
            args.n_prompt,
            args.n_gen,
            args.repetitions,
            args.threads,
        )
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result) if args.json else _table(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
