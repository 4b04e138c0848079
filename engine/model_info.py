"""ModelInfo: what a GGUF holds, read from its header alone (no weights touched).

Used by `ggstation info`, the GUI's model picker and the memory estimate before loading.
Files that cannot be used are reported with the reason in `error`, not raised.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field

from . import quants
from .config import ModelConfig
from .errors import EngineError
from .gguf_file import GGUFFile, closing_on_error
from .gguf_split import files_size, open_gguf
from .memory import MemoryReport, estimate_memory
from .model import check_model
from .models.moe import MoeConfig

_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass
class ModelInfo:
    path: str
    file_size: int
    name: str = ""
    arch: str = ""
    n_params: int = 0
    quant_bytes: dict[str, int] = field(default_factory=dict)  # type name -> tensor bytes
    quant_counts: dict[str, int] = field(default_factory=dict)
    n_ctx_train: int = 0
    n_layer: int = 0
    n_embd: int = 0
    n_vocab: int = 0
    file_type: str = ""  # general.file_type by llama.cpp's name, e.g. "Q4_K_M"
    tokenizer: str = ""
    tokenizer_pre: str = ""
    has_chat_template: bool = False
    chat_template_name: str = ""
    weights_bytes: int = 0
    n_tensors: int = 0
    # mixture of experts: experts per layer and per token; parameters and weight bytes a token
    # runs through (everything but the experts it did not choose); the totals for dense models
    n_expert: int = 0
    n_expert_used: int = 0
    active_params: int = 0
    active_bytes: int = 0
    # for the CPU / GPU split (-ngl): tensor bytes of each repeating layer (blk.N.*), of the
    # output head (output_norm + output, or the tied token_embd standing in for output), and of
    # the tied token_embd alone (0 when the file has an output.weight)
    layer_weights_bytes: list[int] = field(default_factory=list)
    output_weights_bytes: int = 0
    output_tied_bytes: int = 0
    # bytes of the matrices the decode runs on row-interleaved copies (QTensor.packed): the
    # types with that form, expert stacks and an untied token embedding aside
    repackable_bytes: int = 0
    error: str | None = None
    cfg: ModelConfig | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def estimate(self, decode_path: str | None = None, **kw) -> MemoryReport:
        """Memory estimate for ContextParams-like keyword arguments (n_ctx, n_seq_max, ...,
        n_gpu_layers and gpu_device for the per-device split); decode_path: the one the model
        would be loaded for (None: quants.default_decode_path()), whose interleaved copies
        count unless it is "float"."""
        if self.cfg is None:
            raise EngineError(f"{self.path}: cannot estimate memory: {self.error}")
        kw.setdefault("layer_weights_bytes", self.layer_weights_bytes)
        kw.setdefault("output_weights_bytes", self.output_weights_bytes)
        kw.setdefault("output_tied_bytes", self.output_tied_bytes)
        path = decode_path or quants.default_decode_path()
        kw.setdefault("repacked_bytes", self.repackable_bytes if path != "float" else 0)
        return estimate_memory(self.cfg, self.weights_bytes, self.n_tensors, **kw)


def inspect_model(path: str | os.PathLike) -> ModelInfo:
    path = os.fspath(path)
    size = os.path.getsize(path) if os.path.isfile(path) else 0
    info = ModelInfo(path=path, file_size=size, name=os.path.basename(path))
    try:
        f = open_gguf(path)
        with closing_on_error(f):
            _fill(info, f)
        f.close()
    except EngineError as e:  # every message names the file, as GGUFError's do
        msg = str(e)
        info.error = msg if msg.startswith(f"{path}: ") else f"{path}: {msg}"
    except OSError as e:
        info.error = f"{path}: {e.strerror or e}"
    return info


def file_type_name(value) -> str:
    """general.file_type as llama.cpp names it ("Q4_K_M"); "" when absent or unknown."""
    from gguf import LlamaFileType

    try:
        name = LlamaFileType(int(value)).name
    except (TypeError, ValueError, OverflowError):
        return ""
    return (
        name.removeprefix("MOSTLY_") if name.startswith("MOSTLY_") or name in ("ALL_F32",) else name
    )


def _fill(info: ModelInfo, f: GGUFFile) -> None:
    info.file_size = files_size(f)  # every part of a split set
    info.name = f.get_str("general.name", "") or info.name
    info.arch = f.get_str("general.architecture", "") or ""
    info.n_tensors = len(f.tensors)
    info.weights_bytes = f.tensor_data_bytes
    qb: Counter[str] = Counter()  # type name -> bytes
    qc: Counter[str] = Counter()  # type name -> tensors
    n = 0
    for t in f.tensors.values():
        k = 1
        for d in t.shape:
            k *= int(d)
        n += k
        name = getattr(t.qtype, "name", str(t.qtype))
        qb[name] += t.nbytes
        qc[name] += 1
    info.n_params, info.quant_bytes, info.quant_counts = n, dict(qb), dict(qc)
    info.file_type = file_type_name(f.get("general.file_type"))
    info.tokenizer = f.get_str("tokenizer.ggml.model", "") or ""
    info.tokenizer_pre = f.get_str("tokenizer.ggml.pre", "") or ""
    info.has_chat_template = bool((f.get_str("tokenizer.chat_template", "") or "").strip())
    try:
        from .tokenizer.chat_template import ChatTemplate

        info.chat_template_name = ChatTemplate.from_gguf(f).name
    except Exception:  # the template is reported, never fatal for inspection
        info.chat_template_name = "gguf" if info.has_chat_template else ""
    _arch, cfg, _weights, _tokenizer = check_model(f)  # what load_model checks, no more, no less
    info.cfg = cfg
    _fill_placement(info, f, cfg.n_layer)
    _fill_experts(info, f, cfg)
    info.n_ctx_train, info.n_layer, info.n_embd, info.n_vocab = (
        cfg.n_ctx_train,
        cfg.n_layer,
        cfg.n_embd,
        cfg.n_vocab,
    )


def _fill_placement(info: ModelInfo, f: GGUFFile, n_layer: int) -> None:
    """The bytes -ngl moves: each repeating layer's and the output head's (engine/memory.py
    split_devices). Tensors of blocks past n_layer (e.g. next-token-prediction heads) stay on
    the CPU with the token embedding."""
    per_layer = [0] * n_layer
    head = 0
    for t in f.tensors.values():
        m = _BLOCK.match(t.name)
        if m and int(m.group(1)) < n_layer:
            per_layer[int(m.group(1))] += t.nbytes
        elif t.name.startswith(("output_norm.", "output.")):
            head += t.nbytes
    tied = 0
    if "output.weight" not in f.tensors and "token_embd.weight" in f.tensors:
        tied = f.tensors["token_embd.weight"].nbytes  # the embedding doubles as the output matrix
    info.layer_weights_bytes, info.output_weights_bytes, info.output_tied_bytes = (
        per_layer,
        head + tied,
        tied,
    )
    packable = quants.INTERLEAVED_TYPES
    info.repackable_bytes = sum(
        t.nbytes
        for t in f.tensors.values()
        if t.qtype in packable
        and len(t.shape) == 2
        and not (t.name == "token_embd.weight" and "output.weight" in f.tensors)
    )


def _fill_experts(info: ModelInfo, f: GGUFFile, cfg: ModelConfig) -> None:
    """Active parameters and bytes per token: a MoE token uses n_expert_used of the n_expert
    slices of each expert tensor (ffn_*_exps and their biases)."""
    info.active_params, info.active_bytes = info.n_params, info.weights_bytes
    if not isinstance(cfg, MoeConfig):
        return
    info.n_expert, info.n_expert_used = cfg.moe.n_expert, cfg.moe.n_expert_used
    unused = 1.0 - cfg.moe.n_expert_used / cfg.moe.n_expert
    for t in f.tensors.values():
        if "_exps." in t.name:
            n = 1
            for d in t.shape:
                n *= int(d)
            info.active_params -= round(n * unused)
            info.active_bytes -= round(t.nbytes * unused)
