"""Will a Hub model load here? Its header, read with HTTP range requests, through our own reader.

A GGUF's header (metadata and tensor table) comes before the tensor data, and is a few MB
even for a 70B model (the tokenizer's arrays are most of it). `remote_fit()` fetches it in
growing ranges (2 MiB, then doubling) only as far as a walk over the header's structure
needs, for every part of a split set. Each header is written into a sparse temporary file
of the remote file's full size, so the engine's own code runs on it unchanged: GGUFFile's
validation, `inspect_model` (architecture, hyper-parameters, every tensor the architecture
binds, the tokenizer) and the memory estimate of engine/memory.py. The tensor data is never
read: the file's holes read as zeros and take no disk space.

The verdict compares the estimate (weights + KV cache + compute buffers) with the RAM
available now: FITS up to 80 % of it, TIGHT up to all of it, else DOES_NOT_FIT.
"""

from __future__ import annotations

import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from ..errors import GGUFError, HubError
from ..gguf_file import MAX_TENSORS, SUPPORTED_VERSIONS
from . import client as hub
from .session import TIMEOUT_S, endpoint, hub_errors

if TYPE_CHECKING:
    from ..memory import MemoryReport
    from ..model_info import ModelInfo
    from .client import HubFile, HubPart

FITS = "fits"
TIGHT = "tight"
DOES_NOT_FIT = "does not fit"

FIRST_RANGE = 2 << 20  # bytes of the first request; each further one doubles
MAX_HEADER = 512 << 20  # a header larger than this is refused (hostile or broken)
_SCALAR_SIZES = {
    0: 1,
    1: 1,
    2: 2,
    3: 2,
    4: 4,
    5: 4,
    6: 4,
    7: 1,
    10: 8,
    11: 8,
    12: 8,
}  # GGUFValueType
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class RemoteFit:
    """What the engine says about a model before it is downloaded.

    Attributes:
        arch_supported / unsupported_types: the architecture has an implementation here / the
            tensor types without a kernel here.
        error: why the engine would refuse to load it (any check, tokenizer included); None if
            it would load.
        memory: the engine's estimate for n_ctx and one sequence (None when the architecture is
            unknown: then needed_bytes counts the weights only).
        verdict: FITS, TIGHT or DOES_NOT_FIT against available_bytes.
        bytes_read: bytes fetched from the Hub (0 when the file was in the cache).
    """

    file: HubFile
    name: str
    arch: str
    n_params: int
    n_ctx_train: int
    n_ctx: int
    has_chat_template: bool
    file_type: str
    quant_bytes: dict[str, int]
    arch_supported: bool
    unsupported_types: tuple[str, ...]
    error: str | None
    memory: MemoryReport | None
    needed_bytes: int
    available_bytes: int
    verdict: str
    bytes_read: int
    seconds: float
    file_size: int = 0
    quant_counts: dict[str, int] = field(default_factory=dict)

    @property
    def supported(self) -> bool:
        return self.arch_supported and not self.unsupported_types and self.error is None

    def summary(self) -> str:
        """One line: "llama 134.5M params, ctx 8192, chat template; needs 120 MiB of 6.1 GiB: fits"."""
        parts = [
            f"{self.arch or '?'} {_count(self.n_params)} params",
            f"ctx {self.n_ctx_train}",
            "chat template" if self.has_chat_template else "no chat template",
        ]
        head = ", ".join(parts)
        if not self.supported:
            return f"{head}; not supported here: {self.why_unsupported()}"
        return (
            f"{head}; needs {_size(self.needed_bytes)} at n_ctx {self.n_ctx}, "
            f"{_size(self.available_bytes)} available: {self.verdict}"
        )

    def why_unsupported(self) -> str:
        if not self.arch_supported:
            return f"architecture '{self.arch}'"
        if self.unsupported_types:
            return f"tensor type(s) {', '.join(self.unsupported_types)}"
        return self.error or ""


