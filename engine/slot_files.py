"""Slot files: a slot's tokens and KV cache on disk (llama-server's --slot-save-path).

File layout, as llama_state_seq_save_file writes it:

    u32 magic 'ggsq' | u32 version 3 | u32 n_token_count | int32 tokens[n_token_count] | state

The tokens are llama-server's packed server_tokens (LLAMA_TOKEN_NULL, state version 1,
u32 n, n ids, u32 media count 0) or, in files from older servers, the plain ids; both are
read. The state is ours (llama.cpp's is a ggml tensor dump): magic b"GGKV", u32 version, u32
length of a JSON header naming the cache's shape, then every layer's keys, then every
layer's values, raw. A file from another model or cache type is refused, not misread.

Threads: only what touches the cache runs on the scheduler's thread (Scheduler.call_soon),
while the slot is idle: `snapshot` (copies of the slot's keys and values), `restore` (the
loaded arrays into the cache) and `erase`. The disk I/O, `write` and `load`, runs on another
thread, so a slow disk or a big file never stalls the other slots' streams. A restored
slot's tokens become its cache, so the next request with the same prompt reuses it.

The files are the client's to name and anyone with access to the folder could plant one, so
`load` reads no more than a slot can hold (the file's size is checked before anything big is
read) and `write` creates its temporary file itself, never through a planted link.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from .errors import EngineError, InvalidRequestError, SlotFileError

if TYPE_CHECKING:
    from .scheduler import Scheduler

STATE_SEQ_MAGIC = 0x67677371  # 'ggsq'
STATE_SEQ_VERSION = 3
TOKEN_NULL = -1  # LLAMA_TOKEN_NULL: marks the packed token format
TOKENS_STATE_VERSION = 1
KV_MAGIC = b"GGKV"
KV_VERSION = 1
MAX_META_BYTES = 4096  # the JSON header we write is about 120 bytes
_MAX_META_BRACKETS = 16  # ours has 3; bounds json.loads' recursion on a planted header
_FORBIDDEN = set(':*?"<>|/\\') | {"\ufffd", "\ufeff", "\uff0e", "\u2215", "\u2216"}
_INVALID = "No available space in KV cache or invalid slot save file"  # llama-server's words
_OPEN_READ = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_BINARY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_OPEN_NEW = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_BINARY", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
_TMP_NAME_BYTES = 64  # of the slot's name in its temporary file's: short enough for any valid name


def valid_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename without subdirectories: no separators, no '..', no
    control or look-alike characters, no leading/trailing space or trailing dot."""
    if not name or len(name.encode("utf-8", "surrogatepass")) > 255:
        return False
    for ch in name:
        c = ord(ch)
        if c <= 0x1F or c == 0x7F or 0x80 <= c <= 0x9F or 0xD800 <= c <= 0xDFFF or ch in _FORBIDDEN:
            return False
    return not (name[0] == " " or name[-1] in " ." or ".." in name or name == ".")


def pack_tokens(tokens: list[int]) -> np.ndarray:
    """llama-server's packed server_tokens of a text-only slot, as int32 words."""
    return np.array([TOKEN_NULL, TOKENS_STATE_VERSION, len(tokens), *tokens, 0], np.int32)


def unpack_tokens(words: np.ndarray) -> list[int]:
    """The token ids of a packed or plain (older servers') token list."""
    if len(words) == 0 or int(words[0]) != TOKEN_NULL:
        return [int(t) for t in words]
    if len(words) < 3 or int(words[1]) != TOKENS_STATE_VERSION:
        raise SlotFileError("Unsupported server tokens state version")
    n = int(words[2]) & 0xFFFFFFFF
    if 3 + n + 1 > len(words):
        raise SlotFileError("truncated token list in slot save file")
    if int(words[3 + n]) != 0:
        raise SlotFileError("Cannot restore media tokens without an mmproj")
    if len(words) > 3 + n + 1:
        raise SlotFileError("Trailing data in server tokens state")
    return [int(t) for t in words[3 : 3 + n]]


def _cache_meta(kv) -> dict[str, Any]:
    return {
        "n_layer": len(kv.k),
        "k_shape": list(kv.k[0].shape[2:]),
        "v_shape": list(kv.v[0].shape[2:]),
        "type_k": kv.type_k,
        "type_v": kv.type_v,
    }


# --- save ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    """Copies of a slot's tokens, keys and values (every layer's, positions first), and the
    cache's header fields: what `write` puts on disk."""

    tokens: list[int]
    k: list[np.ndarray]
    v: list[np.ndarray]
    meta: dict[str, Any]


def snapshot(scheduler: Scheduler, slot_id: int) -> Snapshot:
    """On the scheduler's thread, the slot idle: copies of what `write` saves."""
    slot = _slot(scheduler, slot_id)
    kv: Any = scheduler.ctx.kv  # the engine's KVCache: slot files need its whole-sequence state
    k, v = kv.seq_state(slot.id)
    return Snapshot(list(slot.cache_tokens), k, v, _cache_meta(kv))


