"""Slot files: a slot's tokens and KV cache on disk (llama-server's --slot-save-path).

File layout, as llama_state_seq_save_file writes it:

    u32 magic 'ggsq' | u32 version 3 | u32 n_token_count | int32 tokens[n_token_count] | state

The tokens are llama-server's packed server_tokens (LLAMA_TOKEN_NULL, state version 1,
u32 n, n ids, u32 media count 0) or, in files from older servers, the plain ids; both are
read. The state is ours (llama.cpp's is a ggml tensor dump): magic b"GGKV", u32 version, u32
length of a JSON header naming the cache's shape, then every layer's keys, then every
layer's values, raw. A file from another model or cache type is refused, not misread.

save / restore / erase run on the scheduler's thread (Scheduler.call_soon) while the slot is
idle; a restored slot's tokens become its cache, so the next request with the same prompt
reuses it (n_cached).
"""

from __future__ import annotations

import json
import os
import struct
import time
from typing import TYPE_CHECKING, Any

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
_FORBIDDEN = set(':*?"<>|/\\') | {"\ufffd", "\ufeff", "\uff0e", "\u2215", "\u2216"}


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
    return {"n_layer": len(kv.k), "k_shape": list(kv.k[0].shape[2:]), "v_shape": list(kv.v[0].shape[2:]),
            "type_k": kv.type_k, "type_v": kv.type_v}


def write_file(path: str, tokens: list[int], kv, seq: int) -> int:
    """Write seq's tokens and cache to path; returns the bytes written."""
    k, v = kv.seq_state(seq)
    meta = json.dumps({**_cache_meta(kv), "n_pos": int(k[0].shape[0]) if k else 0}).encode()
    words = pack_tokens(tokens)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<III", STATE_SEQ_MAGIC, STATE_SEQ_VERSION, len(words)))
        f.write(words.astype("<i4").tobytes())
        f.write(KV_MAGIC + struct.pack("<II", KV_VERSION, len(meta)) + meta)
        for a in (*k, *v):
            f.write(np.ascontiguousarray(a).tobytes())
        n = f.tell()
    os.replace(tmp, path)  # a failed save leaves no half-written file under the name
    return n


def read_file(path: str, kv) -> tuple[list[int], list[np.ndarray], list[np.ndarray], int]:
    """(tokens, keys, values, bytes read) of a slot file written for a cache shaped like kv."""
    with open(path, "rb") as f:
        data = f.read()
    bad = SlotFileError("No available space in KV cache or invalid slot save file")
    if len(data) < 12:
        raise bad
    magic, version, n_words = struct.unpack_from("<III", data, 0)
    if magic != STATE_SEQ_MAGIC or version != STATE_SEQ_VERSION or 12 + 4 * n_words > len(data):
        raise bad
    tokens = unpack_tokens(np.frombuffer(data, "<i4", n_words, 12))
    at = 12 + 4 * n_words
    if data[at : at + 4] != KV_MAGIC or len(data) < at + 12:
        raise bad
    kv_version, n_meta = struct.unpack_from("<II", data, at + 4)
    try:
        meta = json.loads(data[at + 12 : at + 12 + n_meta])
        n_pos = int(meta.pop("n_pos"))
    except (ValueError, KeyError, TypeError):
        raise bad from None
    if kv_version != KV_VERSION or meta != _cache_meta(kv):
        raise SlotFileError("the slot file was saved from another model or KV cache type")
    if n_pos != len(tokens):
        raise bad
    at += 12 + n_meta
    arrays = []
    for il in range(2 * len(kv.k)):
        ref = kv.k[il] if il < len(kv.k) else kv.v[il - len(kv.k)]
        count = n_pos * int(np.prod(ref.shape[2:]))
        if at + count * ref.itemsize > len(data):
            raise bad
        arrays.append(np.frombuffer(data, ref.dtype, count, at).reshape(n_pos, *ref.shape[2:]))
        at += count * ref.itemsize
    return tokens, arrays[: len(kv.k)], arrays[len(kv.k) :], at


def _slot(scheduler: Scheduler, slot_id: int):
    if not 0 <= slot_id < scheduler.n_slots:
        raise InvalidRequestError("Invalid slot ID")
    return scheduler.slots[slot_id]


def save(scheduler: Scheduler, slot_id: int, path: str) -> dict[str, Any]:
    """On the scheduler's thread: write the slot; llama-server's reply fields."""
    t0 = time.perf_counter()
    slot = _slot(scheduler, slot_id)
    tokens = list(slot.cache_tokens)
    try:
        n = write_file(path, tokens, scheduler.ctx.kv, slot.id)
    except OSError as e:
        raise EngineError(f"Unable to save slot: {e.strerror or e}") from None
    return {"n_saved": len(tokens), "n_written": n, "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}}


def restore(scheduler: Scheduler, slot_id: int, path: str) -> dict[str, Any]:
    """On the scheduler's thread: the file's tokens and cache become the slot's. A failed
    restore leaves the slot empty, as llama-server's does."""
    t0 = time.perf_counter()
    slot = _slot(scheduler, slot_id)
    kv: Any = scheduler.ctx.kv  # the engine's KVCache: slot files need its whole-sequence state
    try:
        tokens, k, v, n_read = read_file(path, kv)
        if len(tokens) > scheduler.n_ctx_seq:
            raise SlotFileError("Restored prompt does not fit in the slot context")
        n_vocab = scheduler.ctx.n_vocab
        if any(not 0 <= t < n_vocab for t in tokens):
            raise SlotFileError("Invalid tokens in slot save file")
        kv.set_seq_state(slot.id, k, v)
    except (OSError, EngineError) as e:
        kv.seq_clear(slot.id)
        slot.cache_tokens = []
        # llama-server cannot tell a missing file from a bad one either
        reason = "No available space in KV cache or invalid slot save file" if isinstance(e, OSError) else str(e)
        raise SlotFileError(f"Unable to restore slot: {reason}") from None
    slot.cache_tokens = tokens
    return {"n_restored": len(tokens), "n_read": n_read,
            "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}}


def erase(scheduler: Scheduler, slot_id: int) -> dict[str, Any]:
    """On the scheduler's thread: forget the slot's cache."""
    slot = _slot(scheduler, slot_id)
    n = len(slot.cache_tokens)
    scheduler.ctx.kv.seq_clear(slot.id)
    slot.cache_tokens = []
    return {"n_erased": n}
