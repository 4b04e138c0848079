"""GLDevice: the shader programs and storage buffers of one GL context, with the bytes each
kind of buffer (weights, kv, compute) holds, and `dispatch`, which runs one shader.

Every method here runs on the context's GL thread (callers go through GLContext.call).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from ...errors import EngineError
from . import shaders
from .context import GL_CONTEXT_LOST, GL_OUT_OF_MEMORY, GLContext, GLContextLostError

NAME = "GL0"  # the one OpenGL device, named as llama.cpp names devices (backend + index)
GL_COMPUTE_SHADER, GL_COMPILE_STATUS, GL_LINK_STATUS, GL_INFO_LOG_LENGTH = (
    0x91B9,
    0x8B81,
    0x8B82,
    0x8B84,
)
GL_SHADER_STORAGE_BUFFER, GL_COPY_READ_BUFFER, GL_COPY_WRITE_BUFFER = 0x90D2, 0x8F36, 0x8F37
GL_STATIC_DRAW, GL_DYNAMIC_DRAW = 0x88E4, 0x88E8
GL_MAX_SHADER_STORAGE_BLOCK_SIZE = 0x90DE
SOFTWARE_RENDERERS = ("llvmpipe", "softpipe", "lavapipe", "SwiftShader")
MAX_GROUPS = 65535  # workgroups per dispatch dimension every GL 4.3 driver allows
GL_SHADER_STORAGE_BARRIER_BIT, GL_BUFFER_UPDATE_BARRIER_BIT = 0x2000, 0x200
KINDS = ("weights", "kv", "compute")


class GLOutOfMemoryError(EngineError):
    """The driver refused a buffer (GL_OUT_OF_MEMORY)."""


class GLShaderError(EngineError):
    """A shader failed to compile or link (a driver that does not take our GLSL)."""


@dataclass
class Buffer:
    """One SSBO: its GL name, size and what it holds."""

    id: int
    nbytes: int
    kind: str


class GLDevice:
    """Programs (compiled on first use) and buffers of one context; `bytes[kind]` counts the
    live buffers of each kind."""

    def __init__(self, ctx: GLContext):
        self.ctx = ctx
        self.gl = ctx.gl
        self._programs: dict[str, tuple[int, int, int]] = {}  # name -> (program, P loc, F loc)
        self.bytes = dict.fromkeys(KINDS, 0)
        self._ints = (ctypes.c_int * 16)()
        self._floats = (ctypes.c_float * 4)()
        size = ctypes.c_int64()
        self.gl.glGetInteger64v(GL_MAX_SHADER_STORAGE_BLOCK_SIZE, ctypes.byref(size))
        self.max_block_bytes = int(size.value)  # the most one shader may see of a buffer
        # a GPU wants neighbouring threads on neighbouring weights (matmulcoop); a software
        # rasteriser emulates each invocation's reads and runs an invocation per row faster
        self.cooperative = not ctx.renderer.startswith(SOFTWARE_RENDERERS)

    # buffers -------------------------------------------------------------------------------
    def alloc(self, nbytes: int, kind: str, data: np.ndarray | None = None) -> Buffer:
        """A buffer of nbytes (rounded up to whole uint words), filled from data or zeroed.

        Raises:
            GLOutOfMemoryError: the driver cannot hold it.
        """
        gl = self.gl
        size = max(4, -(-nbytes // 4) * 4)
        if size > self.max_block_bytes:
            raise GLOutOfMemoryError(
                f"{nbytes} bytes of {kind} exceed the {self.max_block_bytes} bytes a shader "
                f"storage block may have on {self.ctx.renderer}"
            )
        gl.glGetError()
        ids = (ctypes.c_uint * 1)()
        gl.glGenBuffers(1, ids)
        gl.glBindBuffer(GL_SHADER_STORAGE_BUFFER, ids[0])
        if data is not None and data.nbytes == size and data.flags.c_contiguous:
            gl.glBufferData(GL_SHADER_STORAGE_BUFFER, size, data.ctypes.data, GL_STATIC_DRAW)
        else:
            host = np.zeros(size, np.uint8)
            if data is not None:
                host[: data.nbytes] = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            gl.glBufferData(
                GL_SHADER_STORAGE_BUFFER,
                size,
                host.ctypes.data,
                GL_STATIC_DRAW if kind == "weights" else GL_DYNAMIC_DRAW,
            )
        err = gl.glGetError()
        if err != 0:
            gl.glDeleteBuffers(1, ids)
            if err == GL_CONTEXT_LOST:
                self.ctx.lost = True
                raise GLContextLostError(f"the OpenGL context on {self.ctx.renderer} was lost")
            what = "out of GPU memory" if err == GL_OUT_OF_MEMORY else f"GL error 0x{err:x}"
            raise GLOutOfMemoryError(
                f"cannot allocate {nbytes} bytes of {kind} on {self.ctx.renderer}: {what}"
            )
        self.bytes[kind] += size
        return Buffer(ids[0], size, kind)

    def free(self, buf: Buffer) -> None:
        if buf.id:
            ids = (ctypes.c_uint * 1)(buf.id)
            self.gl.glDeleteBuffers(1, ids)
            self.bytes[buf.kind] -= buf.nbytes
            buf.id = 0

    def upload(self, buf: Buffer, offset: int, data: np.ndarray) -> None:
        data = np.ascontiguousarray(data)
        self.gl.glBindBuffer(GL_SHADER_STORAGE_BUFFER, buf.id)
        self.gl.glBufferSubData(GL_SHADER_STORAGE_BUFFER, offset, data.nbytes, data.ctypes.data)

    def download(self, buf: Buffer, offset: int, out: np.ndarray) -> None:
        """Fill the C-contiguous out from buf's bytes at offset (waits for the shaders)."""
        self.gl.glMemoryBarrier(GL_BUFFER_UPDATE_BARRIER_BIT)
        self.gl.glBindBuffer(GL_SHADER_STORAGE_BUFFER, buf.id)
        self.gl.glGetBufferSubData(GL_SHADER_STORAGE_BUFFER, offset, out.nbytes, out.ctypes.data)

    def copy(self, src: Buffer, src_off: int, dst: Buffer, dst_off: int, nbytes: int) -> None:
        self.gl.glBindBuffer(GL_COPY_READ_BUFFER, src.id)
        self.gl.glBindBuffer(GL_COPY_WRITE_BUFFER, dst.id)
        self.gl.glCopyBufferSubData(
            GL_COPY_READ_BUFFER, GL_COPY_WRITE_BUFFER, src_off, dst_off, nbytes
        )

    # programs ------------------------------------------------------------------------------
    def program(self, name: str) -> tuple[int, int, int]:
        if name not in self._programs:
            self._programs[name] = self._compile(name)
        return self._programs[name]

    def _compile(self, name: str) -> tuple[int, int, int]:
        gl = self.gl
        src = shaders.source(name).encode()
        sh = gl.glCreateShader(GL_COMPUTE_SHADER)
        arr = (ctypes.c_char_p * 1)(src)
        gl.glShaderSource(sh, 1, arr, None)
        gl.glCompileShader(sh)
        if not self._status(gl.glGetShaderiv, sh, GL_COMPILE_STATUS):
            log = self._log(gl.glGetShaderiv, gl.glGetShaderInfoLog, sh)
            gl.glDeleteShader(sh)
            raise GLShaderError(f"shader {name} does not compile on {self.ctx.renderer}: {log}")
        prog = gl.glCreateProgram()
        gl.glAttachShader(prog, sh)
        gl.glLinkProgram(prog)
        gl.glDeleteShader(sh)
        if not self._status(gl.glGetProgramiv, prog, GL_LINK_STATUS):
            log = self._log(gl.glGetProgramiv, gl.glGetProgramInfoLog, prog)
            raise GLShaderError(f"shader {name} does not link on {self.ctx.renderer}: {log}")
        return prog, gl.glGetUniformLocation(prog, b"P"), gl.glGetUniformLocation(prog, b"F")

    @staticmethod
    def _status(getter, obj: int, what: int) -> bool:
        v = ctypes.c_int()
        getter(obj, what, ctypes.byref(v))
        return bool(v.value)

    @staticmethod
    def _log(getter, get_log, obj: int) -> str:
        n = ctypes.c_int()
        getter(obj, GL_INFO_LOG_LENGTH, ctypes.byref(n))
        buf = ctypes.create_string_buffer(max(1, n.value))
        get_log(obj, len(buf), None, buf)
        return buf.value.decode(errors="replace").strip()

    def dispatch(
        self,
        name: str,
        groups: tuple[int, ...],
        buffers: tuple[Buffer, ...],
        ints: tuple[int, ...] = (),
        floats: tuple[float, ...] = (),
    ) -> None:
        """Run shader `name` over groups (x, y[, z]) workgroups with buffers at bindings 0, 1, ..."""
        gl = self.gl
        prog, p_loc, f_loc = self.program(name)
        gl.glUseProgram(prog)
        if ints:
            for i, v in enumerate(ints):
                self._ints[i] = v
            gl.glUniform1iv(p_loc, 16, self._ints)
        if floats and f_loc >= 0:
            for i, f in enumerate(floats):
                self._floats[i] = f
            gl.glUniform1fv(f_loc, 4, self._floats)
        for i, b in enumerate(buffers):
            gl.glBindBufferBase(GL_SHADER_STORAGE_BUFFER, i, b.id)
        z = groups[2] if len(groups) > 2 else 1
        gl.glDispatchCompute(max(1, groups[0]), max(1, groups[1]), max(1, z))
        gl.glMemoryBarrier(GL_SHADER_STORAGE_BARRIER_BIT)


def n_groups(n: int, local: int = shaders.DEFAULT_LOCAL) -> int:
    return -(-n // local)


def groups_1d(n: int, local: int = shaders.DEFAULT_LOCAL) -> tuple[int, int]:
    """(x, y) workgroups covering n invocations of a 1-D shader (shaders.gid() flattens them):
    past MAX_GROUPS the rest goes to the second dimension."""
    g = n_groups(n, local)
    return (g, 1) if g <= MAX_GROUPS else (MAX_GROUPS, -(-g // MAX_GROUPS))
