"""numba versions of the SPM and BPE merge loops, for long stretches of text without cut points.

Same algorithms as spm.SPMTokenizer._merge and bpe.BPETokenizer._merge (llama.cpp's), on bytes:
symbols are byte spans of the text; a pair is looked up by hashing its bytes in an
open-addressing table built from the vocabulary (or from the BPE merges). The Python versions
serve ordinary words; these take over when one piece is thousands of characters long (a run of
one character, minified code, base64), where a Python heap loop would take minutes.
"""

from __future__ import annotations

import numpy as np

from ..jit import kernel

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


class ByteTable:
    """An immutable set of byte strings -> their index, as numpy arrays usable from numba."""

    def __init__(self, keys: list[bytes]):
        lengths = np.fromiter((len(k) for k in keys), dtype=np.int64, count=len(keys))
        self.offsets = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.data = (
            np.frombuffer(b"".join(keys), dtype=np.uint8).copy() if keys else np.zeros(0, np.uint8)
        )
        size = 1
        while size < 2 * max(len(keys), 1):
            size *= 2
        self.slots = np.full(size, -1, dtype=np.int32)
        _build(self.data, self.offsets, self.slots)


@kernel
def _hash_span(a, s, e, h):
    for i in range(s, e):
        h = (h ^ np.uint64(a[i])) * _FNV_PRIME
    return h


@kernel
def _slot(h, mask):
    """Mix the FNV hash (its low bits alone are weak) and reduce it to a slot index."""
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return np.int64(h & np.uint64(mask))


@kernel
def _build(data, offsets, slots):
    mask = slots.shape[0] - 1
    for k in range(offsets.shape[0] - 1):
        h = _hash_span(data, offsets[k], offsets[k + 1], _FNV_OFFSET)
        j = _slot(h, mask)
        while True:
            cur = slots[j]
            if cur < 0:
                slots[j] = k
                break
            if _same(data, offsets[cur], offsets[cur + 1], data, offsets[k], offsets[k + 1]):
                break  # duplicate: the first one wins
            j = (j + 1) & mask


@kernel
def _same(a, s, e, b, t, u):
    if e - s != u - t:
        return False
    for i in range(e - s):
        if a[s + i] != b[t + i]:
            return False
    return True


@kernel
def _find(text, s, e, data, offsets, slots):
    """Index of text[s:e] in the table, or -1."""
    mask = slots.shape[0] - 1
    h = _hash_span(text, s, e, _FNV_OFFSET)
    j = _slot(h, mask)
    while True:
        k = slots[j]
        if k < 0:
            return -1
        if _same(data, offsets[k], offsets[k + 1], text, s, e):
            return k
        j = (j + 1) & mask


@kernel
def _find_pair(text, s, m, e, data, offsets, slots):
    """Index of text[s:m] + b" " + text[m:e] in the table (the BPE merge "left right"), or -1."""
    mask = slots.shape[0] - 1
    h = _hash_span(text, s, m, _FNV_OFFSET)
    h = (h ^ np.uint64(32)) * _FNV_PRIME
    h = _hash_span(text, m, e, h)
    j = _slot(h, mask)
    n = e - s + 1
    while True:
        k = slots[j]
        if k < 0:
            return -1
        ks = offsets[k]
        if offsets[k + 1] - ks == n and data[ks + m - s] == 32:
            ok = True
            for i in range(m - s):
                if data[ks + i] != text[s + i]:
                    ok = False
                    break
            if ok:
                for i in range(e - m):
                    if data[ks + m - s + 1 + i] != text[m + i]:
                        ok = False
                        break
            if ok:
                return k
        j = (j + 1) & mask


@kernel
def _utf8_split_segments(text, seg_starts, start, length):
    """llama.cpp's unicode_len_utf8 split of each segment: returns the number of symbols."""
    count = 0
    for g in range(seg_starts.shape[0]):
        i = seg_starts[g]
        n = seg_starts[g + 1] if g + 1 < seg_starts.shape[0] else text.shape[0]
        while i < n:
            hi = text[i] >> 4
            step = 4 if hi == 0xF else 3 if hi == 0xE else 2 if hi >= 0xC else 1
            if i + step > n:
                step = n - i
            start[count] = i
            length[count] = step
            count += 1
            i += step
    return count


# A binary min-heap of uint64 keys (priority << 32 | left index: llama.cpp's order, ties to the
# leftmost pair) with an entry index alongside; entries hold (right, size) and are append-only.
@kernel
def _push(hk, he, n, key, entry):
    i = n
    while i > 0:
        p = (i - 1) >> 1
        if key < hk[p]:
            hk[i] = hk[p]
            he[i] = he[p]
            i = p
        else:
            break
    hk[i] = key
    he[i] = entry
    return n + 1