def write(save_dir: str, name: str, snap: Snapshot) -> int:
    """Write a snapshot as save_dir/name; returns the bytes written. A failed save leaves
    neither a half-written file under the name nor a temporary file.

    The temporary file is created (O_EXCL, O_NOFOLLOW) under a fresh random name in save_dir,
    so nothing planted there is written through; os.replace then swaps it in for the name,
    replacing a link there, never the link's target.

    Raises:
        InvalidRequestError: the name is taken by a directory, or the path is too long.
        EngineError: any other failure to write (a full disk, no permission).
    """
    path = os.path.join(save_dir, name)
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise InvalidRequestError(
                f"Unable to save slot: '{name}' is a directory in the slot save path"
            )
    except FileNotFoundError:
        pass
    except OSError as e:
        raise _save_error(e) from None
    meta = json.dumps({**snap.meta, "n_pos": int(snap.k[0].shape[0]) if snap.k else 0}).encode()
    words = pack_tokens(snap.tokens)
    try:
        fd, tmp = _create_temporary(save_dir, name)
    except OSError as e:
        raise _save_error(e) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<III", STATE_SEQ_MAGIC, STATE_SEQ_VERSION, len(words)))
            f.write(words.astype("<i4").tobytes())
            f.write(KV_MAGIC + struct.pack("<II", KV_VERSION, len(meta)) + meta)
            for a in (*snap.k, *snap.v):
                f.write(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)
            n = f.tell()
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise _save_error(e) from None
        raise
    return n


def _create_temporary(save_dir: str, name: str) -> tuple[int, str]:
    """A new file `.NAME.RANDOM.tmp` in save_dir (NAME cut short), opened for writing."""
    short = name.encode("utf-8")[:_TMP_NAME_BYTES].decode("utf-8", "ignore")
    for _ in range(100):
        tmp = os.path.join(save_dir, f".{short}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, _OPEN_NEW, 0o666), tmp
        except FileExistsError:
            continue  # taken (by chance or planted): draw another name
    raise FileExistsError(errno.EEXIST, "no free temporary file name", save_dir)


def _save_error(e: OSError) -> EngineError:
    reason = e.strerror or str(e)
    if e.errno in (errno.EISDIR, errno.ENAMETOOLONG):  # the client's name is at fault
        return InvalidRequestError(f"Unable to save slot: {reason}")
    return EngineError(f"Unable to save slot: {reason}")


# --- restore -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CacheShape:
    """What a slot file must fit: the cache's header fields, each array's shape per position
    and type (every layer's keys, then every layer's values), the positions one slot holds
    and the vocabulary's size."""

    meta: dict[str, Any]
    arrays: tuple[tuple[tuple[int, ...], np.dtype], ...]
    n_ctx_seq: int
    n_vocab: int

    @classmethod
    def of(cls, kv, n_ctx_seq: int, n_vocab: int) -> CacheShape:
        arrays = tuple((tuple(int(d) for d in a.shape[2:]), a.dtype) for a in (*kv.k, *kv.v))
        return cls(_cache_meta(kv), arrays, int(n_ctx_seq), int(n_vocab))

    @property
    def bytes_per_pos(self) -> int:
        return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in self.arrays)

    @property
    def max_file_bytes(self) -> int:
        """The largest file a slot can hold: headers, n_ctx_seq packed tokens and n_ctx_seq
        positions of keys and values."""
        return (
            12
            + 4 * (self.n_ctx_seq + 4)
            + 12
            + MAX_META_BYTES
            + self.n_ctx_seq * self.bytes_per_pos
        )


@dataclass(frozen=True)
class SlotFile:
    """A slot file read for a cache of a given shape: its tokens, every layer's keys and
    values (positions first) and the bytes read."""

    tokens: list[int]
    k: list[np.ndarray]
    v: list[np.ndarray]
    n_read: int


def load(path: str, shape: CacheShape) -> SlotFile:
    """Read a slot file written for a cache of this shape, off the scheduler's thread.

    Reads piece by piece, each piece checked against the file's size and against what a slot
    can hold before it is read, so a planted file cannot make this read or allocate more
    than one slot's worth. A path that is not a regular file (a directory, a named pipe) is
    refused without waiting on it.

    Raises:
        SlotFileError: the reason, without llama-server's "Unable to restore slot" prefix.
    """
    try:
        fd = os.open(path, _OPEN_READ)
    except OSError:
        raise SlotFileError(_INVALID) from None  # llama-server cannot tell a missing file either
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SlotFileError(_INVALID)
        if st.st_size > shape.max_file_bytes:
            raise SlotFileError(
                f"the slot save file has {st.st_size} bytes, more than a slot of this "
                f"server holds ({shape.max_file_bytes} bytes at most)"
            )
        with os.fdopen(fd, "rb", closefd=False) as f:
            return _parse(_Reader(f, st.st_size), shape)
    except OSError:
        raise SlotFileError(_INVALID) from None
    finally:
        os.close(fd)


