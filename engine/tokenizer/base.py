"""Tokenizer base: the vocabulary from GGUF metadata and everything shared by BPE and SPM.

Follows llama.cpp's llama-vocab.cpp: token attributes from `tokenizer.ggml.token_type`, special
ids and add_bos/add_eos flags with the same defaults and overrides, end-of-generation tokens found
by their text, special-token partitioning (tokenizer_st_partition) before the model-specific
algorithm runs on the plain-text fragments, and llama_detokenize for decode.

Text is handled as `str`; bytes that are not valid UTF-8 travel as lone surrogates U+DC80..U+DCFF
(Python's "surrogateescape"), so `encode(b"...")` and `encode(bytes.decode(errors="surrogateescape"))`
give the ids llama.cpp gives for those bytes. Other lone surrogates count as U+FFFD.
"""

from __future__ import annotations

import codecs
import functools
import logging
from collections.abc import Iterable
from typing import Any

from gguf import Keys

from ..errors import TokenizerError
from ..metadata import meta_array, meta_bool, meta_int, meta_str

log = logging.getLogger(__name__)

K = Keys.Tokenizer


class TokenAttr:
    """llama_token_attr: what a token is, as bit flags (plain ints: enum.IntFlag is too slow for
    262k-token vocabularies)."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# tokenizer.ggml.token_type values (gguf TokenType) -> attributes
_TYPE_TO_ATTR = {
    1: TokenAttr.NORMAL,
    2: TokenAttr.UNKNOWN,
    3: TokenAttr.CONTROL,
    4: TokenAttr.USER_DEFINED,
    5: TokenAttr.UNUSED,
    6: TokenAttr.BYTE,
}
_SPECIAL_ATTRS = TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN
_HIDDEN_ATTRS = TokenAttr.CONTROL | TokenAttr.UNKNOWN  # not rendered unless special=True

# auto-detected by text, as llama.cpp does (in this order of preference for the single EOT id)
EOT_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
)
EOM_TEXTS = ("<|eom_id|>",)
FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
FIM_SEP_TEXTS = ("<|file_sep|>",)
EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
)
_ALWAYS_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss

_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale


# --- text <-> bytes ---------------------------------------------------------------------------
def _encode_error(exc: UnicodeError) -> tuple[bytes, int]:
    """surrogateescape for U+DC80..U+DCFF, U+FFFD's bytes for any other lone surrogate."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    out = bytearray()
    for ch in exc.object[exc.start : exc.end]:
        cp = ord(ch)
        out += bytes([cp - 0xDC00]) if 0xDC80 <= cp <= 0xDCFF else b"\xef\xbf\xbd"
    return bytes(out), exc.end


def _llama_decode_error(exc: UnicodeError) -> tuple[str, int]:
    """Decode one code point at an invalid position the way llama.cpp's unicode_cpt_from_utf8 does.

    llama.cpp trusts the lead byte: overlong forms and surrogates decode to their code points;
    a bad lead or a missing continuation byte gives U+FFFD and skips one byte.
    """
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    b, i = exc.object, exc.start
    lead = b[i]
    n = (
        1
        if lead < 0x80
        else 0
        if lead < 0xC0
        else 2
        if lead < 0xE0
        else 3
        if lead < 0xF0
        else 4
        if lead < 0xF8
        else 0
    )
    if n == 0 or i + n > len(b) or any((b[i + k] & 0xC0) != 0x80 for k in range(1, n)):
        return "\ufffd", i + 1
    cp = lead & (0xFF >> (n + 1)) if n > 1 else lead
    for k in range(1, n):
        cp = (cp << 6) | (b[i + k] & 0x3F)
    return (chr(cp) if cp <= 0x10FFFF else "\ufffd"), i + n


codecs.register_error("ggstation-escape", _encode_error)
codecs.register_error("ggstation-llama", _llama_decode_error)


def to_bytes(text: str) -> bytes:
    """The bytes llama.cpp would be given for `text` (see the module docstring)."""
    return text.encode("utf-8", "ggstation-escape")


