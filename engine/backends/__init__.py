"""Compute backends: which devices this machine has.

The seam between the engine and its backends (issue 15). What a device is and what it holds
(`DeviceInfo`, `DeviceMemory`, `gpu_placement`) is engine/backends/base.py, below every backend;
this package adds discovery on top of them. The CPU (numba) device is always present; an
OpenGL compute device is added when a GL 4.3 context can be made headlessly (engine/backends/gl/).
"""

from __future__ import annotations

from .base import CPU, DeviceInfo, DeviceLostError, DeviceMemory, gpu_placement

__all__ = [
    "CPU",
    "DeviceInfo",
    "DeviceLostError",
    "DeviceMemory",
    "cpu_device",
    "gpu_device_names",
    "gpu_placement",
    "list_devices",
]


def list_devices(refresh: bool = False) -> list[DeviceInfo]:
    """The CPU first, then every GPU device discovery finds (found once, then cached;
    `refresh` looks again). Never raises: a device that cannot be used is listed with
    available=False and the reason."""
    global _devices
    if _devices is None or refresh:
        _devices = [cpu_device(), *_gpu_devices()]
    return list(_devices)


_devices: list[DeviceInfo] | None = None


def cpu_device() -> DeviceInfo:
    """The CPU device alone (free memory as of now), without probing for GPUs: that loads
    their drivers, ~100 MB resident for Mesa's llvmpipe, whether or not a layer is offloaded."""
    import platform

    import psutil

    from ..version import cpu_target

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), model
            )
    except OSError:
        pass
    vm = psutil.virtual_memory()
    return DeviceInfo(
        CPU, "CPU", f"{model}, numba target {cpu_target()}", int(vm.total), int(vm.available)
    )


def _gpu_devices() -> list[DeviceInfo]:
    """GPU devices from the backends that exist (engine/backends/gl: OpenGL compute)."""
    from . import gl

    return [gl.probe()]


def gpu_device_names() -> list[str]:
    """Names of the GPU devices that can take layers (available ones)."""
    return [d.name for d in list_devices() if d.name != CPU and d.available]