class _Reader:
    """Exact reads from a file of known size: a piece the file cannot hold is refused before
    it is read or allocated."""

    def __init__(self, f: BinaryIO, size: int):
        self.f, self.size, self.at = f, size, 0

    def need(self, n: int) -> None:
        if n > self.size - self.at:
            raise SlotFileError(_INVALID)

    def bytes(self, n: int) -> bytes:
        self.need(n)
        data = self.f.read(n)
        if len(data) != n:  # the file shrank meanwhile
            raise SlotFileError(_INVALID)
        self.at += n
        return data

    def array(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        a = np.empty(shape, dtype)
        raw = a.reshape(-1).view(np.uint8)
        self.need(len(raw))
        done = 0
        while done < len(raw):
            got = self.f.readinto(raw.data[done:])  # type: ignore[attr-defined]
            if not got:
                raise SlotFileError(_INVALID)
            done += got
        self.at += done
        return a


def _parse(r: _Reader, shape: CacheShape) -> SlotFile:
    magic, version, n_words = struct.unpack("<III", r.bytes(12))
    if magic != STATE_SEQ_MAGIC or version != STATE_SEQ_VERSION:
        raise SlotFileError(_INVALID)
    if n_words > shape.n_ctx_seq + 4:  # more than the packed tokens of a full slot
        r.need(4 * n_words)
        raise SlotFileError("Restored prompt does not fit in the slot context")
    tokens = unpack_tokens(np.frombuffer(r.bytes(4 * n_words), "<i4"))
    if len(tokens) > shape.n_ctx_seq:
        raise SlotFileError("Restored prompt does not fit in the slot context")
    if tokens and not 0 <= min(tokens) <= max(tokens) < shape.n_vocab:
        raise SlotFileError("Invalid tokens in slot save file")
    head = r.bytes(12)
    if head[:4] != KV_MAGIC:
        raise SlotFileError(_INVALID)
    kv_version, n_meta = struct.unpack_from("<II", head, 4)
    if n_meta > MAX_META_BYTES:
        raise SlotFileError(_INVALID)
    meta, n_pos = _parse_meta(r.bytes(n_meta))
    if kv_version != KV_VERSION or meta != shape.meta:
        raise SlotFileError("the slot file was saved from another model or KV cache type")
    if n_pos != len(tokens):
        raise SlotFileError(_INVALID)
    r.need(n_pos * shape.bytes_per_pos)  # a truncated file: refused before allocating
    arrays = [r.array(dtype, (n_pos, *pos_shape)) for pos_shape, dtype in shape.arrays]
    n_layer = len(arrays) // 2
    return SlotFile(tokens, arrays[:n_layer], arrays[n_layer:], r.at)


def _parse_meta(raw: bytes) -> tuple[dict[str, Any], int]:
    """The JSON header's fields but n_pos, and n_pos; anything but an object with a
    non-negative integer n_pos is an invalid file."""
    if raw.count(b"[") + raw.count(b"{") > _MAX_META_BRACKETS:
        raise SlotFileError(_INVALID)
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError):
        raise SlotFileError(_INVALID) from None
    n_pos = meta.pop("n_pos", None) if isinstance(meta, dict) else None
    if type(n_pos) is not int or n_pos < 0:  # (not a bool, a float or a string)
        raise SlotFileError(_INVALID)
    return meta, n_pos


def restore(scheduler: Scheduler, slot_id: int, loaded: SlotFile | SlotFileError) -> int:
    """On the scheduler's thread, the slot idle: the loaded file's tokens and cache become the
    slot's; returns the tokens restored. `loaded` may be why the file could not be read: a
    failed restore leaves the slot empty, as llama-server's does.

    Raises:
        SlotFileError: "Unable to restore slot: <reason>".
    """
    slot = _slot(scheduler, slot_id)
    kv: Any = scheduler.ctx.kv
    try:
        if isinstance(loaded, SlotFileError):
            raise loaded
        kv.set_seq_state(slot.id, loaded.k, loaded.v)
    except EngineError as e:
        kv.seq_clear(slot.id)
        slot.cache_tokens = []
        raise SlotFileError(f"Unable to restore slot: {e}") from None
    slot.cache_tokens = list(loaded.tokens)
    # image spans are not in the file: a restored image's KV is reused only once an
    # identical image is decoded again at that place (scheduler.media_prefix)
    slot.cache_media = {}
    return len(loaded.tokens)


def _slot(scheduler: Scheduler, slot_id: int):
    if not 0 <= slot_id < scheduler.n_slots:
        raise InvalidRequestError("Invalid slot ID")
    return scheduler.slots[slot_id]


def erase(scheduler: Scheduler, slot_id: int) -> dict[str, Any]:
    """On the scheduler's thread: forget the slot's cache."""
    slot = _slot(scheduler, slot_id)
    n = len(slot.cache_tokens)
    scheduler.ctx.kv.seq_clear(slot.id)
    slot.cache_tokens = []
    slot.cache_media = {}
    return {"n_erased": n}
