"""The plain values that cross between the engine seam and the widgets.

Frozen dataclasses only: no Qt, no engine import at run time. The real adapter
(app/engine_adapter.py) and the test fake both build these, so widgets and item models never
see an engine object.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine import MemoryReport


@dataclass(frozen=True)
class LlmFileInfo:
    """One GGUF file on disk, read cheaply (no weights). `error` says why it cannot be used."""

    path: str
    name: str
    arch: str = "?"
    n_params: int = 0
    quant_mix: dict[str, int] = field(default_factory=dict)  # qtype name -> bytes
    file_size: int = 0
    n_ctx_train: int = 0
    has_chat_template: bool = False
    tokenizer: str = ""
    error: str | None = None
    quant: str = ""  # the quantised type most tensors use (what the file name says)
    title: str = ""  # general.name from the metadata
    template_name: str = ""  # the chat template family the engine detected (or its fallback)
    n_expert: int = 0  # mixture of experts: experts per layer (0: a dense model)
    n_expert_used: int = 0  # experts each token runs through
    active_params: int = 0  # parameters one token runs through
    n_layer: int = 0  # repeating layers (the GPU layers control goes to n_layer + 1: with the head)
    mmproj: str = ""  # the vision projector paired with it (app/vision_files.py), '' for none
    mmproj_note: str = ""  # which projector and why, or why there is none, in words

    @property
    def vision(self) -> bool:
        return bool(self.mmproj)

    @property
    def main_quant(self) -> str:
        if self.quant:
            return self.quant
        return max(self.quant_mix, key=self.quant_mix.__getitem__) if self.quant_mix else "?"


@dataclass(frozen=True)
class LoadParams:
    n_ctx: int = 4096
    n_seq_max: int = 2  # slots: one for the chat pane, the rest for the server
    n_threads: int = 0  # 0 = engine default (all cores)
    type_k: str = "f16"
    n_batch: int = 512
    n_ubatch: int = 512
    n_gpu_layers: int = (
        0  # -ngl: the last N layers on the GPU, the head counting as the last; -1 = all
    )
    mmproj: str = ""  # the vision projector to load with the model ('' text only)


@dataclass(frozen=True)
class DeviceDesc:
    """One compute device the engine found (engine.backends.DeviceInfo, as plain values)."""

    name: str  # "CPU", "GL0"
    backend: str  # "CPU", "OpenGL"
    description: str
    total_bytes: int | None = None  # None: the driver does not say
    free_bytes: int | None = None
    caps: tuple[str, ...] = ()
    available: bool = True
    reason: str = ""  # why it cannot be used

    @property
    def is_gpu(self) -> bool:
        return self.backend != "CPU"


@dataclass(frozen=True)
class DeviceShare:
    """What one device holds (or would hold) of a model: engine.backends.DeviceMemory, plus for
    an estimate the device's room and the engine's verdict on it."""

    device: str
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    n_layers: int
    capacity_bytes: int = 0  # free memory (else total) the device reports; 0: unknown
    verdict: str = ""  # a GPU share's "fits" / "tight" / "too big" / "unknown"; "" otherwise

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes


@dataclass(frozen=True)
class MemoryFigures:
    weights_bytes: int = 0
    weights_resident_bytes: int = 0
    kv_bytes: int = 0
    kv_used_bytes: int = 0
    kv_per_seq_used: tuple[int, ...] = ()
    kv_seq_capacity_bytes: int = 0
    compute_bytes: int = 0
    metadata_bytes: int = 0
    rss_bytes: int = 0
    total_bytes: int = 0
    devices: tuple[DeviceShare, ...] = ()  # per device; the figures above are the sums
    repacked_bytes: int = (
        0  # of the weights, those held as interleaved copies (replacing mapped pages)
    )
    # the vision projector (mmproj), always in RAM: its weights and one image tile's encode
    # buffer; both are in total_bytes and host_bytes, and in no device's share
    projector_weights_bytes: int = 0
    projector_compute_bytes: int = 0

    @property
    def projector_bytes(self) -> int:
        return self.projector_weights_bytes + self.projector_compute_bytes

    @property
    def gpu_shares(self) -> tuple[DeviceShare, ...]:
        return tuple(d for d in self.devices if d.device != "CPU")

    @property
    def host_bytes(self) -> int:
        """What stays in RAM: the total less the GPUs' shares."""
        return self.total_bytes - sum(d.total_bytes for d in self.gpu_shares)

    @classmethod
    def from_report(
        cls, report: MemoryReport, devices: tuple[DeviceShare, ...] | None = None
    ) -> MemoryFigures:
        """The engine's report with its "not known" Nones shown as 0; `devices` replaces the
        report's own per-device shares (to add capacities and verdicts)."""
        if devices is None:
            devices = tuple(
                DeviceShare(
                    d.device,
                    int(d.weights_bytes),
                    int(d.kv_bytes),
                    int(d.compute_bytes),
                    int(d.n_layers),
                )
                for d in report.devices
            )
        return cls(
            weights_bytes=int(report.weights_bytes),
            weights_resident_bytes=int(report.weights_resident_bytes or 0),
            kv_bytes=int(report.kv_bytes),
            kv_used_bytes=int(report.kv_used_bytes),
            kv_per_seq_used=tuple(int(x) for x in report.kv_per_seq_used),
            kv_seq_capacity_bytes=int(report.kv_seq_capacity_bytes),
            compute_bytes=int(report.compute_bytes),
            metadata_bytes=int(report.metadata_bytes),
            rss_bytes=int(report.rss_bytes or 0),
            total_bytes=int(report.total_bytes),
            devices=devices,
            repacked_bytes=int(report.repacked_bytes),
            projector_weights_bytes=int(report.projector_weights_bytes),
            projector_compute_bytes=int(report.projector_compute_bytes),
        )


