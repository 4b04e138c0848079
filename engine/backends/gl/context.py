"""The headless OpenGL context: EGL display and context, the GL entry points, and the one
thread every GL call runs on.

EGL first tries the device platform (EGL_EXT_device_enumeration + EGL_PLATFORM_DEVICE_EXT: a
GPU with no window system), then Mesa's surfaceless platform. The context is GL 4.3 core
(compute shaders, SSBOs), asking for robust access with lose-context-on-reset when EGL offers
it, so a GPU reset reports GL_CONTEXT_LOST instead of hanging.

Everything is ctypes over libEGL and libOpenGL (glvnd), entry points from eglGetProcAddress:
PyOpenGL fixes its platform (GLX or EGL) at its first import, and the Qt app may import it
first. A GL context is current on one thread only, so `GLContext` owns a worker thread and
`call(fn, *args)` runs fn there and returns its result (or raises its exception).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ...errors import EngineError
from ..base import DeviceLostError

T = TypeVar("T")

EGL_VENDOR, EGL_EXTENSIONS, EGL_OPENGL_API, EGL_NONE = 0x3053, 0x3055, 0x30A2, 0x3038
EGL_PLATFORM_SURFACELESS_MESA, EGL_PLATFORM_DEVICE_EXT = 0x31DD, 0x313F
EGL_CONTEXT_MAJOR_VERSION, EGL_CONTEXT_MINOR_VERSION = 0x3098, 0x30FB
EGL_CONTEXT_OPENGL_PROFILE_MASK, EGL_CONTEXT_OPENGL_CORE_PROFILE_BIT = 0x30FD, 0x1
EGL_CONTEXT_OPENGL_ROBUST_ACCESS, EGL_CONTEXT_OPENGL_RESET_NOTIFICATION_STRATEGY = 0x31B2, 0x31BD
EGL_LOSE_CONTEXT_ON_RESET = 0x31BF
EGL_RENDERABLE_TYPE, EGL_OPENGL_BIT, EGL_SURFACE_TYPE, EGL_PBUFFER_BIT = (
    0x3040,
    0x0008,
    0x3033,
    0x0001,
)
GL_VENDOR, GL_RENDERER, GL_VERSION, GL_EXTENSIONS = 0x1F00, 0x1F01, 0x1F02, 0x1F03
GL_MAJOR_VERSION, GL_MINOR_VERSION, GL_NUM_EXTENSIONS = 0x821B, 0x821C, 0x821D
GL_NO_ERROR, GL_OUT_OF_MEMORY, GL_CONTEXT_LOST = 0, 0x0505, 0x0507
# memory info extensions (KiB)
GL_GPU_MEMORY_INFO_TOTAL_AVAILABLE_MEMORY_NVX = 0x9048
GL_GPU_MEMORY_INFO_CURRENT_AVAILABLE_VIDMEM_NVX = 0x9049
GL_TEXTURE_FREE_MEMORY_ATI = 0x87FC
GL_MAX_SHADER_STORAGE_BLOCK_SIZE = 0x90DE

vp, u32, i32, f32 = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_float
sz, cp = ctypes.c_ssize_t, ctypes.c_char_p
# name -> (restype, argtypes): every GL entry point the backend calls
GL_FUNCS: dict[str, tuple[Any, list]] = {
    "glGetString": (cp, [u32]),
    "glGetStringi": (cp, [u32, u32]),
    "glGetIntegerv": (None, [u32, vp]),
    "glGetInteger64v": (None, [u32, vp]),
    "glGetError": (u32, []),
    "glFinish": (None, []),
    "glFlush": (None, []),
    "glGetGraphicsResetStatus": (u32, []),
    "glCreateShader": (u32, [u32]),
    "glShaderSource": (None, [u32, i32, vp, vp]),
    "glCompileShader": (None, [u32]),
    "glGetShaderiv": (None, [u32, u32, vp]),
    "glGetShaderInfoLog": (None, [u32, i32, vp, cp]),
    "glDeleteShader": (None, [u32]),
    "glCreateProgram": (u32, []),
    "glAttachShader": (None, [u32, u32]),
    "glLinkProgram": (None, [u32]),
    "glGetProgramiv": (None, [u32, u32, vp]),
    "glGetProgramInfoLog": (None, [u32, i32, vp, cp]),
    "glDeleteProgram": (None, [u32]),
    "glUseProgram": (None, [u32]),
    "glGetUniformLocation": (i32, [u32, cp]),
    "glUniform1iv": (None, [i32, i32, vp]),
    "glUniform1fv": (None, [i32, i32, vp]),
    "glGenBuffers": (None, [i32, vp]),
    "glDeleteBuffers": (None, [i32, vp]),
    "glBindBuffer": (None, [u32, u32]),
    "glBufferData": (None, [u32, sz, vp, u32]),
    "glBufferSubData": (None, [u32, sz, sz, vp]),
    "glGetBufferSubData": (None, [u32, sz, sz, vp]),
    "glBindBufferBase": (None, [u32, u32, u32]),
    "glCopyBufferSubData": (None, [u32, u32, sz, sz, sz]),
    "glDispatchCompute": (None, [u32, u32, u32]),
    "glMemoryBarrier": (None, [u32]),
}


class GLUnavailableError(EngineError):
    """No usable OpenGL 4.3 context: no EGL, no display, or too old a GL."""


class GLContextLostError(DeviceLostError):
    """The GL context was lost (GPU reset, driver crash): the GPU's buffers are gone."""


