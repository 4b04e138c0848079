"""The OpenGL 4.3 compute backend: one device, "GL0", the headless EGL context of
context.py, running the offloaded layers of offload.py with the shaders of shaders.py.

`probe()` describes the device for list_devices (never raises); `offload_model(model, n)` puts a
loaded model's last n layers on it, or returns None with the reason logged (the model then
runs on the CPU).
"""

from __future__ import annotations

import logging

from ..base import DeviceInfo
from .context import GLContext, GLContextLostError, GLUnavailableError, shared_context
from .device import NAME, SOFTWARE_RENDERERS, GLDevice, GLOutOfMemoryError, GLShaderError

log = logging.getLogger("ggstation.engine")

BACKEND = "OpenGL"
_device: GLDevice | None = None


def probe() -> DeviceInfo:
    """GL0 as list_devices reports it: available with the renderer, GL version and memory,
    or unavailable with the reason (no EGL, no GL 4.3, ...)."""
    try:
        ctx = shared_context()
        total, free = ctx.memory()
    except GLUnavailableError as e:
        return DeviceInfo(NAME, BACKEND, "not available", None, None, (), False, str(e))
    if total is None and ctx.renderer.startswith(SOFTWARE_RENDERERS):
        import psutil  # a software rasteriser's buffers are ordinary RAM

        vm = psutil.virtual_memory()
        total, free = int(vm.total), int(vm.available)
    caps = (f"GL {ctx.gl_version[0]}.{ctx.gl_version[1]}", "compute", f"EGL {ctx.platform}")
    return DeviceInfo(NAME, BACKEND, f"{ctx.renderer} ({ctx.version})", total, free, caps)


def device() -> GLDevice:
    """The shared context's GLDevice (programs, buffers). Raises GLUnavailableError."""
    global _device
    ctx = shared_context()
    if _device is None or _device.ctx is not ctx:
        _device = ctx.call(GLDevice, ctx)
    return _device


def _compile_all(dev: GLDevice) -> None:
    from .shaders import MATMUL_TYPES, OPS, matmul_names

    for name in (*OPS, *(n for q in MATMUL_TYPES for n in matmul_names(q))):
        dev.program(name)


def offload_model(model, n_gpu_layers: int):
    """A GpuModel with model's last n_gpu_layers layers (and the head when n > n_layer) on
    GL0, or None when the model cannot offload (the reason is logged; it runs on the CPU)."""
    from .offload import GpuModel, unsupported_reason

    reason = unsupported_reason(model)
    if reason:
        log.warning("OpenGL: %s; every layer runs on the CPU", reason)
        return None
    try:
        dev = device()
        dev.ctx.call(_compile_all, dev)  # a driver that rejects a shader fails the offload here
        gm = GpuModel(dev.ctx, dev, model, n_gpu_layers)
    except (GLUnavailableError, GLOutOfMemoryError, GLContextLostError, GLShaderError) as e:
        log.warning("OpenGL: %s; every layer runs on the CPU", e)
        return None
    if gm.n_layers == 0 and not gm.head:  # -ngl 1 and the head could not go
        gm.close()
        log.warning("OpenGL: nothing to offload; every layer runs on the CPU")
        return None
    log.info(
        "OpenGL: %d of %d layers%s on %s (%.1f MiB of weights)",
        gm.n_layers,
        model.cfg.n_layer,
        " and the output head" if gm.head else "",
        dev.ctx.renderer,
        gm.weights_bytes / 2**20,
    )
    return gm


__all__ = [
    "BACKEND",
    "NAME",
    "GLContext",
    "GLContextLostError",
    "GLOutOfMemoryError",
    "GLUnavailableError",
    "device",
    "offload_model",
    "probe",
]