@kernel
def _pop(hk, he, n):
    """Removes the smallest key; returns (its entry, left index, new size)."""
    entry = he[0]
    left = np.int64(hk[0] & np.uint64(0xFFFFFFFF))
    n -= 1
    key = hk[n]
    e = he[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and hk[c + 1] < hk[c]:
            c += 1
        if hk[c] < key:
            hk[i] = hk[c]
            he[i] = he[c]
            i = c
        else:
            break
    if n > 0:
        hk[i] = key
        he[i] = e
    return entry, left, n


@kernel
def _pair(
    text,
    start,
    length,
    a,
    b,
    is_bpe,
    vocab_data,
    vocab_off,
    vocab_slots,
    pair_data,
    pair_off,
    pair_slots,
):
    """Priority index of merging symbols a and b (SPM: vocab id; BPE: merge rank), or -1."""
    s = start[a]
    e = start[b] + length[b]
    if is_bpe:
        return _find_pair(text, s, start[b], e, pair_data, pair_off, pair_slots)
    return _find(text, s, e, vocab_data, vocab_off, vocab_slots)


@kernel
def _offer(
    text,
    start,
    length,
    a,
    b,
    is_bpe,
    vocab_data,
    vocab_off,
    vocab_slots,
    pair_data,
    pair_off,
    pair_slots,
    prio,
    er,
    es,
    hk,
    he,
    h,
    m,
):
    """Queue the merge of adjacent symbols a, b when the vocabulary has it; returns (h, m)."""
    k = _pair(
        text,
        start,
        length,
        a,
        b,
        is_bpe,
        vocab_data,
        vocab_off,
        vocab_slots,
        pair_data,
        pair_off,
        pair_slots,
    )
    if k >= 0:
        er[m] = b
        es[m] = length[a] + length[b]
        h = _push(hk, he, h, (prio[k] << np.uint64(32)) | np.uint64(a), m)
        m += 1
    return h, m


@kernel
def _merge(
    text,
    seg_starts,
    is_bpe,
    vocab_data,
    vocab_off,
    vocab_slots,
    pair_data,
    pair_off,
    pair_slots,
    prio,
):
    """Shared merge loop over independent segments of `text` (byte offsets `seg_starts`, the
    first 0): no pair crosses a segment start. `prio[k]` orders pair k (smaller first): SPM, the
    score, descending; BPE, the merge rank. Returns the final symbols as (start, length) arrays
    and, per segment, the end of its symbols in them."""
    n_bytes = text.shape[0]
    start = np.empty(n_bytes, np.int64)
    length = np.empty(n_bytes, np.int64)
    n = _utf8_split_segments(text, seg_starts, start, length)
    nxt = np.empty(n, np.int64)
    prv = np.empty(n, np.int64)
    seg = 0
    n_seg = seg_starts.shape[0]
    first = np.zeros(n, np.bool_)
    for i in range(n):
        nxt[i] = i + 1
        prv[i] = i - 1
        while seg < n_seg and seg_starts[seg] <= start[i]:
            if seg_starts[seg] == start[i]:
                first[i] = True
            seg += 1
        if first[i]:
            prv[i] = -1
            if i > 0:
                nxt[i - 1] = -1
    if n > 0:
        nxt[n - 1] = -1
    cap = 3 * n + 3
    hk = np.empty(cap, np.uint64)
    he = np.empty(cap, np.int64)
    er = np.empty(cap, np.int64)
    es = np.empty(cap, np.int64)
    h = 0
    m = 0
    for i in range(n - 1):
        if nxt[i] < 0:
            continue
        h, m = _offer(
            text,
            start,
            length,
            i,
            i + 1,
            is_bpe,
            vocab_data,
            vocab_off,
            vocab_slots,
            pair_data,
            pair_off,
            pair_slots,
            prio,
            er,
            es,
            hk,
            he,
            h,
            m,
        )
    while h > 0:
        entry, left, h = _pop(hk, he, h)
        right = er[entry]
        if length[left] == 0 or length[right] == 0 or length[left] + length[right] != es[entry]:
            continue
        length[left] += length[right]
        length[right] = 0
        nr = nxt[right]
        nxt[left] = nr
        if nr >= 0:
            prv[nr] = left
        pl = prv[left]
        if pl >= 0:
            h, m = _offer(
                text,
                start,
                length,
                pl,
                left,
                is_bpe,
                vocab_data,
                vocab_off,
                vocab_slots,
                pair_data,
                pair_off,
                pair_slots,
                prio,
                er,
                es,
                hk,
                he,
                h,
                m,
            )
        if nr >= 0:
            h, m = _offer(
                text,
                start,
                length,
                left,
                nr,
                is_bpe,
                vocab_data,
                vocab_off,
                vocab_slots,
                pair_data,
                pair_off,
                pair_slots,
                prio,
                er,
                es,
                hk,
                he,
                h,
                m,
            )
    out_s = np.empty(n, np.int64)
    out_n = np.empty(n, np.int64)
    seg_end = np.zeros(n_seg, np.int64)
    c = 0
    seg = -1
    for j in range(n):
        if not first[j]:
            continue
        seg += 1
        i = j
        while i != -1:
            out_s[c] = start[i]
            out_n[c] = length[i]
            c += 1
            i = nxt[i]
        seg_end[seg] = c
    for k in range(max(seg, 0) + 1, n_seg):  # empty segments (none in practice)
        seg_end[k] = c
    return out_s[:c], out_n[:c], seg_end


@kernel
def _ids(text, sym_s, sym_n, vocab_data, vocab_off, vocab_slots, byte_ids, is_bpe):
    """Token ids of the final symbols: the token itself, else one token per byte (SPM: <0xXX>;
    BPE: the byte alone if it is a token, as llama.cpp does)."""
    out = np.empty(text.shape[0] + 1, np.int64)
    ends = np.empty(sym_s.shape[0], np.int64)
    m = 0
    for j in range(sym_s.shape[0]):
        s = sym_s[j]
        e = s + sym_n[j]
        k = _find(text, s, e, vocab_data, vocab_off, vocab_slots)
        if k >= 0:
            out[m] = k
            m += 1
            ends[j] = m
            continue
        for i in range(s, e):
            if is_bpe:
                t = _find(text, i, i + 1, vocab_data, vocab_off, vocab_slots)
            else:
                t = byte_ids[text[i]]
            if t >= 0:
                out[m] = t
                m += 1
        ends[j] = m
    return out[:m], ends


def score_priority(scores) -> np.ndarray:
    """uint32 keys (as uint64) that sort float32 scores from highest to lowest."""
    bits = (
        (0.0 - np.asarray(scores, dtype=np.float32))
        .astype(np.float32)
        .view(np.uint32)
        .astype(np.uint64)
    )
    neg = (bits & np.uint64(0x80000000)) != 0
    return np.where(neg, ~bits & np.uint64(0xFFFFFFFF), bits | np.uint64(0x80000000))


def merge_spm(data: bytes, vocab: ByteTable, prio: np.ndarray, byte_ids: np.ndarray) -> list[int]:
    """SPM merge of `data` (spaces already '▁'); `prio` from score_priority(scores)."""
    return merge_spm_many([data], vocab, prio, byte_ids)[0]


def merge_spm_many(
    pieces: list[bytes], vocab: ByteTable, prio: np.ndarray, byte_ids: np.ndarray
) -> list[list[int]]:
    """Several independent SPM merges in one call (each piece as if merged alone)."""
    return _merge_many(pieces, False, vocab, vocab, prio, byte_ids)


def merge_bpe(data: bytes, vocab: ByteTable, merges: ByteTable) -> list[int]:
    prio = np.arange(len(merges.offsets) - 1, dtype=np.uint64)
    return _merge_many([data], True, vocab, merges, prio, np.zeros(256, np.int64))[0]


def _merge_many(pieces, is_bpe, vocab, pairs, prio, byte_ids) -> list[list[int]]:
    if not all(pieces):  # segments must not be empty
        full = [p for p in pieces if p]
        done = iter(_merge_many(full, is_bpe, vocab, pairs, prio, byte_ids) if full else [])
        return [next(done) if p else [] for p in pieces]
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    seg_starts = np.zeros(len(pieces), np.int64)
    np.cumsum(lengths[:-1], out=seg_starts[1:])
    text = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    s, n, seg_end = _merge(
        text,
        seg_starts,
        is_bpe,
        vocab.data,
        vocab.offsets,
        vocab.slots,
        pairs.data,
        pairs.offsets,
        pairs.slots,
        prio,
    )
    ids, ends = _ids(text, s, n, vocab.data, vocab.offsets, vocab.slots, byte_ids, is_bpe)
    ids = ids.tolist()
    out = []
    sym0 = 0
    for sym1 in seg_end.tolist():
        a = ends[sym0 - 1] if sym0 > 0 else 0
        b = ends[sym1 - 1] if sym1 > 0 else 0
        out.append(ids[a:b])
        sym0 = sym1
    return out
