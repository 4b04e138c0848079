"""Model: a loaded GGUF (memory-mapped), its ModelConfig, weights (views) and tokenizer.

`load_model()` is the public entry point; it never copies or dequantises the weights.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .config import ModelConfig
from .gguf_file import GGUFFile
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
        """The GGUF's tokenizer, built on first use (vocabularies can be large)."""
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
               progress: ProgressFn | None = None) -> Model:
    """Memory-map a GGUF and bind its weights.

    Args:
        path: the .gguf file.
        n_threads: numba thread-pool size (None: all cores).
        progress: optional callback(fraction, message).
    Raises:
        GGUFError, UnsupportedArchError, UnsupportedQuantError on bad or unsupported files.
    """
    report = progress or (lambda frac, msg: None)
    t0 = time.perf_counter()
    set_num_threads(n_threads or 0)
    report(0.0, f"mapping {os.path.basename(os.fspath(path))}")
    f = open_gguf(path)  # a split set (<name>-00001-of-0000N.gguf) opens as one file
    arch = get_arch(f.arch)
    cfg = arch.config_from_gguf(f)
    report(0.5, "binding tensors")
    weights = load_weights(f, cfg, arch.load_layer)
    model = Model(f, arch, cfg, weights)
    report(0.8, "loading kernels")
    from .kernels_warmup import warmup

    on_passing_thread(warmup, model, lambda msg: report(0.8, msg))
    report(1.0, f"loaded in {time.perf_counter() - t0:.2f} s")
    return model