def remote_fit(file: HubFile, n_ctx: int | None = None, token: str | None = None) -> RemoteFit:
    """The fit of `file` (see the module docstring); cached files are read locally.

    Args:
        n_ctx: context for the estimate; None: 4096 (the CLI's default), at most the model's.

    Raises:
        HubError: the Hub could not be reached or refused (OFFLINE, AUTH, NOT_FOUND), or the
            header is not a GGUF one (CORRUPT).
    """
    t0 = time.perf_counter()
    if file.local_path is None and (file.revision == "main" or file.size is None):
        file = hub.choose(
            hub.repo(file.repo_id, token).files, filename=file.filename, repo_id=file.repo_id
        )
    file = hub.with_local_path(file)
    if file.local_path is not None:
        return _fit(file, _inspect(file.local_path), n_ctx, 0, t0)
    with tempfile.TemporaryDirectory(prefix="ggstation-fit-") as tmp:
        bytes_read = 0
        for part in file.parts:
            bytes_read += _fetch_header(file, part, Path(tmp) / Path(part.filename).name, token)
        info = _inspect(Path(tmp) / Path(file.filename).name)
        info.path = f"{file.repo_id}/{file.filename}"
        return _fit(file, info, n_ctx, bytes_read, t0)


def _inspect(path: Path) -> ModelInfo:
    from ..model_info import inspect_model

    return inspect_model(path)


def _fit(
    file: HubFile, info: ModelInfo, n_ctx: int | None, bytes_read: int, t0: float
) -> RemoteFit:
    from ..models import ARCH_ALIASES, ARCHITECTURES
    from ..quants import SUPPORTED

    supported_names = {t.name for t in SUPPORTED}
    arch_ok = ARCH_ALIASES.get(info.arch, info.arch) in ARCHITECTURES
    bad_types = tuple(sorted(t for t in info.quant_counts if t not in supported_names))
    n_ctx_train = info.n_ctx_train or 0
    use_ctx = n_ctx or (min(4096, n_ctx_train) if n_ctx_train else 4096)
    memory = info.estimate(n_ctx=use_ctx) if info.cfg is not None else None
    needed = memory.total_bytes if memory is not None else info.weights_bytes or (file.size or 0)
    available = psutil.virtual_memory().available
    verdict = FITS if needed <= 0.8 * available else TIGHT if needed <= available else DOES_NOT_FIT
    return RemoteFit(
        file=file,
        name=info.name,
        arch=info.arch,
        n_params=info.n_params,
        n_ctx_train=n_ctx_train,
        n_ctx=use_ctx,
        has_chat_template=info.has_chat_template,
        file_type=info.file_type,
        quant_bytes=dict(info.quant_bytes),
        arch_supported=arch_ok,
        unsupported_types=bad_types,
        error=info.error,
        memory=memory,
        needed_bytes=needed,
        available_bytes=available,
        verdict=verdict,
        bytes_read=bytes_read,
        seconds=time.perf_counter() - t0,
        file_size=file.size or info.file_size,
        quant_counts=dict(info.quant_counts),
    )


# -- the header, by ranges --------------------------------------------------------------------


def _fetch_header(file: HubFile, part: HubPart, dest: Path, token: str | None) -> int:
    """Writes `part`'s header into a sparse file `dest` of the part's size; returns bytes read."""
    what = f"{file.spec} ({part.filename})"
    reader = _RangeReader(file, part, token)
    with hub_errors(what, token):
        try:
            end = header_length(reader)
        except GGUFError as e:
            raise HubError(f"{what}: {e}", HubError.CORRUPT) from None
        finally:
            reader.close()
    with open(dest, "wb") as out:
        out.write(reader.buf[:end])
        out.truncate(reader.size)  # a hole: no disk space, reads as zeros
    return reader.bytes_read


