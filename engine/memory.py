"""MemoryReport: what a loaded context really holds, and the same formulas as an estimate.

Weights are the mapped tensor bytes (resident bytes from the OS where it tells: mincore is not
available from Python, so we read the mapping's Rss from /proc/self/smaps on Linux). KV cache
and compute buffers are the nbytes of the arrays the context allocated.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import psutil

from .backends.base import CPU, DeviceInfo, DeviceMemory, gpu_placement
from .buffers import compute_buffer_bytes
from .config import ModelConfig
from .kv_cache import kv_bytes

if TYPE_CHECKING:
    from .backends.gl.offload import GpuContext
    from .kv_cache import KVCache
    from .model import Model


class MeasuredContext(Protocol):
    """What memory_report reads of a context (engine/context.py's Context, which calls it):
    a Protocol, so memory accounting stays below the context that allocates."""

    @property
    def model(self) -> Model: ...
    @property
    def kv(self) -> KVCache: ...
    @property
    def buf(self) -> SizedBuffers: ...
    @property
    def gpu(self) -> GpuContext | None: ...


class SizedBuffers(Protocol):
    """context.Buffers, as far as memory_report reads it."""

    @property
    def nbytes(self) -> int: ...


@dataclass(frozen=True)
class MemoryReport:
    weights_bytes: int  # mapped tensor data
    weights_resident_bytes: int | None  # of the mapping, resident in RAM (None: OS did not say)
    kv_bytes: int  # allocated
    kv_used_bytes: int  # holding live positions
    kv_per_seq_used: list[int] = field(default_factory=list)
    kv_seq_capacity_bytes: int = 0  # the most one sequence may hold (unified: the whole pool)
    compute_bytes: int = 0
    metadata_bytes: int = 0
    rss_bytes: int | None = None
    estimate: bool = False
    # per device: the CPU's share, and a GPU's when layers are offloaded (-ngl); the top-level
    # byte counts above are the totals over all devices
    devices: tuple[DeviceMemory, ...] = ()
    # of the weights, those held as row-interleaved copies in RAM (QTensor.packed: the default
    # and int8 decode paths make them on first use, 0 on the float path), whose mapped pages
    # are let go: they replace the mapped bytes in RAM rather than add to them
    repacked_bytes: int = 0
    # the multimodal projector (--mmproj), on the CPU: its mapped weights and the largest
    # activation set of one image tile's encode (engine/vision)
    projector_weights_bytes: int = 0
    projector_compute_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes
            + self.kv_bytes
            + self.compute_bytes
            + self.metadata_bytes
            + self.projector_weights_bytes
            + self.projector_compute_bytes
        )

    def with_projector(self, weights_bytes: int, compute_bytes: int) -> MemoryReport:
        """This report with a multimodal projector's two rows filled in."""
        return replace(
            self, projector_weights_bytes=weights_bytes, projector_compute_bytes=compute_bytes
        )

    @property
    def host_bytes(self) -> int:
        """What stays in RAM: the total less every GPU device's share (the total on the CPU alone)."""
        return self.total_bytes - sum(d.total_bytes for d in self.devices if d.device != CPU)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["total_bytes"] = self.total_bytes
        return d


def _metadata_bytes(n_tensors: int) -> int:
    return 512 * n_tensors  # descriptors: name, shape, dtype, view object (measured ~0.5 KB)


def resident_bytes(maps: Sequence[np.ndarray]) -> int | None:
    """Bytes of `maps` (arrays over whole file mappings, GGUFFile.maps()) present in this
    process's page tables, which is what smaps calls their Rss; None where the OS does not say
    (no Linux /proc/self/pagemap).

    pagemap holds 8 bytes a page of the ranges asked for, so the kernel walks only these
    mappings; smaps walks every mapping of the process: in the desktop app (Qt, LLVM, the GL
    driver) that cost its once-a-second dashboard poll 3-12 ms of CPU, taken from the decode
    on a machine whose cores all decode.
    """
    page = mmap.PAGESIZE
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY)
    except OSError:
        return None
    total = 0
    try:
        for m in maps:
            if m.nbytes == 0:
                continue
            first = m.ctypes.data // page
            end = (m.ctypes.data + m.nbytes - 1) // page + 1
            for lo in range(first, end, _PAGEMAP_CHUNK):
                n = min(_PAGEMAP_CHUNK, end - lo)
                entries = np.frombuffer(os.pread(fd, 8 * n, 8 * lo), np.uint64)
                if entries.size != n:  # (a range the kernel would not report)
                    return None
                total += int(np.count_nonzero(entries >> np.uint64(63))) * page  # bit 63: present
    except OSError:
        return None
    finally:
        os.close(fd)
    return total


