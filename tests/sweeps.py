"""Parameter sweeps whose long tail runs in the slow group.

The default run (`pytest -q`, under 10 minutes on 2 cores from a cold numba cache) keeps a few
representative cases of each sweep; `pytest -m slow`, which CI also runs, covers the rest. Most
of a sweep's time is numba compiling the kernels or the step modules of one more type or
architecture, so each case left out of the default run saves its own compile.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

import pytest


def sweep(
    values: Iterable[Any], fast: Collection[Any], ids: Callable[[Any], str] | None = None
) -> list:
    """pytest.param for each value (a tuple spreads over several argnames), marked slow unless
    it is in fast. Fails at collection if fast names a value the sweep does not have."""
    values = list(values)
    unknown = [f for f in fast if f not in values]
    if unknown:
        raise ValueError(f"fast cases {unknown} are not in the sweep")
    params = []
    for v in values:
        args = v if isinstance(v, tuple) else (v,)
        marks = () if v in fast else (pytest.mark.slow,)
        params.append(pytest.param(*args, marks=marks, id=ids(v) if ids else None))
    return params
