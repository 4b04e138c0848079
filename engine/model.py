"""Model: a loaded GGUF (memory-mapped), its ModelConfig, weights (views) and tokenizer.

`load_model()` is the public entry point; it never copies or dequantises the weights.
"""

from __future__ import annotations

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

if TYPE_CHECKING:
    from .tokenizer.base import Tokenizer

ProgressFn = Callable[[float, str], None]


class Model:
    def __init__(self, gguf: GGUFFile, arch: Architecture, cfg: ModelConfig, weights: ModelWeights):
        self.gguf = gguf
        self.arch = arch  # its config reader, layer loader and block (engine/models)
        self.cfg = cfg
        self.weights: ModelWeights | None = weights  # None once closed
        self.path = gguf.path
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
    def name(self) -> str:
        return self.cfg.name or os.path.basename(self.path)

    def close(self) -> None:
        self.weights = None
        self.gguf.close()


def _n_elements(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def load_model(path: str | os.PathLike, n_threads: int | None = None,
               progress: ProgressFn | None = None, *, n_gpu_layers: int = 0,
               device: str | None = None) -> Model:
    """Memory-map a GGUF, check it, bind its weights and build its tokenizer.

    Args:
        path: the .gguf file.
        n_threads: numba thread-pool size (None: all cores).
        progress: optional callback(fraction, message).
        n_gpu_layers: repeating layers to offload to a GPU device, the last ones first as in
            llama.cpp's -ngl (more than the model has: the output head too).
        device: the GPU device's name (engine.backends.list_devices), None for the first.
    Raises:
        GGUFError (MetadataError, MissingTensorError), UnsupportedArchError,
        UnsupportedQuantError, TokenizerError on bad or unsupported files. The file is unmapped
        before the error leaves, whatever raised (the progress callback included).
    """
    report = progress or (lambda frac, msg: None)
    if n_gpu_layers > 0:
        # the seam for issue 15's OpenGL backend; until a GPU backend exists llama.cpp's CPU
        # build answers -ngl the same way: a warning, then the CPU
        import logging

        logging.getLogger(__name__).warning(
            "no GPU backend: --n-gpu-layers %d ignored, every layer runs on the CPU", n_gpu_layers)
    t0 = time.perf_counter()
    set_num_threads(n_threads or 0)
    report(0.0, f"mapping {os.path.basename(os.fspath(path))}")
    f = open_gguf(path)  # a split set (<name>-00001-of-0000N.gguf) opens as one file
    with closing_on_error(f):  # this frame keeps no view of the map: _build's frames are cleared
        model = _build(f, report)
    report(1.0, f"loaded in {time.perf_counter() - t0:.2f} s")
    return model


def check_model(f: GGUFFile) -> tuple[Architecture, ModelConfig, ModelWeights, Tokenizer]:
    """Everything loading checks, without compiling anything: the architecture, the
    hyper-parameters, every tensor the architecture binds (type and shape) and the tokenizer.
    `ggstation info` (inspect_model) runs it too, so it accepts exactly what loads."""
    from .tokenizer import load_tokenizer

    arch = get_arch(f.arch)
    cfg = arch.config_from_gguf(f)
    weights = load_weights(f, cfg, arch.load_layer)
    f.get_str("tokenizer.chat_template", None)  # a template of another type is an error, not ignored
    return arch, cfg, weights, load_tokenizer(f)


def _build(f: GGUFFile, report: ProgressFn) -> Model:
    report(0.3, "checking the model and binding tensors")
    arch, cfg, weights, tokenizer = check_model(f)
    model = Model(f, arch, cfg, weights)
    model._tokenizer = tokenizer
    report(0.8, "loading kernels")
    from .kernels_warmup import warmup

    on_passing_thread(warmup, model, lambda msg: report(0.8, msg))
    return model