_PAGEMAP_CHUNK = 1 << 17  # pages per read: 1 MiB of entries, 512 MiB of mapping


def memory_report(ctx: MeasuredContext) -> MemoryReport:
    kv = ctx.kv
    model = ctx.model
    devices = _devices(ctx)
    return MemoryReport(
        weights_bytes=sum(d.weights_bytes for d in devices),
        weights_resident_bytes=resident_bytes(model.gguf.maps()),
        kv_bytes=sum(d.kv_bytes for d in devices),
        kv_used_bytes=kv.used_bytes(),
        kv_per_seq_used=[kv.used_bytes(s) for s in range(kv.n_seq_max)],
        kv_seq_capacity_bytes=kv.n_ctx_seq * kv.bytes_per_pos,
        compute_bytes=sum(d.compute_bytes for d in devices),
        metadata_bytes=_metadata_bytes(len(model.gguf.tensors)),
        rss_bytes=psutil.Process().memory_info().rss,
        devices=devices,
        repacked_bytes=model.repacked_bytes,
    )


def _devices(ctx: MeasuredContext) -> tuple[DeviceMemory, ...]:
    """The CPU's share, and the GPU's when this context runs layers there: weights moved to
    the GPU leave the CPU's mapped total (as llama.cpp's CPU_Mapped buffer shrinks)."""
    model, kv, gpu = ctx.model, ctx.kv, ctx.gpu
    if gpu is None:
        return (
            DeviceMemory(CPU, model.weights_bytes, kv.nbytes, ctx.buf.nbytes, model.cfg.n_layer),
        )
    gm = gpu.gm
    cpu = DeviceMemory(
        CPU,
        model.weights_bytes - gm.host_bytes,
        kv.host_nbytes,
        ctx.buf.nbytes,
        model.cfg.n_layer - gm.n_layers,
    )
    return cpu, DeviceMemory(
        gpu.device_name, gm.weights_bytes, gpu.nbytes, gpu.scratch_bytes, gm.n_layers
    )


