"""A streaming reply reaches the chat view once per frame: nothing lost, duplicated or reordered,
however fast the worker produces; at most one model update per frame; relayout only on growth."""

from __future__ import annotations

import threading

from app.dto import ReplyStep
from app.stream_buffer import FramePacer, StepBuffer, merge_steps

from .conftest import load, send
from .fake_engine import FakeEngine


def test_step_buffer_drains_in_order_while_a_thread_puts():
    buffer, n = StepBuffer(), 20_000
    drained: list[ReplyStep] = []

    def produce() -> None:
        for i in range(n):
            buffer.put(ReplyStep(f"{i},", None, 3, i + 1))

    producer = threading.Thread(target=produce)
    producer.start()
    while producer.is_alive():  # the consumer drains while the producer is still putting
        drained += buffer.drain()
    producer.join()
    drained += buffer.drain()
    assert [s.n_generated for s in drained] == list(range(1, n + 1))
    text, last = merge_steps(drained)
    assert text == "".join(f"{i}," for i in range(n)) and last is drained[-1]
    assert buffer.drain() == [] and merge_steps([]) == ("", None)


def test_frame_pacer_keeps_the_gui_share_and_its_bounds():
    pacer = FramePacer(frame_ms=33, max_frame_ms=250, max_share=0.04)
    assert pacer.interval_for(0.0) == 33  # cheap frames: the normal rate
    assert pacer.interval_for(2.0) == 50  # 2 ms of GUI work a frame: 4 % of 50 ms
    assert pacer.interval_for(100.0) == 250  # never slower than four frames a second


def _count_updates(w):
    """Streaming-row model updates and relayout requests, counted during one reply."""
    counts = {"updates": 0, "relayouts": 0, "frames": 0}
    w.chat.chat_model.dataChanged.connect(
        lambda *_: counts.__setitem__("updates", counts["updates"] + 1)
    )
    w.chat_pane.delegate.sizeHintChanged.connect(
        lambda *_: counts.__setitem__("relayouts", counts["relayouts"] + 1)
    )
    on_frame = w.chat._on_frame

    def counted_frame() -> None:
        counts["frames"] += 1
        on_frame()

    w.chat._frame.timeout.disconnect()
    w.chat._frame.timeout.connect(counted_frame)
    return counts


def test_fast_stream_is_shown_once_per_frame_and_completely(make_window, qtbot, gguf_path):
    words = [f"w{i}" for i in range(400)]
    w = make_window(FakeEngine(reply=" ".join(words), delay=0.0005))  # ~2000 tokens/s
    load(w, qtbot, gguf_path)
    counts = _count_updates(w)
    steps: list[ReplyStep] = []
    w.chat.step_received.connect(steps.append)
    send(w, qtbot, "go")
    reply = w.chat.chat_model.message(1)
    assert reply.content == " ".join(words)  # the concatenated stream, nothing lost or doubled
    assert reply.stats["n_generated"] == len(words) and steps[-1].n_generated == len(words)
    assert [s.n_generated for s in steps] == sorted({s.n_generated for s in steps})
    # one text update per frame plus the final flush and finish_streaming, never one per token
    assert counts["updates"] <= counts["frames"] + 2 < len(words) // 4
    assert w.ctx.store.messages(w.chat.conversation_id)[1].content == reply.content


def test_streaming_relayouts_only_when_the_reply_grows_a_line(make_window, qtbot, gguf_path):
    w = make_window(FakeEngine(reply=" ".join(["ab"] * 200), delay=0.004))
    load(w, qtbot, gguf_path)
    w.chat._pacer = FramePacer(max_share=1.0)  # every frame at FRAME_MS, however slow the machine
    counts = _count_updates(w)
    send(w, qtbot, "go")
    # ~25 frames of a few words each; a line holds dozens of words, so most need no relayout
    assert counts["updates"] > 10
    assert 0 < counts["relayouts"] < counts["updates"] // 2
    # and the view knows the reply's final height (the scroll range follows it)
    view, index = w.chat_pane.view, w.chat.chat_model.index(1)
    assert (
        w.chat_pane._heights[1]
        == w.chat_pane._row_height(index)
        == view.visualRect(index).height()
        > 100
    )


class _RecordingPacer(FramePacer):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def start(self) -> int:
        self.calls.append("start")
        return super().start()

    def next_ms(self) -> int:
        self.calls.append("next")
        return super().next_ms()


def test_the_frame_after_the_first_text_comes_at_the_base_interval(make_window, qtbot, gguf_path):
    # the first frame with text also sends the message and opens the reply's bubble: paced by
    # that, the second frame came a quarter second later (a short reply showed one token, then
    # all of it); it restarts the clock, and the frames after it are paced by their own work
    w = make_window(FakeEngine(reply=" ".join(["ab"] * 200), delay=0.004))
    load(w, qtbot, gguf_path)
    w.chat._pacer = pacer = _RecordingPacer()
    shown: list[int] = []
    w.chat.step_received.connect(lambda _step: shown.append(len(pacer.calls)))
    send(w, qtbot, "go")
    assert len(shown) >= 3
    first = shown[0]  # the pacer's calls before the first frame with text made its own
    assert pacer.calls[first] == "start"
    assert pacer.calls[shown[1]] == "next"
