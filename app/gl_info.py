"""OpenGL renderer and version: through a Qt offscreen context, else what the engine's OpenGL
device reports, else 'not available'.

On a headless Linux machine Qt's offscreen platform has no GL integration, yet Mesa's EGL can
still make a context (llvmpipe at least): the engine's GL backend (engine.backends) opens that
context itself, and its device description is what the panel then shows, so that the app never
opens EGL beside the engine.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from .dto import DeviceDesc

NOT_AVAILABLE = "not available"


def opengl_info(devices: Sequence[DeviceDesc] = ()) -> tuple[str, str]:
    """(renderer, version) for the engine's `devices` (engine.backends.list_devices). Call on
    the GUI thread: Qt creates its context there, once."""
    return _qt_info() or _device_info(devices) or (NOT_AVAILABLE, NOT_AVAILABLE)


def _device_info(devices: Sequence[DeviceDesc]) -> tuple[str, str] | None:
    """The first available OpenGL device: its description holds the renderer and GL version,
    its caps the "GL x.y" and "EGL <platform>" it was made with."""
    gl = next((d for d in devices if d.backend == "OpenGL" and d.available), None)
    if gl is None:
        return None
    version = next((c for c in gl.caps if c.startswith("GL ")), "")
    platform = next((c for c in gl.caps if c.startswith("EGL ")), "EGL")
    return f"{gl.description} ({platform}, the engine's context)", version or NOT_AVAILABLE


@functools.cache
def _qt_info() -> tuple[str, str] | None:
    try:
        from OpenGL import GL
        from PySide6.QtGui import QOffscreenSurface, QOpenGLContext

        ctx = QOpenGLContext()
        if not ctx.create():
            return None
        surface = QOffscreenSurface()
        surface.setFormat(ctx.format())
        surface.create()
        if not surface.isValid() or not ctx.makeCurrent(surface):
            return None
        try:
            renderer = GL.glGetString(GL.GL_RENDERER)
            version = GL.glGetString(GL.GL_VERSION)
        finally:
            ctx.doneCurrent()
        if not renderer or not version:
            return None
        return renderer.decode(), version.decode()
    except Exception:  # no PyOpenGL, no GL driver, headless platform: the engine's device
        return None