class _RangeReader:
    """The first bytes of a remote file, fetched in doubling ranges as a parser asks for them."""

    def __init__(self, file: HubFile, part: HubPart, token: str | None):
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        self.url = hf_hub_url(
            file.repo_id, part.filename, revision=file.revision, endpoint=endpoint()
        )
        self.headers = build_hf_headers(token=token)
        self.headers["Accept-Encoding"] = "identity"
        self.size = part.size or 0
        self.name = part.filename
        self.buf = bytearray()
        self.bytes_read = 0
        self._next = FIRST_RANGE

    def need(self, end: int) -> None:
        """Makes buf hold bytes [0, end)."""
        if end <= len(self.buf):
            return
        if end > self.size:
            raise GGUFError(f"truncated: the header needs {end} bytes, the file has {self.size}")
        if end > MAX_HEADER:
            raise GGUFError(f"the header is larger than {MAX_HEADER >> 20} MiB")
        while len(self.buf) < end:
            start = len(self.buf)
            stop = min(self.size, max(end, start + self._next))
            self._next *= 2
            self._get(start, stop)

    def _get(self, start: int, stop: int) -> None:
        from huggingface_hub.utils import get_session, hf_raise_for_status

        headers = dict(self.headers, Range=f"bytes={start}-{stop - 1}")
        with get_session().stream(
            "GET", self.url, headers=headers, timeout=TIMEOUT_S, follow_redirects=True
        ) as r:
            hf_raise_for_status(r)
            if r.status_code != 206 and start > 0:  # the range was ignored: skip to `start`
                skip = start
            else:
                skip = 0
            want = stop - start
            got = bytearray()
            for chunk in r.iter_bytes(1 << 16):
                self.bytes_read += len(chunk)
                if skip:
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                got += chunk
                if len(got) >= want:
                    break
            if str(r.url) != self.url and r.url.host != _host(self.url):
                self.headers.pop("authorization", None)  # a signed CDN address: no token there
            self.url = str(r.url)  # the redirect's target: one round trip less next time
        self.buf += got[:want]
        if len(got) < want:
            raise GGUFError(f"the server sent {len(got)} of bytes {start}-{stop - 1}")

    def close(self) -> None:
        pass


def _host(url: str) -> str:
    from urllib.parse import urlparse

    return urlparse(url).hostname or ""


def header_length(r: _RangeReader) -> int:
    """Where a GGUF's tensor table ends, walking its structure (engine/gguf_file.py layout)."""
    r.need(24)
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", r.buf, 0)
    if magic != b"GGUF":
        raise GGUFError(f"not a GGUF file (magic {bytes(magic)!r})")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(f"unsupported GGUF version {version}")
    if n_tensors > MAX_TENSORS or n_kv > MAX_TENSORS:
        raise GGUFError(f"absurd counts: {n_tensors} tensors, {n_kv} metadata keys")
    pos = 24
    for _ in range(n_kv):
        pos = _skip_string(r, pos)
        r.need(pos + 4)
        (vtype,) = struct.unpack_from("<I", r.buf, pos)
        pos = _skip_value(r, pos + 4, vtype)
    for _ in range(n_tensors):
        pos = _skip_string(r, pos)
        r.need(pos + 4)
        (n_dims,) = struct.unpack_from("<I", r.buf, pos)
        if n_dims > 4:
            raise GGUFError(f"a tensor with {n_dims} dimensions at offset {pos}")
        pos += 4 + 8 * n_dims + 4 + 8
        r.need(pos)
    return pos


def _skip_string(r: _RangeReader, pos: int) -> int:
    r.need(pos + 8)
    (n,) = struct.unpack_from("<Q", r.buf, pos)
    r.need(pos + 8 + n)
    return pos + 8 + n


def _skip_value(r: _RangeReader, pos: int, vtype: int) -> int:
    if vtype == _STRING:
        return _skip_string(r, pos)
    if vtype in _SCALAR_SIZES:
        r.need(pos + _SCALAR_SIZES[vtype])
        return pos + _SCALAR_SIZES[vtype]
    if vtype != _ARRAY:
        raise GGUFError(f"unknown metadata value type {vtype} at offset {pos - 4}")
    r.need(pos + 12)
    item, count = struct.unpack_from("<IQ", r.buf, pos)
    pos += 12
    if item == _STRING:
        if count > MAX_HEADER // 8:
            raise GGUFError(f"absurd array length {count} at offset {pos - 8}")
        for _ in range(count):
            pos = _skip_string(r, pos)
        return pos
    if item not in _SCALAR_SIZES:
        raise GGUFError(f"array of unsupported item type {item} at offset {pos - 12}")
    pos += count * _SCALAR_SIZES[item]
    r.need(pos)
    return pos


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
