"""What a device is and what it holds: the words every backend and the memory accounting share.

`DeviceInfo` is what discovery reports for one device (llama.cpp's `--list-devices` line);
`DeviceMemory` is what one device holds for a loaded model (weights, KV cache, compute
scratch), real or estimated; `gpu_placement` is llama.cpp's -ngl rule. This module imports no
backend: the backends (engine/backends/gl/) and engine/memory.py sit on it, and the package's
discovery (engine/backends/__init__.py) sits on them.
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
