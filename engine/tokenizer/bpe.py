"""Byte-level BPE (tokenizer.ggml.model = "gpt2"): pre-tokenizer regexes per tokenizer.ggml.pre,
GPT-2 byte-to-unicode mapping, and rank-ordered merges as in llama.cpp's llm_tokenizer_bpe_session.

The pre-tokenizer applies its regexes one after another, each splitting the pieces the previous
one produced (matches and the text between them both stay), like llama.cpp's unicode_regex_split.
llama.cpp's own Unicode tables come from the `regex` module, so \\p{L}, \\p{N} and \\s mean the same
here. Words are merged once and cached.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

import regex

from ..errors import TokenizerError
from ..metadata import meta_array, meta_str
from .base import K, Tokenizer, llama_codepoints

if TYPE_CHECKING:
    from .kernels import ByteTable

# --- pre-tokenizer regexes (llama.cpp llm_tokenizer_bpe) ---------------------------------------
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
_DEEPSEEK_LLM = [
    r"[\r\n]",
    (  # \u escapes: several of these letters change under NFC
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-"
        "\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
        "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
        "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b"
        "\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb"
        "\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
        "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4"
        "\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
        "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
        "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
    ),
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+\Z",  # std::regex '$' (no multiline): end of the piece only
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}+",
]
_DEEPSEEK_CODER = [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"]
_DEEPSEEK3 = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
]
_FALCON = [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"]
_STARCODER = [r"\p{N}", _GPT2]
_BLOOM = [r" ?[^(\s|.,!?…。，、।۔،)]+"]
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+"
           r"((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]

# name -> (regexes, clean_spaces, ignore_merges, add_bos default)
_PRE: dict[str, tuple[list[str], bool, bool, bool]] = {}


def _register(names: str, exprs: list[str], clean_spaces: bool = True, ignore_merges: bool = False,
              add_bos: bool = False) -> None:
    for name in names.split():
        _PRE[name] = (exprs, clean_spaces, ignore_merges, add_bos)


_register("default", _DEFAULT)
_register("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2", [_LLAMA3],
          ignore_merges=True, add_bos=True)
_register("dbrx smaug-bpe chatglm-bpe glm4", [_LLAMA3])
_register("deepseek-llm", _DEEPSEEK_LLM, clean_spaces=False)
_register("deepseek-coder", _DEEPSEEK_CODER, clean_spaces=False)
_register("deepseek-v3", _DEEPSEEK3, clean_spaces=False)
_register("falcon", _FALCON)
_register("starcoder refact codeshell exaone minerva-7b", _STARCODER)
_register("command-r smollm", _STARCODER, clean_spaces=False)
_register("gpt2 gpt-2 phi-2 jina-es jina-de gigachat jina-v1-en jina-v2-es jina-v2-de jina-v2-code roberta-bpe "
          "mpt olmo jais trillion granite-docling a.x-4.0 mellum modern-bert", [_GPT2])
_register("stablelm2", [_QWEN2])
_register("qwen2 deepseek-r1-qwen kormo megrez hunyuan", [_QWEN2], clean_spaces=False)
_register("poro-chat", _BLOOM, clean_spaces=False)
_register("viking", _BLOOM + [r"\p{N}"], clean_spaces=False)
_register("bloom gpt3-finnish", _BLOOM)
_register("tekken", [_TEKKEN], clean_spaces=False, ignore_merges=True, add_bos=True)

PRE_TOKENIZERS: tuple[str, ...] = tuple(sorted(_PRE))


def pre_tokenizer_regexes(pre: str) -> list[regex.Pattern]:
    """The compiled regexes for tokenizer.ggml.pre = `pre` (TokenizerError if unknown)."""
    if pre not in _PRE:
        raise TokenizerError(f"unknown pre-tokenizer type: '{pre}' (known: {', '.join(PRE_TOKENIZERS)})")
    return [regex.compile(e) for e in _PRE[pre][0]]


def split_words(text: str, patterns: list[regex.Pattern]) -> list[str]:
    """unicode_regex_split: each regex splits every current piece into matches and gaps."""
    spans = [(0, len(text))]
    for pat in patterns:
        new = []
        for start, end in spans:
            pos = start
            for m in pat.finditer(text, start, end):
                ms, me = m.span()
                if ms > pos:
                    new.append((pos, ms))
                if me > ms:
                    new.append((ms, me))
                pos = me
            if pos < end:
                new.append((pos, end))
        spans = new
    return [text[s:e] for s, e in spans]


def _bytes_to_unicode() -> list[str]:
    """GPT-2's printable stand-in character for every byte."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = [""] * 256
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_UNICODE = _bytes_to_unicode()
UNICODE_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}
LONG_WORD = 256  # characters; longer words go to the numba merge
_LATIN1_TO_BYTE_LEVEL = {b: c for b, c in enumerate(BYTE_TO_UNICODE)}  # str.translate table