class GL:
    """The GL entry points as attributes (ctypes functions), loaded once per context."""

    def __init__(self, egl: ctypes.CDLL, lib: ctypes.CDLL | None):
        for name, (restype, argtypes) in GL_FUNCS.items():
            fn = _gl_symbol(egl, lib, name)
            if fn is None:
                if name == "glGetGraphicsResetStatus":  # GL 4.5 / KHR_robustness only
                    fn = _gl_symbol(egl, lib, "glGetGraphicsResetStatusARB")
                if fn is None:
                    if name == "glGetGraphicsResetStatus":
                        setattr(self, name, None)
                        continue
                    raise GLUnavailableError(f"OpenGL entry point {name} not found")
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name, fn)

    if TYPE_CHECKING:  # the entry points are set by name in __init__ (not a run-time hook)

        def __getattr__(self, name: str) -> Any: ...


def _gl_symbol(egl: ctypes.CDLL, lib: ctypes.CDLL | None, name: str) -> Any:
    if lib is not None:
        try:
            return getattr(lib, name)
        except AttributeError:
            pass
    address = egl.eglGetProcAddress(name.encode())
    if not address:
        return None
    return ctypes.CFUNCTYPE(None)(address)


def _load_egl() -> ctypes.CDLL:
    try:
        egl = ctypes.CDLL(ctypes.util.find_library("EGL") or "libEGL.so.1")
    except OSError as e:
        raise GLUnavailableError(f"no EGL library (libEGL): {e}") from None
    egl.eglGetProcAddress.restype, egl.eglGetProcAddress.argtypes = vp, [cp]
    egl.eglInitialize.argtypes = [vp, vp, vp]
    egl.eglBindAPI.argtypes = [u32]
    egl.eglCreateContext.restype, egl.eglCreateContext.argtypes = vp, [vp, vp, vp, vp]
    egl.eglMakeCurrent.argtypes = [vp, vp, vp, vp]
    egl.eglDestroyContext.argtypes = [vp, vp]
    egl.eglReleaseThread.argtypes = []
    egl.eglQueryString.restype, egl.eglQueryString.argtypes = cp, [vp, i32]
    egl.eglGetError.restype = i32
    egl.eglChooseConfig.argtypes = [vp, vp, vp, i32, vp]
    return egl


def _devices(egl: ctypes.CDLL) -> list[int]:
    """EGLDeviceEXTs from EGL_EXT_device_enumeration (empty when it is missing)."""
    address = egl.eglGetProcAddress(b"eglQueryDevicesEXT")
    if not address:
        return []
    query = ctypes.CFUNCTYPE(u32, i32, ctypes.POINTER(vp), ctypes.POINTER(i32))(address)
    devices, n = (vp * 8)(), i32()
    if not query(8, devices, ctypes.byref(n)):
        return []
    return [d for d in devices[: n.value] if d]


