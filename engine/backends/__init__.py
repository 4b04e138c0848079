"""Compute backends: what a device is, what it holds, and which devices this machine has.

The seam between the engine and its backends (issue 15). `DeviceInfo` is what discovery
reports for one device (llama.cpp's `--list-devices` line); `DeviceMemory` is what one device
holds for a loaded model (weights, KV cache, compute scratch), real or estimated. The CPU
(numba) device is always present; an OpenGL compute device is added when a GL 4.3 context can
be made headlessly (engine/backends/gl/).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import EngineError

CPU = "CPU"  # the CPU device's name, as llama.cpp names it


class DeviceLostError(EngineError):
    """A GPU device stopped working mid-run (context lost, reset): its buffers are gone."""


@dataclass(frozen=True)
class DeviceInfo:
    name: str  # llama.cpp-style id: "CPU", "GL0"
    backend: str  # "CPU" or "OpenGL"
    description: str  # the CPU model, or the GL renderer and version
    total_bytes: int | None  # memory the driver reports (None: it does not say)
    free_bytes: int | None
    caps: tuple[str, ...] = ()  # what it can run: SIMD features, "GL 4.5", "compute", ...
    available: bool = True
    reason: str = ""  # why it is not available ("" when it is)


@dataclass(frozen=True)
class DeviceMemory:
    device: str  # DeviceInfo.name
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    n_layers: int  # repeating layers placed on this device

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes


def gpu_placement(n_layer: int, n_gpu_layers: int) -> tuple[int, bool]:
    """llama.cpp's placement for -ngl N (llama_model::load_tensors): the output head counts as
    layer n_layer, and the last N of layers 0..n_layer go to the GPU. Returns (the first
    repeating layer on the GPU, whether the output head is there): -ngl 1 moves the head
    alone, -ngl n_layer + 1 (or more, or a negative N: all) every layer and the head."""
    if n_gpu_layers == 0:
        return n_layer, False
    if n_gpu_layers < 0:
        return 0, True
    return max(n_layer + 1 - n_gpu_layers, 0), True


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
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), model)
    except OSError:
        pass
    vm = psutil.virtual_memory()
    return DeviceInfo(CPU, "CPU", f"{model}, numba target {cpu_target()}", int(vm.total), int(vm.available))


def _gpu_devices() -> list[DeviceInfo]:
    """GPU devices from the backends that exist (engine/backends/gl: OpenGL compute)."""
    from . import gl

    return [gl.probe()]


def gpu_device_names() -> list[str]:
    """Names of the GPU devices that can take layers (available ones)."""
    return [d.name for d in list_devices() if d.name != CPU and d.available]