def ctx_per_seq(n_ctx: int, n_seq_max: int, kv_unified: bool) -> int:
    """Positions each sequence may use. A unified cache is one pool of n_ctx cells that any
    one sequence may fill, as llama.cpp's is; a split cache gives each n_ctx / n_seq_max."""
    return max(1, n_ctx if kv_unified else n_ctx // max(1, n_seq_max))


def kv_streams(n_seq_max: int, kv_unified: bool) -> int:
    """Streams of n_ctx_seq cells the cache allocates: one pool, or one per sequence."""
    return 1 if kv_unified else n_seq_max


def estimate_memory(
    cfg: ModelConfig,
    weights_bytes: int,
    n_tensors: int,
    n_ctx: int = 4096,
    n_seq_max: int = 1,
    type_k: str = "f16",
    type_v: str = "f16",
    n_ubatch: int = 512,
    n_batch: int = 2048,
    kv_unified: bool = False,
    *,
    n_gpu_layers: int = 0,
    gpu_device: str = "GL0",
    layer_weights_bytes: Sequence[int] | None = None,
    output_weights_bytes: int = 0,
    output_tied_bytes: int = 0,
    repacked_bytes: int = 0,
) -> MemoryReport:
    """What Context(model, ContextParams(...)) will allocate, before loading anything.

    Args:
        n_gpu_layers: -ngl: the last n_gpu_layers of the layers, the output head counting as
            the last one, go to `gpu_device` (backends.gpu_placement, llama.cpp's rule).
        layer_weights_bytes: tensor bytes of each repeating layer (blk.N.*), needed when
            n_gpu_layers > 0 (ModelInfo.estimate passes them).
        output_weights_bytes: the output head's bytes (output_norm and output, or the tied
            token embedding standing in for output).
        output_tied_bytes: of those, the tied token embedding's, which the CPU keeps as well
            for the input lookup (0 when the file has its own output.weight).
        repacked_bytes: the decode's interleaved copies (ModelInfo.repackable_bytes; 0 on the float path).
    Returns:
        the totals over all devices, and `devices` with each one's share.
    """
    n_ctx = n_ctx or cfg.n_ctx_train
    n_ctx_seq = ctx_per_seq(n_ctx, n_seq_max, kv_unified)
    n_ubatch = min(n_ubatch, n_batch)
    kv_total = kv_bytes(cfg, n_ctx_seq, kv_streams(n_seq_max, kv_unified), type_k, type_v)
    compute = compute_buffer_bytes(cfg, n_ubatch, n_ctx_seq)
    devices = split_devices(
        cfg,
        weights_bytes,
        kv_total,
        compute,
        n_gpu_layers,
        gpu_device,
        layer_weights_bytes,
        output_weights_bytes,
        output_tied_bytes,
    )
    return MemoryReport(
        weights_bytes=sum(d.weights_bytes for d in devices),
        weights_resident_bytes=None,
        kv_bytes=kv_total,
        kv_used_bytes=0,
        kv_per_seq_used=[0] * n_seq_max,
        kv_seq_capacity_bytes=kv_bytes(cfg, n_ctx_seq, 1, type_k, type_v),
        compute_bytes=sum(d.compute_bytes for d in devices),
        metadata_bytes=_metadata_bytes(n_tensors),
        rss_bytes=None,
        estimate=True,
        devices=devices,
        repacked_bytes=repacked_bytes,
    )


def split_devices(
    cfg: ModelConfig,
    weights_bytes: int,
    kv_total: int,
    compute: int,
    n_gpu_layers: int,
    gpu_device: str,
    layer_weights_bytes: Sequence[int] | None,
    output_weights_bytes: int,
    output_tied_bytes: int,
) -> tuple[DeviceMemory, ...]:
    """Each device's share under llama.cpp's placement (backends.gpu_placement): the GPU gets
    the last repeating layers with their weights and KV cache, the output head from -ngl 1 on,
    and one compute scratch of the CPU's size; the CPU keeps the rest (token embedding,
    earlier layers) and its own compute buffer.
    """
    if n_gpu_layers == 0:
        return (DeviceMemory(CPU, weights_bytes, kv_total, compute, cfg.n_layer),)
    if layer_weights_bytes is None or len(layer_weights_bytes) != cfg.n_layer:
        got = "none" if layer_weights_bytes is None else len(layer_weights_bytes)
        raise ValueError(
            f"splitting {cfg.n_layer} layers across devices needs each layer's weight "
            f"bytes (got {got})"
        )
    first, head = gpu_placement(cfg.n_layer, n_gpu_layers)
    n_gpu = cfg.n_layer - first
    gpu_weights = sum(layer_weights_bytes[cfg.n_layer - n_gpu :]) + (
        output_weights_bytes if head else 0
    )
    # the cache gives every layer the same (n_stream, n_cells, n_head_kv, head_dim) arrays,
    # sliding-window layers included (kv_cache.KVCache), so a layer's share is exact
    gpu_kv = kv_total // cfg.n_layer * n_gpu
    cpu_weights = weights_bytes - gpu_weights + (output_tied_bytes if head else 0)
    return (
        DeviceMemory(CPU, cpu_weights, kv_total - gpu_kv, compute, cfg.n_layer - n_gpu),
        DeviceMemory(gpu_device, gpu_weights, gpu_kv, compute, n_gpu),
    )


# --- will it fit? ------------------------------------------------------------------------------
# Checked before a context allocates anything (Context.__init__), and shown by `ggstation info`.
# The KV cache and compute buffers are anonymous memory: numpy's zeros are only committed as
# the cache fills, so an oversized context would start fine and be killed mid-conversation.
# The weights are mapped from the file; they count too, as they must stay resident to run at
# speed, but the kernel can drop and re-read them, so only the total is compared.
NO_MEM_CHECK_ENV = "GGSTATION_NO_MEM_CHECK"
REFUSE_FACTOR = (
    1.1  # refuse above 110 % of available RAM + free swap: the estimate is close, not exact
)
WARN_FACTOR = 0.8  # warn above 80 % of available RAM: it will swap or page the weights in and out


@dataclass(frozen=True)
class MemoryFit:
    """An estimate against the memory available: `verdict` is "fits", "tight" or "too big"."""

    needed_bytes: int  # weights + KV cache + compute buffers + metadata
    available_bytes: int  # RAM the OS can hand out without swapping (MemAvailable)
    swap_free_bytes: int

    @property
    def verdict(self) -> str:
        if self.needed_bytes > REFUSE_FACTOR * (self.available_bytes + self.swap_free_bytes):
            return "too big"
        return "tight" if self.needed_bytes > WARN_FACTOR * self.available_bytes else "fits"

    def summary(self) -> str:
        """e.g. "needs 1.2 GiB, 21.3 GiB available (+ 0 B free swap): fits"."""
        return (
            f"needs {fmt_bytes(self.needed_bytes)}, {fmt_bytes(self.available_bytes)} available "
            f"(+ {fmt_bytes(self.swap_free_bytes)} free swap): {self.verdict}"
        )


def fmt_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def available_memory() -> tuple[int, int]:
    """(available RAM, free swap) in bytes, from psutil (MemAvailable on Linux)."""
    return int(psutil.virtual_memory().available), int(psutil.swap_memory().free)


def memory_fit(est: MemoryReport, available: tuple[int, int] | None = None) -> MemoryFit:
    """The estimate's RAM share (every device but the GPUs') against available RAM and swap."""
    ram, swap = available if available is not None else available_memory()
    return MemoryFit(est.host_bytes, ram, swap)


# A GPU has no swap to spill into: a share above its free memory fails at allocation, and the
# driver's own use (other contexts, the desktop) moves by a few percent between query and load.
VRAM_WARN_FACTOR = 0.9


@dataclass(frozen=True)
class DeviceFit:
    """A GPU device's share of an estimate against its memory: `verdict` is "fits", "tight",
    "too big", or "unknown" when the driver reports no memory size at all."""

    device: str
    needed_bytes: int  # weights + KV cache + compute scratch placed on the device
    free_bytes: int | None  # what the driver says is free (None: it does not say)
    total_bytes: int | None

    @property
    def capacity_bytes(self) -> int | None:
        """Free memory, else the total when the driver reports only that."""
        return self.free_bytes if self.free_bytes is not None else self.total_bytes

    @property
    def verdict(self) -> str:
        cap = self.capacity_bytes
        if cap is None:
            return "unknown"
        if self.needed_bytes > cap:
            return "too big"
        return "tight" if self.needed_bytes > VRAM_WARN_FACTOR * cap else "fits"

    def summary(self) -> str:
        """e.g. "GL0 needs 310.2 MiB, 7.6 GiB free: fits"."""
        if self.free_bytes is not None:
            room = f"{fmt_bytes(self.free_bytes)} free"
        elif self.total_bytes is not None:
            room = f"{fmt_bytes(self.total_bytes)} total (free not reported)"
        else:
            room = "memory size not reported"
        return f"{self.device} needs {fmt_bytes(self.needed_bytes)}, {room}: {self.verdict}"


def device_fits(est: MemoryReport, devices: Sequence[DeviceInfo]) -> list[DeviceFit]:
    """One DeviceFit for each GPU device holding a share of `est` (none on the CPU alone). A
    device the estimate names but `devices` lacks is checked against unknown memory."""
    known = {d.name: d for d in devices}
    fits = []
    for share in est.devices:
        if share.device == CPU:
            continue
        info = known.get(share.device)
        fits.append(
            DeviceFit(
                share.device,
                share.total_bytes,
                info.free_bytes if info else None,
                info.total_bytes if info else None,
            )
        )
    return fits


def mem_check_disabled() -> bool:
    return os.environ.get(NO_MEM_CHECK_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def largest_fitting_ctx(
    cfg: ModelConfig, weights_bytes: int, n_tensors: int, limit_bytes: float, **kw: Any
) -> int:
    """The largest n_ctx (a multiple of 256, at least 0) whose estimate stays under limit_bytes,
    all else in `kw` (estimate_memory's keywords) as given."""

    def total(n_ctx: int) -> int:
        return estimate_memory(cfg, weights_bytes, n_tensors, n_ctx=n_ctx, **kw).host_bytes

    lo, hi = 0, 256
    while hi <= 1 << 31 and total(hi) <= limit_bytes:
        lo, hi = hi, hi * 2
    while hi - lo > 256:
        mid = (lo + hi) // 2 // 256 * 256
        lo, hi = (mid, hi) if total(mid) <= limit_bytes else (lo, mid)
    return lo


def check_fits(
    est: MemoryReport,
    cfg: ModelConfig,
    n_tensors: int,
    what: str,
    log: logging.Logger | None = None,
    available: tuple[int, int] | None = None,
    **kw: Any,
) -> MemoryFit:
    """Refuse (InsufficientMemoryError) a context whose estimate is clearly more than the memory
    available; log a warning when it is close. `what` names the request ("n_ctx 4096, 1
    sequence"); `kw` are the estimate's keywords, to say which context size would fit."""
    from .errors import InsufficientMemoryError

    fit = memory_fit(est, available)
    if fit.verdict == "too big":
        limit = fit.available_bytes + fit.swap_free_bytes
        # the file's weights: an offloaded tied output counts twice in the devices' sum
        tied = (
            kw.get("output_tied_bytes", 0)
            if gpu_placement(cfg.n_layer, kw.get("n_gpu_layers", 0))[1]
            else 0
        )
        n_fit = largest_fitting_ctx(
            cfg, est.weights_bytes - tied, n_tensors, WARN_FACTOR * fit.available_bytes, **kw
        )
        advice = (
            f"lower the context size (-c {n_fit} or less would fit)"
            if n_fit >= 256
            else "the weights alone leave too little room: free memory or use a smaller model"
        )
        host = next((d for d in est.devices if d.device == CPU), None)
        w, kv, compute = (
            (host.weights_bytes, host.kv_bytes, host.compute_bytes)
            if host
            else (est.weights_bytes, est.kv_bytes, est.compute_bytes)
        )
        raise InsufficientMemoryError(
            f"not enough memory for {what}: it needs {fmt_bytes(fit.needed_bytes)} (weights "
            f"{fmt_bytes(w)}, KV cache {fmt_bytes(kv)}, compute buffers "
            f"{fmt_bytes(compute)}) but {fmt_bytes(fit.available_bytes)} of RAM and "
            f"{fmt_bytes(fit.swap_free_bytes)} of swap are free; {advice}, or set "
            f"{NO_MEM_CHECK_ENV}=1 (--no-mem-check) to try anyway",
            fit.needed_bytes,
            limit,
        )
    if fit.verdict == "tight" and log is not None:
        log.warning(
            "%s needs %s of the %s of RAM available: expect swapping; a smaller context (-c) "
            "would leave room",
            what,
            fmt_bytes(fit.needed_bytes),
            fmt_bytes(fit.available_bytes),
        )
    return fit