class BPETokenizer(Tokenizer):
    kind = "gpt2"

    _CACHE_LIMIT = 200_000

    def __init__(self, meta: Any):
        pre = meta_str(meta, K.PRE, None) or "default"
        if pre not in _PRE:
            raise TokenizerError(f"unknown pre-tokenizer type: '{pre}' (known: {', '.join(PRE_TOKENIZERS)})")
        _, clean_spaces, ignore_merges, add_bos = _PRE[pre]
        super().__init__(meta, default_bos=11, default_eos=11, default_unk=None, add_space_prefix=False,
                         add_bos=add_bos, add_eos=False, clean_spaces=clean_spaces)
        self.pre = pre
        self.ignore_merges = ignore_merges
        self._patterns = pre_tokenizer_regexes(pre)
        merges = meta_array(meta, K.MERGES, None, "string")
        if merges is None:
            raise TokenizerError(f"BPE tokenizer without '{K.MERGES}'")
        # "left right" -> rank; the first occurrence wins, as with std::map::emplace
        ranks: dict[str, int] = {}
        for i, m in enumerate(merges):
            if m.find(" ", 1) > 0:
                ranks.setdefault(m, i)
        self.ranks = ranks
        self._cache: dict[str, tuple[int, ...]] = {}
        self._kernel_tables: tuple[ByteTable, ByteTable] | None = None  # (vocab, merges) for kernels.merge_bpe

    # --- encode -------------------------------------------------------------------------------
    def _encode_fragment(self, text: str, after_special: bool, out: list[int]) -> None:
        cache = self._cache
        if len(cache) > self._CACHE_LIMIT:
            cache.clear()
        for word in split_words(llama_codepoints(text), self._patterns):
            ids = cache.get(word)
            if ids is None:
                ids = cache[word] = self._bpe_word(word)
            out.extend(ids)

    def _bpe_word(self, word: str) -> tuple[int, ...]:
        chars = word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_BYTE_LEVEL)
        vocab = self.token_to_id
        if self.ignore_merges and chars in vocab:
            return (vocab[chars],)
        if len(chars) > LONG_WORD:
            return tuple(self._merge_long(chars))
        syms = self._merge(list(chars))
        ids = []
        for s in syms:
            tid = vocab.get(s)
            if tid is not None:
                ids.append(tid)
                continue
            for b in s.encode("utf-8"):  # llama.cpp tries every byte on its own
                tid = vocab.get(chr(b)) if b < 0x80 else None
                if tid is not None:
                    ids.append(tid)
        return tuple(ids)

    def _merge(self, sym: list[str]) -> list[str]:
        """Lowest rank first, leftmost on ties, stale pairs skipped (llm_tokenizer_bpe_session)."""
        n = len(sym)
        if n < 2:
            return sym
        ranks = self.ranks
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(n - 1):
            text = sym[i] + " " + sym[i + 1]
            r = ranks.get(text)
            if r is not None:
                heap.append((r, i, i + 1, sym[i] + sym[i + 1]))
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, left, right, text = pop(heap)
            ls, rs = sym[left], sym[right]
            if not ls or not rs or ls + rs != text:
                continue
            sym[left] = text
            sym[right] = ""
            nr = nxt[right]
            nxt[left] = nr
            if nr >= 0:
                prv[nr] = left
            pl = prv[left]
            if pl >= 0:
                r = ranks.get(sym[pl] + " " + text)
                if r is not None:
                    push(heap, (r, pl, left, sym[pl] + text))
            if nr >= 0:
                r = ranks.get(text + " " + sym[nr])
                if r is not None:
                    push(heap, (r, left, nr, text + sym[nr]))
        return [s for s in sym if s]

    def _merge_long(self, chars: str) -> list[int]:
        """The same merge in numba (kernels.py), for words too long for the Python loop."""
        from . import kernels

        if self._kernel_tables is None:
            vocab = kernels.ByteTable([t.encode("utf-8", "surrogatepass") for t in self.tokens])
            merges = [""] * (max(self.ranks.values()) + 1) if self.ranks else []
            for m, r in self.ranks.items():
                merges[r] = m
            self._kernel_tables = (vocab, kernels.ByteTable([m.encode("utf-8", "surrogatepass") for m in merges]))
        return kernels.merge_bpe(chars.encode("utf-8"), *self._kernel_tables)

    # --- decode -------------------------------------------------------------------------------
    def _piece(self, token_id: int) -> bytes:
        from .base import TokenAttr

        attr = self.attrs[token_id]
        text = self.tokens[token_id]
        if attr & (TokenAttr.UNKNOWN | TokenAttr.CONTROL | TokenAttr.USER_DEFINED):
            return text.encode("utf-8", "surrogatepass")
        if attr & TokenAttr.NORMAL:
            return _decode_byte_level(text)
        if attr & TokenAttr.BYTE and len(text) == 6 and text.startswith("<0x"):
            return bytes([int(text[3:5], 16)])
        return b""


def _decode_byte_level(text: str) -> bytes:
    """llama_decode_text: byte-level characters back to bytes; unknown ones spelled out."""
    try:
        return bytes(UNICODE_TO_BYTE[c] for c in text)
    except KeyError:
        pass
    out = bytearray()
    for c in text:
        b = UNICODE_TO_BYTE.get(c)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + c.encode("utf-8", "surrogatepass").hex().encode() + text.encode(
                "utf-8", "surrogatepass") + b"]"
    return bytes(out)
