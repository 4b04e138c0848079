"""How a streaming reply crosses from the generation worker's thread to the GUI thread.

The worker appends every ReplyStep to a StepBuffer: a lock and a list, no Qt signal and no
event posted, so a token wakes nothing on the GUI side. The GUI thread drains the buffer once
per frame and shows everything that arrived as one update (merge_steps). FramePacer picks the
frame interval: FRAME_MS, stretched when the GUI thread's own work per frame (relayout and
markdown of a reply that grows with every frame) would take more than MAX_GUI_SHARE of a core.
On a machine whose cores all run the decode, every CPU millisecond the GUI thread uses is taken
from the decode, and the GIL it holds meanwhile delays the engine's thread between kernels.
"""

from __future__ import annotations

import threading
import time

from .dto import ReplyStep

# 20 updates a second: smooth to read, and on two cores every millisecond the GUI thread takes
# stalls both decode threads (measured, SmolLM2 128 tokens: 33 ms and 4 % gave 0.63 ms of GUI
# CPU a token and 79 tokens/s; 50 ms and 2 % give 0.44 ms and 82)
FRAME_MS = 50
MAX_FRAME_MS = 250  # a very long reply still grows four times a second
MAX_GUI_SHARE = 0.02  # of one core, for the GUI thread while a reply streams


class StepBuffer:
    """ReplySteps in arrival order; put() from any thread, drain() from the GUI thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: list[ReplyStep] = []

    def put(self, step: ReplyStep) -> None:
        with self._lock:
            self._steps.append(step)

    def drain(self) -> list[ReplyStep]:
        """Every step put since the last drain, oldest first."""
        with self._lock:
            steps, self._steps = self._steps, []
        return steps


def merge_steps(steps: list[ReplyStep]) -> tuple[str, ReplyStep | None]:
    """(the text of all `steps`, the last step): what one frame shows."""
    return "".join(s.text_delta for s in steps), (steps[-1] if steps else None)


class FramePacer:
    """The next frame's interval from the GUI thread's CPU use during the last one."""

    def __init__(
        self,
        frame_ms: float = FRAME_MS,
        max_frame_ms: float = MAX_FRAME_MS,
        max_share: float = MAX_GUI_SHARE,
    ) -> None:
        self.frame_ms, self.max_frame_ms, self.max_share = frame_ms, max_frame_ms, max_share
        self._cpu = time.thread_time()  # call start() and next_ms() on the GUI thread

    def start(self) -> int:
        self._cpu = time.thread_time()
        return int(self.frame_ms)

    def next_ms(self) -> int:
        """Milliseconds until the next frame: long enough that the CPU the GUI thread used
        since the last call (a frame's work and the relayout and paint it caused) stays within
        max_share of the interval."""
        cpu = time.thread_time()
        used_ms, self._cpu = (cpu - self._cpu) * 1000.0, cpu
        return self.interval_for(used_ms)

    def interval_for(self, used_ms: float) -> int:
        return int(min(max(used_ms / self.max_share, self.frame_ms), self.max_frame_ms))