def _displays(egl: ctypes.CDLL) -> list[tuple[str, int]]:
    """(platform name, EGLDisplay) candidates: each device first, then Mesa surfaceless."""
    address = egl.eglGetProcAddress(b"eglGetPlatformDisplayEXT")
    if not address:
        raise GLUnavailableError("EGL has no eglGetPlatformDisplayEXT (EGL_EXT_platform_base)")
    get_display = ctypes.CFUNCTYPE(vp, u32, vp, vp)(address)
    out = []
    for dev in _devices(egl):
        dpy = get_display(EGL_PLATFORM_DEVICE_EXT, dev, None)
        if dpy:
            out.append(("device", dpy))
    dpy = get_display(EGL_PLATFORM_SURFACELESS_MESA, None, None)
    if dpy:
        out.append(("surfaceless", dpy))
    return out


def _attribs(robust: bool) -> ctypes.Array:
    a = [
        EGL_CONTEXT_MAJOR_VERSION,
        4,
        EGL_CONTEXT_MINOR_VERSION,
        3,
        EGL_CONTEXT_OPENGL_PROFILE_MASK,
        EGL_CONTEXT_OPENGL_CORE_PROFILE_BIT,
    ]
    if robust:
        a += [
            EGL_CONTEXT_OPENGL_ROBUST_ACCESS,
            1,
            EGL_CONTEXT_OPENGL_RESET_NOTIFICATION_STRATEGY,
            EGL_LOSE_CONTEXT_ON_RESET,
        ]
    return (i32 * (len(a) + 1))(*a, EGL_NONE)


def _any_config(egl: ctypes.CDLL, dpy: int) -> int | None:
    """An EGLConfig for desktop OpenGL (pbuffer-capable), or None."""
    attrs = (i32 * 5)(
        EGL_RENDERABLE_TYPE, EGL_OPENGL_BIT, EGL_SURFACE_TYPE, EGL_PBUFFER_BIT, EGL_NONE
    )
    configs, n = (vp * 1)(), i32()
    if not egl.eglChooseConfig(dpy, attrs, configs, 1, ctypes.byref(n)) or n.value < 1:
        return None
    return configs[0]


def _make_current(egl: ctypes.CDLL) -> tuple[int, int, str]:
    """(display, context, platform) of the first display that gives a current GL 4.3 core
    context on this thread (no surface: EGL_KHR_surfaceless_context)."""
    reasons = []
    for platform, dpy in _displays(egl):
        if not egl.eglInitialize(dpy, None, None):
            reasons.append(f"{platform}: eglInitialize failed (0x{egl.eglGetError():x})")
            continue
        if not egl.eglBindAPI(EGL_OPENGL_API):
            reasons.append(f"{platform}: no desktop OpenGL API")
            continue
        ctx = None
        # no config first (EGL_KHR_no_config_context), else any config that renders desktop GL
        for config in (None, _any_config(egl, dpy)):
            for robust in (True, False):
                ctx = egl.eglCreateContext(dpy, config, None, _attribs(robust))
                if ctx:
                    break
            if ctx:
                break
        if not ctx:
            reasons.append(f"{platform}: no OpenGL 4.3 core context (0x{egl.eglGetError():x})")
            continue
        if not egl.eglMakeCurrent(dpy, None, None, ctx):
            egl.eglDestroyContext(dpy, ctx)
            reasons.append(f"{platform}: eglMakeCurrent failed (0x{egl.eglGetError():x})")
            continue
        return dpy, ctx, platform
    raise GLUnavailableError("; ".join(reasons) or "EGL found no display")


