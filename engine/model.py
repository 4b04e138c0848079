"""Model: a loaded GGUF (memory-mapped), its ModelConfig, weights (views) and tokenizer.

`load_model()` is the public entry point; it never copies or dequantises the weights.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .config import ModelConfig
from .gguf_file import GGUFFile, closing_on_error
from .gguf_split import open_gguf
from .jit import on_passing_thread, set_num_threads
from .models import Architecture, get_arch
from .models.base import ModelWeights, load_weights
from .quants import check_decode_path, default_decode_path
from .quants.base import QTensor

if TYPE_CHECKING:
    from .backends.gl.offload import GpuModel
    from .tokenizer.base import Tokenizer

ProgressFn = Callable[[float, str], None]


class Model:
    def __init__(
        self,
        gguf: GGUFFile,
        arch: Architecture,
        cfg: ModelConfig,
        weights: ModelWeights,
        decode_path: str = "x16",
    ):
        self.gguf = gguf
        self.arch = arch  # its config reader, layer loader and block (engine/models)
        self.cfg = cfg
        self.weights: ModelWeights | None = weights  # None once closed
        self.gpu: GpuModel | None = None  # the layers offloaded to a GPU (-ngl), if any
        self.path = gguf.path
        # the mat-vecs' formulation (quants.DECODE_PATHS) its contexts decode on unless their
        # parameters name another; its kernels are the ones loaded, and every path but "float"
        # makes the row-interleaved copies (QTensor.packed) as the decode first reads them
        self.decode_path = check_decode_path(decode_path)
        self._tokenizer: Tokenizer | None = None

    @property
    def tokenizer(self) -> Tokenizer:
        """The GGUF's tokenizer (load_model builds it: a bad vocabulary fails the load)."""
        if self._tokenizer is None:
            from .tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.gguf)
        return self._tokenizer

    @property
    def n_params(self) -> int:
        return sum(_n_elements(t.shape) for t in self.gguf.tensors.values())

    @property
    def weights_bytes(self) -> int:
        return self.gguf.tensor_data_bytes

    @property
    def repacked_bytes(self) -> int:
        """Bytes of the weights' row-interleaved copies the decode (default or int8 path) has made so far
        (QTensor.packed; llama.cpp's CPU_REPACK buffer)."""
        if self.weights is None:
            return 0
        w = self.weights
        tensors = {id(t): t for t in (w.token_embd, w.output) if isinstance(t, QTensor)}
        for layer in w.layers:
            tensors.update((id(t), t) for t in vars(layer).values() if isinstance(t, QTensor))
        return sum(t.packed_nbytes for t in tensors.values())

    @property
    def name(self) -> str:
        return self.cfg.name or os.path.basename(self.path)

    def close(self) -> None:
        if self.gpu is not None:
            self.gpu.close()
            self.gpu = None
        self.weights = None
        self.gguf.close()


def _n_elements(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def load_model(
    path: str | os.PathLike,
    n_threads: int | None = None,
    progress: ProgressFn | None = None,
    *,
    n_gpu_layers: int = 0,
    device: str | None = None,
    decode_path: str | None = None,
) -> Model:
    """Memory-map a GGUF, check it, bind its weights and build its tokenizer.

    Args:
        path: the .gguf file.
        n_threads: numba thread-pool size (None: all cores).
        progress: optional callback(fraction, message).
        n_gpu_layers: llama.cpp's -ngl: the last n_gpu_layers of the layers, the output head
            counting as the last one, go to a GPU device (backends.gpu_placement: 1 = the
            head alone, n_layer + 1 or more or a negative N = everything).
        device: the GPU device's name (engine.backends.list_devices), a comma list of names,
            or "none" (CPU only); None for the first GPU that is available.
        decode_path: the mat-vecs' formulation (quants.DECODE_PATHS: `--int8` "int8",
            `--no-int8` "float"); None: quants.default_decode_path() (the environment's, "x16").
    Raises:
        ValueError: a decode path that is not one of quants.DECODE_PATHS.
        GGUFError (MetadataError, MissingTensorError), UnsupportedArchError,
        UnsupportedQuantError, TokenizerError on bad or unsupported files. The file is unmapped
        before the error leaves, whatever raised (the progress callback included).
    """
    report = progress or (lambda frac, msg: None)
    path_ = check_decode_path(decode_path or default_decode_path())
    gpu = pick_gpu(device) if n_gpu_layers != 0 else None
    t0 = time.perf_counter()
    set_num_threads(n_threads or 0)
    report(0.0, f"mapping {os.path.basename(os.fspath(path))}")
    f = open_gguf(path)  # a split set (<name>-00001-of-0000N.gguf) opens as one file
    with closing_on_error(f):  # this frame keeps no view of the map: _build's frames are cleared
        model = _build(f, report, path_)
    if gpu is not None:
        report(0.9, f"offloading layers to {gpu}")
        from .backends import gl

        model.gpu = gl.offload_model(model, n_gpu_layers)
    report(1.0, f"loaded in {time.perf_counter() - t0:.2f} s")
    return model


def pick_gpu(device: str | None) -> str | None:
    """The GPU device -ngl offloads to: the first of `device` (a name or comma list, "none"
    for none) that is a GPU, or the first available GPU; None (logged) when there is none,
    as llama.cpp's CPU build answers -ngl: a warning, then the CPU.

    Raises:
        EngineError: a device name list_devices does not know.
    """
    from .backends import CPU, list_devices
    from .errors import EngineError

    log = logging.getLogger("ggstation.engine")
    if device is not None and device.strip().lower() == "none":
        return None
    known = {d.name: d for d in list_devices()}
    names = [n.strip() for n in (device or "").split(",") if n.strip()]
    for n in names:
        if n not in known:
            raise EngineError(
                f"unknown device '{n}' (available: {', '.join(known)}; see --list-devices)"
            )
    gpus = [n for n in (names or known) if n != CPU]
    for n in gpus:
        if known[n].available:
            return n
        log.warning("device %s is not available: %s", n, known[n].reason)
    log.warning("no usable GPU device: --n-gpu-layers ignored, every layer runs on the CPU")
    return None


def check_model(f: GGUFFile) -> tuple[Architecture, ModelConfig, ModelWeights, Tokenizer]:
    """Everything loading checks, without compiling anything: the architecture, the
    hyper-parameters, every tensor the architecture binds (type and shape) and the tokenizer.
    `ggstation info` (inspect_model) runs it too, so it accepts exactly what loads."""
    from .tokenizer import load_tokenizer

    arch = get_arch(f.arch)
    cfg = arch.config_from_gguf(f)
    weights = load_weights(f, cfg, arch.load_layer)
    f.get_str(
        "tokenizer.chat_template", None
    )  # a template of another type is an error, not ignored
    return arch, cfg, weights, load_tokenizer(f)


def _build(f: GGUFFile, report: ProgressFn, decode_path: str) -> Model:
    report(0.3, "checking the model and binding tensors")
    arch, cfg, weights, tokenizer = check_model(f)
    model = Model(f, arch, cfg, weights, decode_path)
    model._tokenizer = tokenizer
    report(0.8, "loading kernels")
    from .kernels_warmup import warmup

    on_passing_thread(warmup, model, lambda msg: report(0.8, msg))
    return model