def llama_codepoints(text: str) -> str:
    """`text` as the code points llama.cpp's unicode_cpts_from_utf8 sees (invalid bytes -> U+FFFD)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return to_bytes(text).decode("utf-8", "ggstation-llama")


def _as_text(text: str | bytes | bytearray) -> str:
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text).decode("utf-8", "surrogateescape")
    if not isinstance(text, str):
        raise TypeError(f"encode() takes str or bytes, not {type(text).__name__}")
    return text


# --- metadata ---------------------------------------------------------------------------------
# Every `tokenizer.ggml.*` value is read through the typed readers of engine/metadata.py: a value of the
# wrong type is a MetadataError naming the key, what was expected and what the file holds.
def _first_set(a: int | None, b: int | None) -> int | None:
    return a if a is not None else b


class Tokenizer:
    """A GGUF vocabulary with llama.cpp's tokenize/detokenize semantics.

    Subclasses (BPETokenizer, SPMTokenizer) implement `_encode_fragment` for plain text.
    """

    kind = ""

    def __init__(
        self,
        meta: Any,
        *,
        default_bos: int | None,
        default_eos: int | None,
        default_unk: int | None,
        add_space_prefix: bool,
        add_bos: bool,
        add_eos: bool,
        clean_spaces: bool,
    ):
        tokens = meta_array(meta, K.LIST, None, "string")
        if not tokens:
            raise TokenizerError(f"missing or empty '{K.LIST}' (the vocabulary)")
        n = len(tokens)
        scores = meta_array(meta, K.SCORES, None, "number")
        types = meta_array(meta, K.TOKEN_TYPE, None, "int")
        if scores is not None and len(scores) < n:
            raise TokenizerError(f"'{K.SCORES}' has {len(scores)} entries for {n} tokens")
        if types is not None and len(types) < n:
            raise TokenizerError(f"'{K.TOKEN_TYPE}' has {len(types)} entries for {n} tokens")

        self.pre: str = meta_str(meta, K.PRE, None) or ""
        self.tokens: list[str] = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.scores: list[float] = (
            [float(s) for s in scores[:n]] if scores is not None else [0.0] * n
        )
        if types is not None:  # types llama.cpp does not know are UNDEFINED, as there
            attrs = [_TYPE_TO_ATTR.get(int(t), TokenAttr.UNDEFINED) for t in types[:n]]
        else:
            attrs = [TokenAttr.NORMAL] * n
        self.token_to_id: dict[str, int] = {}
        for i, t in enumerate(self.tokens):
            if self.token_to_id.setdefault(t, i) != i:
                raise TokenizerError(
                    f"duplicate token in vocabulary: {t!r} has ids {self.token_to_id[t]} and {i}"
                )

        self.add_space_prefix = meta_bool(meta, K.ADD_PREFIX, add_space_prefix)
        self.clean_spaces = clean_spaces
        self.add_bos = meta_bool(meta, K.ADD_BOS, add_bos)
        self.add_eos = meta_bool(meta, K.ADD_EOS, add_eos)

        def special(key: str, default: int | None) -> int | None:
            if default is not None and not 0 <= default < n:
                default = None
            v = meta_int(meta, key, None)
            if v is None:
                return default
            if not 0 <= v < n:
                log.warning(
                    "bad special token '%s' = %d (vocab has %d), using %s", key, v, n, default
                )
                return default
            return v

        self.bos_id = special(K.BOS_ID, default_bos)
        self.eos_id = special(K.EOS_ID, default_eos)
        self.unk_id = special(K.UNK_ID, default_unk)
        self.pad_id = special(K.PAD_ID, None)
        self.sep_id = special(K.SEP_ID, None)
        self.mask_id = special(K.MASK_ID, None)
        self.eot_id = special(K.EOT_ID, None)
        self.eom_id = special(K.EOM_ID, None)
        self.fim_pre_id = _first_set(special(K.FIM_PRE_ID, None), special(K.PREFIX_ID, None))
        self.fim_suf_id = _first_set(special(K.FIM_SUF_ID, None), special(K.SUFFIX_ID, None))
        self.fim_mid_id = _first_set(special(K.FIM_MID_ID, None), special(K.MIDDLE_ID, None))
        self.fim_pad_id = special(K.FIM_PAD_ID, None)
        self.fim_rep_id = special(K.FIM_REP_ID, None)
        self.fim_sep_id = special(K.FIM_SEP_ID, None)
        if self.add_bos and self.bos_id is None:
            log.warning("add_bos is set but the model has no BOS token; not adding one")
            self.add_bos = False
        if self.add_eos and self.eos_id is None:
            self.add_eos = False

        self.attrs: list[int] = attrs
        self._find_special_by_text()
        self._set_model_specific_attrs(meta_str(meta, "general.name", None) or "")

        # special tokens for partitioning, longest (in bytes) first; ties by id (stable)
        special_ids = [i for i, a in enumerate(self.attrs) if a & _SPECIAL_ATTRS]
        special_ids.sort(key=lambda i: -len(self.tokens[i].encode("utf-8", "surrogatepass")))
        self.special_ids: tuple[int, ...] = tuple(special_ids)
        self._special_groups: tuple | None = None
        self._piece_cache: list[bytes | None] = [None] * n

    # --- vocabulary set-up --------------------------------------------------------------------
    def _make_control(self, i: int) -> None:
        if not self.attrs[i] & TokenAttr.CONTROL:
            self.attrs[i] |= TokenAttr.CONTROL

    def _first_id(self, texts: Iterable[str]) -> int | None:
        for t in texts:
            i = self.token_to_id.get(t)
            if i is not None:
                return i
        return None

    def _find_special_by_text(self) -> None:
        for name, texts in (
            ("eot_id", EOT_TEXTS),
            ("eom_id", EOM_TEXTS),
            ("fim_pad_id", FIM_PAD_TEXTS),
            ("fim_rep_id", FIM_REP_TEXTS),
            ("fim_sep_id", FIM_SEP_TEXTS),
        ):
            if getattr(self, name) is None:
                i = self._first_id(texts)
                if i is not None:
                    setattr(self, name, i)
                    self._make_control(i)
        for i, a in enumerate(self.attrs):
            if a & TokenAttr.CONTROL and not a & TokenAttr.UNUSED and "unused" in self.tokens[i]:
                self.attrs[i] = a | TokenAttr.UNUSED

        eog = {i for i in (self.fim_pad_id, self.fim_rep_id, self.fim_sep_id) if i is not None}
        for t in EOG_TEXTS:
            i = self.token_to_id.get(t)
            if i is not None:
                eog.add(i)
                self._make_control(i)
        for t in _ALWAYS_USER_DEFINED:
            i = self.token_to_id.get(t)
            if i is not None:
                self.attrs[i] = TokenAttr.USER_DEFINED
        eog.update(i for i in (self.eos_id, self.eot_id, self.eom_id) if i is not None)
        eog_ids = {self.tokens[i]: i for i in eog}  # text -> id
        # o200k_harmony / solar-open: <|end|> is not the end of generation there
        if "<|end|>" in eog_ids and (
            ("<|return|>" in eog_ids and "<|call|>" in eog_ids)
            or ("<|calls|>" in eog_ids and "<|flush|>" in eog_ids)
        ):
            eog.discard(eog_ids["<|end|>"])
            self.attrs[eog_ids["<|end|>"]] = TokenAttr.USER_DEFINED
        if "<|tool_response>" in eog_ids and "</s>" in eog_ids:  # gemma4, paddleocr
            eog.discard(eog_ids["</s>"])
            self.attrs[eog_ids["</s>"]] = TokenAttr.NORMAL
        self.eog_ids: frozenset[int] = frozenset(eog)

    def _set_model_specific_attrs(self, model_name: str) -> None:
        name = model_name.lower()
        if (
            any(s in self.pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code"))
            and "<mask>" in self.token_to_id
        ):
            self.attrs[self.token_to_id["<mask>"]] |= TokenAttr.LSTRIP
        elif "phi-3" in name or "phi3" in name:
            for i, a in enumerate(self.attrs):
                if a & _SPECIAL_ATTRS:
                    self.attrs[i] = a | TokenAttr.RSTRIP
            for t, on in (
                ("</s>", True),
                ("<unk>", False),
                ("<s>", False),
                ("<|endoftext|>", False),
            ):
                tid = self.token_to_id.get(t)
                if tid is not None:
                    self.attrs[tid] = (
                        self.attrs[tid] | TokenAttr.RSTRIP
                        if on
                        else self.attrs[tid] & ~TokenAttr.RSTRIP
                    )

    # --- public queries -----------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @property
    def vocab_type(self) -> int:
        """llama.cpp's llama_vocab_type: 1 SPM (`kind` 'llama'), 2 BPE ('gpt2')."""
        return {"llama": 1, "gpt2": 2}.get(self.kind, 0)

    def is_eog(self, token_id: int) -> bool:
        """End of generation: EOS, EOT, EOM and the tokens llama.cpp recognises by their text."""
        return token_id in self.eog_ids

    def is_control(self, token_id: int) -> bool:
        return 0 <= token_id < len(self.attrs) and bool(self.attrs[token_id] & TokenAttr.CONTROL)

    def token_attr(self, token_id: int) -> int:
        return self.attrs[token_id]

    def token_text(self, token_id: int) -> str:
        """The vocabulary entry as stored in the GGUF (e.g. '▁Hello', 'Ġworld', '<0x0A>')."""
        return self.tokens[token_id]

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(kind={self.kind!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, "
            f"bos={self.bos_id}, eos={self.eos_id}, add_bos={self.add_bos})"
        )

    # --- encode -------------------------------------------------------------------------------
    def encode(
        self, text: str | bytes, add_special: bool = True, parse_special: bool = False
    ) -> list[int]:
        """Token ids for `text`, as llama_tokenize(vocab, text, add_special, parse_special).

        add_special adds BOS/EOS where the model's metadata asks for them. parse_special turns
        control-token text (e.g. '<|im_start|>') into that token; user-defined tokens are matched
        either way, as in llama.cpp.
        """
        text = _as_text(text)
        fragments = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:  # add_bos implies a bos_id
            out.append(self.bos_id)
        items: list = []
        after_special = True
        for frag in fragments:
            if isinstance(frag, int):
                items.append(frag)
                after_special = True
            else:
                items.append((text[frag[0] : frag[1]], after_special))
                after_special = False
        self._encode_items(items, out)
        if add_special and self.add_eos and self.eos_id is not None:  # add_eos implies an eos_id
            out.append(self.eos_id)
        return out

    def _encode_items(self, items: list, out: list[int]) -> None:
        """Token ids (ints) and (text, after_special) fragments, in order."""
        for item in items:
            if isinstance(item, int):
                out.append(item)
            else:
                self._encode_fragment(item[0], item[1], out)

    def _encode_fragment(self, text: str, after_special: bool, out: list[int]) -> None:
        raise NotImplementedError

    def _special_candidates(self, text: str, parse_special: bool) -> set[int]:
        """Special tokens that occur somewhere in `text` (any position, overlaps included).

        Tokens are grouped by their first two characters; a group is only looked at when its
        head occurs. Small groups are checked with `in` (C speed, whatever the input), large
        ones (e.g. Gemma's 6000 <unusedN>) by walking a trie from each occurrence of the head.
        """
        if self._special_groups is None:
            groups: dict[str, list[int]] = {}
            for i in self.special_ids:
                groups.setdefault(self.tokens[i][:2], []).append(i)
            tries = {}
            for head, ids in groups.items():
                if len(ids) > 32:
                    trie: dict = {}
                    for i in ids:
                        node = trie
                        for ch in self.tokens[i]:
                            node = node.setdefault(ch, {})
                        node.setdefault(None, []).append(i)
                    tries[head] = trie
            self._special_groups = (groups, tries)
        groups, tries = self._special_groups
        found: set[int] = set()
        n = len(text)
        for head, ids in groups.items():
            if head not in text:
                continue
            if head not in tries:
                found.update(i for i in ids if self.tokens[i] in text)
                continue
            trie = tries[head]
            pos = text.find(head)
            while pos >= 0:
                at: dict | None = trie
                k = pos
                while at is not None:
                    hit = at.get(None)
                    if hit:
                        found.update(hit)
                    if k >= n:
                        break
                    at = at.get(text[k])
                    k += 1
                pos = text.find(head, pos + 1)
        if not parse_special:
            found = {i for i in found if not self.attrs[i] & _HIDDEN_ATTRS}
        return found

    def _partition(self, text: str, parse_special: bool) -> list:
        """tokenizer_st_partition: [(start, end) text spans and int token ids] in order.

        Special tokens are applied longest first over all remaining text, each splitting every
        text fragment at its leftmost occurrences, exactly as llama.cpp does.
        """
        fragments: list = [(0, len(text))]
        if not self.special_ids:
            return fragments
        candidates = self._special_candidates(text, parse_special)
        text_idx = [0]  # positions of the text fragments in `fragments`
        for sid in (i for i in self.special_ids if i in candidates):
            tok = self.tokens[sid]
            n_tok = len(tok)
            hits = [
                i
                for i in text_idx
                if fragments[i][1] - fragments[i][0] >= n_tok
                and text.find(tok, fragments[i][0], fragments[i][1]) >= 0
            ]
            if not hits:
                continue
            new: list = []
            prev = 0
            for i in hits:
                new.extend(fragments[prev:i])
                self._split_fragment(text, fragments[i], sid, new)
                prev = i + 1
            new.extend(fragments[prev:])
            fragments = new
            text_idx = [i for i, f in enumerate(fragments) if not isinstance(f, int)]
        return fragments

    def _split_fragment(self, text: str, frag: tuple[int, int], sid: int, out: list) -> None:
        """One fragment of llama.cpp's partition loop: split at each leftmost occurrence."""
        tok = self.tokens[sid]
        attr = self.attrs[sid]
        start, end = frag
        while True:
            match = text.find(tok, start, end)
            if match < 0:
                out.append((start, end))
                return
            left_end = match
            if attr & TokenAttr.LSTRIP:
                while left_end > start and text[left_end - 1] in _C_SPACE:
                    left_end -= 1
            if left_end > start:
                out.append((start, left_end))
            out.append(sid)
            start = match + len(tok)
            if attr & TokenAttr.RSTRIP:
                while start < end and text[start] in _C_SPACE:
                    start += 1
            if start >= end:
                return

    # --- decode -------------------------------------------------------------------------------
    def _piece(self, token_id: int) -> bytes:
        raise NotImplementedError

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The most bytes of text one token stands for (special tokens as their text), at least
        4 (an unknown character is one token): a text of N bytes has at least
        N / max_token_bytes tokens. One pass over the vocabulary, on first use."""
        return max(
            4,
            max(
                (len(self.token_to_piece(i, special=True)) for i in range(self.n_vocab)), default=0
            ),
        )

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """The bytes token `token_id` stands for (llama_token_to_piece, no lstrip).

        With special=False, control and unknown tokens give b''. Ids outside the vocabulary
        give b'' too (models may have padded output rows).
        """
        if not 0 <= token_id < len(self.tokens):
            return b""
        if not special and self.attrs[token_id] & _HIDDEN_ATTRS:
            return b""
        piece = self._piece_cache[token_id]
        if piece is None:
            piece = self._piece_cache[token_id] = self._piece(token_id)
        return piece

    def detokenize(
        self, ids: Iterable[int], remove_special: bool = False, unparse_special: bool = True
    ) -> bytes:
        """llama_detokenize as bytes: pieces joined, leading space of add_space_prefix removed,
        and, for vocabularies that ask for it, llama.cpp's clean-up of spaces before punctuation."""
        ids = list(ids)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = []
        for t in ids:
            piece = self.token_to_piece(t, unparse_special)
            if remove_space and piece.startswith(b" "):
                piece = piece[1:]
            remove_space = False
            parts.append(piece)
        text = b"".join(parts)
        if self.clean_spaces:
            text = _clean_up_spaces(text)
        return text

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids` (llama_detokenize); invalid UTF-8 becomes U+FFFD.

        skip_special drops control tokens and a leading BOS / trailing EOS the model adds.
        """
        return self.detokenize(
            ids, remove_special=skip_special, unparse_special=not skip_special
        ).decode("utf-8", "replace")


def _clean_up_spaces(text: bytes | bytearray) -> bytes:
    """The three in-place passes of llama.cpp's clean_spaces, byte for byte."""
    if any(p in text for p in (b" ?", b" !", b" .", b" ,")):
        text = _clean_pass1(bytearray(text))
    if b" ' " in text:
        text = _clean_pass2(bytearray(text))
    if any(p in text for p in (b" 's", b" 'm", b" 're", b" 've")):
        text = _clean_pass3(bytearray(text))
    return bytes(text)


def _clean_pass1(t: bytearray) -> bytearray:
    n = len(t)
    total = 1 if n else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    return t[:total]


def _clean_pass2(t: bytearray) -> bytearray:
    n = len(t)
    total = 1 if n else 0
    i = 1
    while i < n:
        x = t[i]
        if x == 0x27 and i + 1 < n and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    return t[:total]


def _clean_pass3(t: bytearray) -> bytearray:
    n = len(t)
    total = 1 if n else 0
    for i in range(1, n):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = t[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < n:
                x2 = t[i + 2]
                if (x1, x2) in ((0x72, 0x65), (0x76, 0x65)):  # 're, 've
                    total -= 1
        t[total] = x
        total += 1
    return t[:total]