class GLContext:
    """A GL 4.3 context current on its own thread; `call` runs work there.

    Raises (from the constructor): GLUnavailableError when no context can be made.
    """

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self.gl: GL
        self.renderer = self.version = self.platform = ""
        self.gl_version = (0, 0)
        self.extensions: frozenset[str] = frozenset()
        self.lost = False
        self.closed = False
        ready: queue.Queue = queue.Queue()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="ggstation-gl", daemon=True
        )
        self._thread.start()
        err = ready.get()
        if err is not None:
            raise err

    def _run(self, ready: queue.Queue) -> None:
        try:
            self._egl = _load_egl()
            self._dpy, self._ctx, self.platform = _make_current(self._egl)
            lib = None
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("OpenGL") or "libOpenGL.so.0")
            except OSError:
                pass
            self.gl = GL(self._egl, lib)
            self._describe()
        except Exception as e:  # noqa: BLE001 - handed to the constructor's caller
            ready.put(e if isinstance(e, EngineError) else GLUnavailableError(f"OpenGL: {e}"))
            return
        ready.put(None)
        while True:
            job = self._jobs.get()
            if job is None:
                break
            fn, args, box = job
            try:
                box.put((True, fn(*args)))
            except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
                box.put((False, e))
        self._egl.eglMakeCurrent(self._dpy, None, None, None)
        self._egl.eglDestroyContext(self._dpy, self._ctx)
        self._egl.eglReleaseThread()

    def _describe(self) -> None:
        gl = self.gl
        self.renderer = (gl.glGetString(GL_RENDERER) or b"?").decode()
        self.version = (gl.glGetString(GL_VERSION) or b"?").decode()
        major, minor = i32(), i32()
        gl.glGetIntegerv(GL_MAJOR_VERSION, ctypes.byref(major))
        gl.glGetIntegerv(GL_MINOR_VERSION, ctypes.byref(minor))
        self.gl_version = (major.value, minor.value)
        if self.gl_version < (4, 3):
            raise GLUnavailableError(
                f"{self.renderer}: OpenGL {self.version} is older than 4.3 (no compute shaders)"
            )
        n = i32()
        gl.glGetIntegerv(GL_NUM_EXTENSIONS, ctypes.byref(n))
        self.extensions = frozenset(
            (gl.glGetStringi(GL_EXTENSIONS, i) or b"").decode() for i in range(n.value)
        )
        gl.glGetError()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on the GL thread and return its result (its exception re-raised)."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        if self.closed:  # its thread is gone: a job queued now would wait forever
            raise GLContextLostError(f"the OpenGL context on {self.renderer} was closed")
        box: queue.Queue = queue.Queue(maxsize=1)
        self._jobs.put((fn, args, box))
        ok, value = box.get()
        if not ok:
            raise value
        return value

    def memory(self) -> tuple[int | None, int | None]:
        """(total, free) bytes as the driver reports them (NVX / ATI meminfo), else None."""
        return self.call(self._memory)

    def _memory(self) -> tuple[int | None, int | None]:
        gl = self.gl
        if "GL_NVX_gpu_memory_info" in self.extensions:
            total, free = i32(), i32()
            gl.glGetIntegerv(GL_GPU_MEMORY_INFO_TOTAL_AVAILABLE_MEMORY_NVX, ctypes.byref(total))
            gl.glGetIntegerv(GL_GPU_MEMORY_INFO_CURRENT_AVAILABLE_VIDMEM_NVX, ctypes.byref(free))
            return total.value * 1024, free.value * 1024
        if "GL_ATI_meminfo" in self.extensions:
            info = (i32 * 4)()
            gl.glGetIntegerv(GL_TEXTURE_FREE_MEMORY_ATI, info)
            return None, info[0] * 1024
        return None, None

    def check_lost(self) -> None:
        """Raise GLContextLostError once the context has been reset (on the GL thread)."""
        fn = self.gl.glGetGraphicsResetStatus
        if self.lost or (fn is not None and fn() != GL_NO_ERROR):
            self.lost = True
            raise GLContextLostError(f"the OpenGL context on {self.renderer} was lost (GPU reset)")

    @property
    def usable(self) -> bool:
        """Neither lost nor closed: its buffers still exist and calls still run."""
        return not (self.lost or self.closed)

    def close(self) -> None:
        """Destroy the context (every buffer with it) and end its thread."""
        if not self.closed:
            self.closed = True
            self._jobs.put(None)
            self._thread.join(timeout=5)


_shared: GLContext | None = None
_shared_error: GLUnavailableError | None = None
_lock = threading.Lock()


def shared_context() -> GLContext:
    """The process's one GL context (made on first use; a failure is remembered).

    Raises:
        GLUnavailableError: no usable OpenGL 4.3 context.
    """
    global _shared, _shared_error
    with _lock:
        if _shared is None or _shared.lost:
            if _shared_error is not None:
                raise _shared_error
            try:
                _shared = GLContext()
            except GLUnavailableError as e:
                _shared_error = e
                raise
        return _shared


def reset_shared_context() -> None:
    """Forget the shared context and any remembered failure (tests, --list-devices refresh)."""
    global _shared, _shared_error
    with _lock:
        if _shared is not None:
            _shared.close()
        _shared, _shared_error = None, None