@dataclass(frozen=True)
class TensorRow:
    layer: int  # -1 for tensors outside the blocks (token_embd, output_norm, output)
    name: str
    qtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    seed: int = -1  # -1 = pick a fresh seed per reply (and record it)
    max_tokens: int = 512
    # Ban end-of-generation tokens so a reply is exactly max_tokens long (llama.cpp's
    # ignore_eos). Not in the sampling panel: app/bench_gui.py sets it to time fixed replies.
    ignore_eos: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ReplyStep:
    text_delta: str
    finish_reason: str | None
    n_prompt: int
    n_generated: int
    n_cached: int = 0
    t_prompt_ms: float = 0.0
    t_gen_ms: float = 0.0
    # what the engine is doing before the first token, when it says ("encoding image 1 of 2");
    # a step with a phase carries no text
    phase: str = ""


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str = ""
    cors: bool = False


@dataclass(frozen=True)
class StarterModel:
    name: str
    description: str = ""
    size_bytes: int = 0
    cached_path: str | None = None


@dataclass(frozen=True)
class BackendInfo:
    cpu_model: str
    n_cores: int
    n_logical: int
    n_threads: int
    cpu_target: str
    simd: tuple[str, ...]


# -- Hugging Face Hub (the Discover panel) ------------------------------------------------------

FIT_OK, FIT_TIGHT, FIT_NO = "fits", "tight", "does not fit"  # HubFitInfo.verdict


@dataclass(frozen=True)
class HubRepoInfo:
    """A GGUF repository found by a search."""

    repo_id: str
    downloads: int = 0
    likes: int = 0
    gated: bool = False
    n_files: int = 0  # GGUF model files (a split set counts once)
    vision: bool = False  # the listing has a projector (mmproj) GGUF: its models read images


@dataclass(frozen=True)
class HubFileInfo:
    """One model file of a repository (a split set is one file: its first part)."""

    repo_id: str
    filename: str
    quant: str = ""  # the tag in the name ("Q4_K_M"), "" when there is none
    size_bytes: int | None = None  # all parts together; None when the listing did not say
    n_parts: int = 1
    local_path: str | None = None  # the first part in the Hugging Face cache, when complete
    default: bool = False  # the file `-hf repo` picks without a quant tag
    # the repository's projector that downloads with it, as -hf brings it ('' for none), and its
    # size (None when the listing did not say); local_path is set only when both are cached
    mmproj: str = ""
    mmproj_bytes: int | None = None

    @property
    def download_bytes(self) -> int | None:
        """The model and its projector, what a download moves."""
        if self.size_bytes is None:
            return None
        return self.size_bytes + (self.mmproj_bytes or 0)


@dataclass(frozen=True)
class HubFitInfo:
    """What the engine says of a Hub file from its header alone, before any download."""

    repo_id: str
    filename: str
    verdict: str  # FIT_OK, FIT_TIGHT or FIT_NO against available RAM
    supported: bool
    why_unsupported: str = ""  # "architecture 'mamba'", "tensor type(s) IQ2_XXS", ...
    arch: str = "?"
    n_params: int = 0
    n_ctx_train: int = 0
    n_ctx: int = 0  # the context the estimate is for
    has_chat_template: bool = False
    needed_bytes: int = 0
    available_bytes: int = 0
    bytes_read: int = 0  # fetched from the Hub to decide (0 when the file was cached)


# -- remote OpenAI-compatible servers (the Remote servers panel) --------------------------------


@dataclass(frozen=True)
class EndpointInfo:
    """A remote server as the settings keep it: never its API key (that is in the keyring)."""

    name: str
    url: str  # normalised base URL, without /v1

    @property
    def label(self) -> str:
        return self.name or self.url


@dataclass(frozen=True)
class RemoteModelInfo:
    id: str
    n_ctx: int = 0  # 0: the server did not say


@dataclass(frozen=True)
class RemoteServerState:
    """What connecting to an endpoint found: its models and what it speaks besides OpenAI."""

    url: str
    kind: str  # "openai", "llama-server" or "ggstation"
    models: tuple[RemoteModelInfo, ...] = ()
    n_ctx: int = 0
    total_slots: int = 0
    has_slots: bool = False
    has_metrics: bool = False

    @property
    def monitored(self) -> bool:
        return self.has_slots or self.has_metrics


@dataclass(frozen=True)
class RemoteSlotRow:
    id: int
    n_ctx: int
    busy: bool
    n_tokens: int  # prompt + generated tokens of the slot's current task


@dataclass(frozen=True)
class RemoteLoad:
    """One poll of a remote server's /slots and /metrics."""

    url: str
    slots: tuple[RemoteSlotRow, ...] = ()
    tokens_predicted_total: float | None = None  # None: no /metrics
    tokens_per_s: float | None = None  # from the counter's growth since the previous poll
    requests_processing: int = 0
    error: str = ""
