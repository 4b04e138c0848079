"""OpenGL renderer and version through PyOpenGL on a Qt offscreen context, or 'not available'."""

from __future__ import annotations

NOT_AVAILABLE = "not available"


def opengl_info() -> tuple[str, str]:
    """(renderer, version). Call on the GUI thread: Qt creates the context there."""
    try:
        from OpenGL import GL
        from PySide6.QtGui import QOffscreenSurface, QOpenGLContext

        ctx = QOpenGLContext()
        if not ctx.create():
            return NOT_AVAILABLE, NOT_AVAILABLE
        surface = QOffscreenSurface()
        surface.setFormat(ctx.format())
        surface.create()
        if not surface.isValid() or not ctx.makeCurrent(surface):
            return NOT_AVAILABLE, NOT_AVAILABLE
        try:
            renderer = GL.glGetString(GL.GL_RENDERER)
            version = GL.glGetString(GL.GL_VERSION)
        finally:
            ctx.doneCurrent()
        return (renderer.decode() if renderer else NOT_AVAILABLE,
                version.decode() if version else NOT_AVAILABLE)
    except Exception:  # no PyOpenGL, no GL driver, headless platform: all mean the same to the user
        return NOT_AVAILABLE, NOT_AVAILABLE
