"""Shared by the OpenGL tests: a GL device or a skip, and single shader runs on host arrays."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.gl.device import GLDevice


def gl_device() -> GLDevice:
    """The shared GL device, or skip the test with the reason no context could be made."""
    from engine.backends import gl

    try:
        return gl.device()
    except gl.GLUnavailableError as e:
        pytest.skip(f"no OpenGL 4.3 context: {e}")


def run_on_scratch(
    dev: GLDevice, arrays: list[np.ndarray], fn, extra: tuple = ()
) -> list[np.ndarray]:
    """Put float32 arrays one after another in a scratch buffer, call fn(scratch, offsets,
    *extra) on the GL thread, and return the arrays as they are afterwards."""
    offs, at = [], 0
    for a in arrays:
        offs.append(at)
        at += a.size

    def go():
        sc = dev.alloc(4 * at, "compute")
        try:
            for a, o in zip(arrays, offs, strict=True):
                dev.upload(sc, 4 * o, np.ascontiguousarray(a, np.float32))
            fn(sc, offs, *extra)
            out = [np.empty(a.shape, np.float32) for a in arrays]
            for a, o in zip(out, offs, strict=True):
                dev.download(sc, 4 * o, a)
            return out
        finally:
            dev.free(sc)

    return dev.ctx.call(go)
