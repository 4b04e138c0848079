"""OpenGL renderer and version: through a Qt offscreen context, else through EGL without any
window system (Mesa's surfaceless platform, or the first EGL device), else 'not available'.

On a headless Linux machine Qt's offscreen platform has no GL integration, yet Mesa's EGL can
still make a context (llvmpipe at least), which is what the OpenGL compute backend would use.
"""

from __future__ import annotations

import ctypes
import ctypes.util

NOT_AVAILABLE = "not available"

EGL_VENDOR, EGL_OPENGL_API = 0x3053, 0x30A2
EGL_PLATFORM_SURFACELESS_MESA, EGL_PLATFORM_DEVICE_EXT = 0x31DD, 0x313F
GL_RENDERER, GL_VERSION = 0x1F01, 0x1F02


def opengl_info() -> tuple[str, str]:
    """(renderer, version). Call on the GUI thread: Qt creates the context there."""
    return _qt_info() or _egl_info() or (NOT_AVAILABLE, NOT_AVAILABLE)


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
    except Exception:  # no PyOpenGL, no GL driver, headless platform: try EGL
        return None


def _egl_info() -> tuple[str, str] | None:
    """A context with no surface (EGL_KHR_surfaceless_context, EGL_KHR_no_config_context) on a
    display that needs no window system; ctypes only, so PyOpenGL's platform choice (GLX or
    EGL, fixed at its first import) does not matter."""
    try:
        egl = ctypes.CDLL(ctypes.util.find_library("EGL") or "libEGL.so.1")
        gl = ctypes.CDLL(ctypes.util.find_library("OpenGL") or "libOpenGL.so.0")
    except OSError:
        return None
    vp = ctypes.c_void_p
    egl.eglGetProcAddress.restype, egl.eglGetProcAddress.argtypes = vp, [ctypes.c_char_p]
    egl.eglInitialize.argtypes = [vp, vp, vp]
    egl.eglBindAPI.argtypes = [ctypes.c_uint]
    egl.eglCreateContext.restype, egl.eglCreateContext.argtypes = vp, [vp, vp, vp, vp]
    egl.eglMakeCurrent.argtypes = [vp, vp, vp, vp]
    egl.eglDestroyContext.argtypes = [vp, vp]
    egl.eglTerminate.argtypes = [vp]
    egl.eglQueryString.restype, egl.eglQueryString.argtypes = ctypes.c_char_p, [vp, ctypes.c_int]
    gl.glGetString.restype, gl.glGetString.argtypes = ctypes.c_char_p, [ctypes.c_uint]
    address = egl.eglGetProcAddress(b"eglGetPlatformDisplayEXT")
    if not address:
        return None
    get_display = ctypes.CFUNCTYPE(vp, ctypes.c_uint, vp, vp)(address)
    for platform, native in ((EGL_PLATFORM_SURFACELESS_MESA, None), (EGL_PLATFORM_DEVICE_EXT, _first_device(egl))):
        if platform == EGL_PLATFORM_DEVICE_EXT and native is None:
            continue
        dpy = get_display(platform, native, None)
        if not dpy:
            continue
        # the display is one per process: leave it up if someone (a GL backend) initialised it
        ours = not egl.eglQueryString(dpy, EGL_VENDOR)
        if not egl.eglInitialize(dpy, None, None):
            continue
        try:
            if not egl.eglBindAPI(EGL_OPENGL_API):
                continue
            ctx = egl.eglCreateContext(dpy, None, None, None)
            if not ctx:
                continue
            try:
                if not egl.eglMakeCurrent(dpy, None, None, ctx):
                    continue
                renderer, version = gl.glGetString(GL_RENDERER), gl.glGetString(GL_VERSION)
                egl.eglMakeCurrent(dpy, None, None, None)
            finally:
                egl.eglDestroyContext(dpy, ctx)
            if renderer and version:
                return f"{renderer.decode()} (EGL)", version.decode()
        finally:
            if ours:
                egl.eglTerminate(dpy)
    return None


def _first_device(egl) -> int | None:
    """The first EGLDeviceEXT (EGL_EXT_device_enumeration), or None."""
    address = egl.eglGetProcAddress(b"eglQueryDevicesEXT")
    if not address:
        return None
    query = ctypes.CFUNCTYPE(ctypes.c_uint, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                             ctypes.POINTER(ctypes.c_int))(address)
    devices, n = (ctypes.c_void_p * 4)(), ctypes.c_int()
    if not query(4, devices, ctypes.byref(n)) or n.value < 1:
        return None
    return devices[0]
