"""Wall-clock figures (not collected by pytest): python tests/bench_latency.py [PYTEST_ARGS ...]

Runs the tests marked `perf` and prints what each one measured beside the loose bound the
test holds it to: GUI event-loop p95 while a reply streams, `ggstation serve` start-up to
the first /health answer, /health while decoding, SIGINT/SIGTERM to exit, GGUF open time,
the 4-client server speed-up, and a whole SmolLM2 `generate -n 16` with its peak RSS.
Extra arguments go to pytest (`-k serve`, a test file). The starter models are fetched on
first use. Figures are of this machine at this moment: run it on a quiet machine and compare
runs, not machines.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class Figures:
    """pytest plugin: what `perf_figure` (tests/conftest.py) attached to each test's report."""

    def __init__(self):
        self.rows: list[tuple] = []

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call":
            self.rows += [
                (*value, report.outcome) for key, value in report.user_properties if key == "perf"
            ]


def main(argv: list[str]) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.chdir(ROOT)
    figures = Figures()
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-m", "perf", *argv], plugins=[figures])
    print(f"\n{'figure':<60} {'measured':>12}  bound")
    for name, value, unit, bound, outcome in figures.rows:
        note = "" if outcome == "passed" else f"  ({outcome})"
        print(f"{name:<60} {value:>9.3g} {unit:<2}  {bound} {unit}{note}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
