"""SentencePiece-style tokenizer (tokenizer.ggml.model = "llama": Llama 2, Mistral, Gemma, TinyLlama).

llama.cpp's llm_tokenizer_spm_session: spaces become '▁' (after an optional leading space,
add_space_prefix), the text is split into UTF-8 characters, and adjacent pairs whose
concatenation is in the vocabulary are merged highest score first (leftmost on ties) until none
is left. Symbols that are not tokens fall back to byte tokens <0xXX>.

Speed-up that keeps the result exact: a merge can only join the characters around a position
if some vocabulary entry contains both of them side by side. Before a '▁' whose left neighbour c
never precedes '▁' inside any token, no merge can ever cross, so the text is cut there and each
piece (about one word) is merged on its own and cached.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

import numpy as np
import regex

from .base import TokenAttr, Tokenizer, to_bytes

if TYPE_CHECKING:
    from .kernels import ByteTable

SPACE = "\u2581"  # ▁
LONG_PIECE = 256  # characters; longer pieces go to the numba merge
BATCH_CHARS = 1_000_000  # new (uncached) characters in one encode above which numba merges them all


def _utf8_units(data: bytes) -> list[bytes]:
    """Split like llama.cpp: the lead byte alone decides the length (1, 2, 3 or 4)."""
    units = []
    i, n = 0, len(data)
    while i < n:
        hi = data[i] >> 4
        step = 4 if hi == 0xF else 3 if hi == 0xE else 2 if hi >= 0xC else 1
        units.append(data[i : i + step])
        i += step
    return units


class SPMTokenizer(Tokenizer):
    kind = "llama"

    _CACHE_LIMIT = 200_000

    def __init__(self, meta: Any):
        super().__init__(
            meta,
            default_bos=1,
            default_eos=2,
            default_unk=0,
            add_space_prefix=True,
            add_bos=True,
            add_eos=False,
            clean_spaces=False,
        )
        self.pre = self.pre or "default"
        self._bytes_vocab: dict[bytes, int] | None = None
        self._byte_ids = [self._byte_token(b) for b in range(256)]
        before_space = {
            t[i - 1]
            for t in self.tokens
            if SPACE in t[1:]
            for i in range(1, len(t))
            if t[i] == SPACE
        }
        if before_space:
            cls = "".join(regex.escape(c, special_only=False) for c in sorted(before_space))
            self._cuts = regex.compile(f"(?<![{cls}])(?={SPACE})")
        else:
            self._cuts = regex.compile(f"(?={SPACE})")
        self._cache: dict[str, tuple[int, ...]] = {}
        # (vocab, score priorities, byte ids) for kernels.merge_spm_many, built on first use
        self._kernel_tables: tuple[ByteTable, np.ndarray, np.ndarray] | None = None

    def _byte_token(self, b: int) -> int | None:
        tid = self.token_to_id.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = self.token_to_id.get(chr(b))
        return tid if tid is not None else self.unk_id

    # --- encode -------------------------------------------------------------------------------
    def _encode_items(self, items: list, out: list[int]) -> None:
        # Split every valid fragment at the safe cut points first, so that all words not yet in
        # the cache can be merged in one numba call when there are many of them.
        cache = self._cache
        if len(cache) > self._CACHE_LIMIT:
            cache.clear()
        plan: list = []
        new: set[str] = set()
        for item in items:
            if isinstance(item, int):
                plan.append(item)
                continue
            text, after_special = item
            if self.add_space_prefix and after_special:
                text = " " + text
            text = text.replace(" ", SPACE)
            if text.isascii() or _is_valid(text):
                pieces = self._cuts.split(text)
                new.update(p for p in pieces if p not in cache)
                plan.append(pieces)
            else:
                plan.append(to_bytes(text))
        merged = self._merge_new(new)
        for step in plan:
            if isinstance(step, int):
                out.append(step)
            elif isinstance(step, list):
                for p in step:
                    ids = cache.get(p)
                    out.extend(ids if ids is not None else merged[p])
            elif len(step) > LONG_PIECE:  # invalid UTF-8: llama.cpp's byte units
                out.extend(self._merge_many([step])[0])
            else:
                if self._bytes_vocab is None:
                    self._bytes_vocab = {
                        t.encode("utf-8", "surrogatepass"): i for i, t in enumerate(self.tokens)
                    }
                self._merge(_utf8_units(step), self._bytes_vocab, out)

    def _merge_new(self, new: set[str]) -> dict[str, list[int]]:
        """Merge the words not in the cache (numba for many or long ones), caching short ones."""
        if sum(map(len, new)) > BATCH_CHARS:
            words = list(new)
            merged = dict(
                zip(words, self._merge_many([w.encode("utf-8") for w in words]), strict=True)
            )
        else:
            merged = {}
            for w in new:
                if len(w) > LONG_PIECE:
                    merged[w] = self._merge_many([w.encode("utf-8")])[0]
                else:
                    ids: list[int] = []
                    self._merge(list(w), self.token_to_id, ids)
                    merged[w] = ids
        for w, ids in merged.items():
            if len(w) <= LONG_PIECE:
                self._cache[w] = tuple(ids)
        return merged

    def _encode_fragment(self, text: str, after_special: bool, out: list[int]) -> None:
        self._encode_items([(text, after_special)], out)

    def _merge_long(self, data: bytes) -> list[int]:
        return self._merge_many([data])[0]

    def _merge_many(self, pieces: list[bytes]) -> list[list[int]]:
        """The same merge in numba (kernels.py), each piece on its own: for pieces too long for
        the Python loop, or for many new words at once."""
        from . import kernels

        if self._kernel_tables is None:
            vocab = kernels.ByteTable([t.encode("utf-8", "surrogatepass") for t in self.tokens])
            byte_ids = np.array([-1 if t is None else t for t in self._byte_ids], dtype=np.int64)
            self._kernel_tables = (vocab, kernels.score_priority(self.scores), byte_ids)
        return kernels.merge_spm_many(pieces, *self._kernel_tables)

    def _merge(self, sym: list, vocab: dict, out: list[int]) -> None:
        n = len(sym)
        if n == 0:
            return
        scores = self.scores
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(n - 1):
            text = sym[i] + sym[i + 1]
            tid = vocab.get(text)
            if tid is not None:
                heap.append((-scores[tid], i, i + 1, len(text)))
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, left, right, size = pop(heap)
            ls, rs = sym[left], sym[right]
            if not ls or not rs or len(ls) + len(rs) != size:
                continue
            text = ls + rs
            sym[left] = text
            sym[right] = sym[right][:0]
            nr = nxt[right]
            nxt[left] = nr
            if nr >= 0:
                prv[nr] = left
            pl = prv[left]
            if pl >= 0:
                t2 = sym[pl] + text
                tid = vocab.get(t2)
                if tid is not None:
                    push(heap, (-scores[tid], pl, left, len(t2)))
            if nr >= 0:
                t2 = text + sym[nr]
                tid = vocab.get(t2)
                if tid is not None:
                    push(heap, (-scores[tid], left, nr, len(t2)))
        byte_ids = self._byte_ids
        i = 0
        while i != -1:
            s = sym[i]
            tid = vocab.get(s)
            if tid is not None:
                out.append(tid)
            else:
                data = s if isinstance(s, bytes) else s.encode("utf-8", "surrogatepass")
                out.extend(t for t in (byte_ids[b] for b in data) if t is not None)
            i = nxt[i]

    # --- decode -------------------------------------------------------------------------------
    def _piece(self, token_id: int) -> bytes:
        attr = self.attrs[token_id]
        text = self.tokens[token_id]
        if attr & (TokenAttr.UNKNOWN | TokenAttr.CONTROL | TokenAttr.USER_DEFINED):
            return text.encode("utf-8", "surrogatepass")
        if attr & TokenAttr.NORMAL:
            return text.replace(SPACE, " ").encode("utf-8", "surrogatepass")
        if attr & TokenAttr.BYTE:
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                return b""
        return b""


def _is_valid(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False
