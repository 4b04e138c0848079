"""Byte-level BPE (tokenizer.ggml.model = "gpt2"): pre-tokenizer regexes per tokenizer.ggml.pre,
GPT-2 byte-to-unicode mapping, and rank-ordered merges as in llama.cpp's llm_tokenizer_bpe_session.

The pre-tokenizer applies its regexes one after another, each splitting the pieces the previous
one produced (matches and the text between them both stay), like llama.cpp's unicode_regex_split.
It also sees the text the way llama.cpp's regexes do: a regex naming a class \\p{N,L,P,M,S} runs on
the "collapsed" text, where every code point >= 128 is replaced by one stand-in character for its
class in llama.cpp's own Unicode table (llama_unicode.py; older than the `regex` module's, so
\\p{L} of `regex` would differ on newly assigned letters), and \\p{X} by that stand-in plus the
ASCII members; any other regex runs on the text with non-ASCII whitespace replaced by \\v, as
std::wregex sees it. \\s and \\d stay ASCII (std::regex in the C locale). The text keeps its
length, so the spans found there cut the real text. llama.cpp's hand-written splitters (gpt2,
llama3, qwen2, qwen35, kimi-k2, the afmoe digit groups) are written here as regexes that split the
same way. Words are merged once and cached.
"""

from __future__ import annotations

import bisect
import heapq
from typing import TYPE_CHECKING, Any, NamedTuple

import regex

from ..errors import TokenizerError
from ..metadata import meta_array, meta_str
from . import llama_unicode
from .base import K, Tokenizer, llama_codepoints

if TYPE_CHECKING:
    from .kernels import ByteTable


# --- llama.cpp's view of the text (unicode_regex_split) ----------------------------------------
_OTHER, _HAN_LETTER, _HAN_OTHER = "\xd0", "\xd6", "\xd7"
_STAND_IN = {"WS": "\x0b", "N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}
# unicode_cpt_is_han: kimi-k2's \p{Han}, which takes these blocks whole, assigned or not; their letters
# get their own stand-in (a letter to every other regex) so that kimi-k2's can tell them apart
_HAN = (
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xF900, 0xFAFF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0x2CEB0, 0x2EBEF),
    (0x2F800, 0x2FA1F),
)


def _class_table() -> tuple[list[int], list[str]]:
    """Sorted range starts and the stand-in of each range (gaps map to _OTHER)."""
    ranges = sorted(
        (a, b, _STAND_IN[name]) for name in _STAND_IN for a, b in getattr(llama_unicode, name)
    )
    starts, chars = [0], [_OTHER]
    for a, b, ch in ranges:
        if a != starts[-1]:
            starts.append(a)
            chars.append(ch)
        else:
            chars[-1] = ch
        starts.append(b + 1)
        chars.append(_OTHER)
    return starts, chars


_STARTS, _CHARS = _class_table()


class _Collapse(dict[int, str]):
    """str.translate table: code point -> llama.cpp's stand-in, filled on first use."""

    def __init__(self, whitespace_only: bool):
        super().__init__({c: chr(c) for c in range(128)})
        self.whitespace_only = whitespace_only

    def __missing__(self, cpt: int) -> str:
        ch = _CHARS[bisect.bisect_right(_STARTS, cpt) - 1]
        if self.whitespace_only:
            ch = ch if ch == _STAND_IN["WS"] else chr(cpt)
        elif any(a <= cpt <= b for a, b in _HAN):
            ch = _HAN_LETTER if ch == _STAND_IN["L"] else _HAN_OTHER
        self[cpt] = ch
        return ch


_COLLAPSED, _WIDE = _Collapse(False), _Collapse(True)

# \p{..} in a collapsed regex: the stand-in and the ASCII members (k_ucat_map); \p{Lu} etc. are letters
_ASCII_CLASS = {
    "N": "0-9",
    "L": "A-Za-z",
    "P": r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    "M": "",
    "S": r"\$\+<->\^`\|~",
}
_UCAT = {
    "N": "N",
    "L": "L",
    "P": "P",
    "M": "M",
    "S": "S",
    "Lu": "L",
    "Ll": "L",
    "Lt": "L",
    "Lm": "L",
    "Lo": "L",
}
_SPACE = r"\t-\r "  # \s of std::regex in the C locale


def _class_body(name: str) -> str:
    cat = _UCAT[name]
    stand_in = rf"\x{ord(_STAND_IN[cat]):02x}" + (
        rf"\x{ord(_HAN_LETTER):02x}" if cat == "L" else ""
    )
    return stand_in + _ASCII_CLASS[cat]


def _translate(expr: str) -> tuple[str, bool]:
    """A llama.cpp regex as `regex` must read it to match the same text, and whether it runs on
    the collapsed text. Brackets are tracked the way llama.cpp tracks them."""
    collapsed = any(f"\\p{{{name}}}" in expr for name in _UCAT)
    out, inside, i = [], False, 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            inside = True
        elif c == "]" and inside and expr[i - 1] != "\\":
            inside = False
        elif c == "\\" and expr[i + 1 : i + 3] == "p{" and collapsed:
            end = expr.index("}", i)
            body = _class_body(expr[i + 3 : end])
            out.append(body if inside else f"[{body}]")
            i = end + 1
            continue
        elif c == "\\" and expr[i + 1] in "sSd":
            body = _SPACE if expr[i + 1] in "sS" else "0-9"
            if expr[i + 1] == "S":
                assert not inside, expr
                out.append(f"[^{body}]")
            else:
                out.append(body if inside else f"[{body}]")
            i += 2
            continue
        elif c == "\\":
            out.append(expr[i : i + 2])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out), collapsed


class PreSplit(NamedTuple):
    """One pre-tokenizer regex, ready to run on the text llama.cpp would run it on."""

    pattern: regex.Pattern
    collapsed: bool


def _compile(expr: str) -> PreSplit:
    translated, collapsed = _translate(expr)
    return PreSplit(regex.compile(translated), collapsed)


# --- pre-tokenizer regexes (llama.cpp llm_tokenizer_bpe) ---------------------------------------
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_WS_TAIL = r"|\s*[\r\n]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*" + _WS_TAIL
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*" + _WS_TAIL
_QWEN35 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    + _WS_TAIL
)
_JAIS2 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
    + r"|\s{1,2}(?!\S)|\s{1}"
)
_MINICPM5 = [
    r"\p{N}{1,3}",
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*" + _WS_TAIL,
]
_SEED_CODER = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+" + _WS_TAIL
)
_BAILINGMOE = (
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
)
_UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*" + _WS_TAIL
_EXAONE_MOE = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"
)
# gpt-4o: upper-then-lower and upper-only words, written with lookaheads as llama.cpp does (its
# std::regex has no \p{Lu}); on the collapsed text a non-ASCII letter counts as both cases
_GPT4O_WORDS = (
    r"[^\r\n\p{L}\p{N}]?((?=[{L}])([^a-z]))*((?=[{L}])([^A-Z]))+{C}?"
    r"|[^\r\n\p{L}\p{N}]?((?=[{L}])([^a-z]))+((?=[{L}])([^A-Z]))*{C}?"
)
_GPT4O = (
    _GPT4O_WORDS.replace("{L}", r"\p{L}").replace("{C}", _CONTRACTIONS)
    + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
    + _WS_TAIL
)
_GRANITE_EMB_MULTI = (
    _GPT4O_WORDS.replace("{L}", r"\p{L}\p{M}").replace("{C}", _CONTRACTIONS)
    + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
    + _WS_TAIL
)
_UPPER, _LOWER = (
    r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]",
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]",
)  # all letters to llama.cpp
_CASED_WORDS = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
    rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
)
_TINY_AYA_WORDS = _CASED_WORDS + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*" + _WS_TAIL
# unicode_regex_split_custom_afmoe: each run of digits in groups of three from the right, the text
# before a run staying with its first group
_DIGIT_GROUPS = r"[^\p{N}]*\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))|[^\p{N}]+"
# unicode_regex_split_custom_kimi_k2: Han runs, then words of other letters (marks not included)
_KIMI_K2 = (
    rf"[\x{ord(_HAN_LETTER):02x}\x{ord(_HAN_OTHER):02x}]+"
    rf"|[^\r\n\p{{L}}\p{{N}}]?[\x{ord(_STAND_IN['L']):02x}A-Za-z]+{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*" + _WS_TAIL
)
_CJK = r"[一-龥぀-ゟ゠-ヿ]+"
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
_DEEPSEEK3_WORDS = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
)
_DEEPSEEK3 = [r"\p{N}{1,3}", _CJK, _DEEPSEEK3_WORDS + r"| ?[\p{P}\p{S}]+[\r\n]*" + _WS_TAIL]
_SPARK2_5 = [
    r"\p{N}{1,3}",
    _CJK,
    _DEEPSEEK3_WORDS + r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
    r"\p{N}",
]
_AFMOE = [
    _DIGIT_GROUPS,
    "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
    _DEEPSEEK3_WORDS + r"| ?[\p{P}\p{S}]+[\r\n]*" + _WS_TAIL,
]
_YOUTU = [
    "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|" + _CJK,
    _CASED_WORDS + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*" + _WS_TAIL,
]
_FALCON = [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"]
_STARCODER = [r"\p{N}", _GPT2]
_BLOOM = [r" ?[^(\s|.,!?…。，、।۔،)]+"]
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+"
    r"((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*" + _WS_TAIL
)
_CHAMELEON = [
    r"<sentinel:[0-9]+>",
    r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    r"([\t\n]|    |  )",
    r"\p{N}",
    r"[\p{P}!-/:-@\[-`{-~]",
    _GPT2,
]
_NEWLINES = r"[^\n]+|[\n]+"  # unicode_regex_split_custom_newlines
_DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]


class _Pre(NamedTuple):
    exprs: list[str]
    clean_spaces: bool
    ignore_merges: bool
    add_bos: bool
    has_bos: bool  # False: no default BOS id (chatglm-bpe, glm4)
    raw: bool  # SPM-style BPE (gemma4): spaces as U+2581, merges on the text itself, <0xXX> byte tokens


# tokenizer.ggml.pre -> settings, as llama_vocab::impl::load sets them for a BPE vocabulary
_PRE: dict[str, _Pre] = {}


def _register(
    names: str,
    exprs: list[str],
    clean_spaces: bool = True,
    ignore_merges: bool = False,
    add_bos: bool = False,
    has_bos: bool = True,
    raw: bool = False,
) -> None:
    for name in names.split():
        _PRE[name] = _Pre(exprs, clean_spaces, ignore_merges, add_bos, has_bos, raw)


_register("default", _DEFAULT)
_register("minicpm5", _MINICPM5, ignore_merges=True)
_register(
    "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
    [_LLAMA3],
    ignore_merges=True,
    add_bos=True,
)
_register("deepseek-llm", _DEEPSEEK_LLM, clean_spaces=False)
_register("deepseek-coder", _DEEPSEEK_CODER, clean_spaces=False)
_register("deepseek-v3 hunyuan-dense hy_v4 joyai-llm", _DEEPSEEK3, clean_spaces=False)
_register("spark2_5", _SPARK2_5, clean_spaces=False)
_register("youtu", _YOUTU, clean_spaces=False, ignore_merges=True)
_register("falcon", _FALCON)
_register(
    "mpt olmo jais gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert "
    "jina-v1-en jina-v2-code roberta-bpe exaone4",
    [_GPT2],
)
_register("trillion granite-docling", [_GPT2], clean_spaces=False)
_register("starcoder refact codeshell exaone minerva-7b mellum2", _STARCODER)
_register("command-r smollm", _STARCODER, clean_spaces=False)
_register("jais-2", [_JAIS2])
_register(
    "qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open grok-2", [_QWEN2], clean_spaces=False
)
_register("stablelm2 megrez", [_QWEN2])
_register("qwen35", [_QWEN35], clean_spaces=False)
_register("dbrx smaug-bpe", [_LLAMA3])
_register("chatglm-bpe", [_LLAMA3], has_bos=False)
_register("glm4 glm5", [_LLAMA3], ignore_merges=True, has_bos=False)
_register("poro-chat", _BLOOM, clean_spaces=False)
_register("viking", _BLOOM + [r"\p{N}"], clean_spaces=False)
_register("bloom gpt3-finnish", _BLOOM)
_register("tekken", [_TEKKEN], clean_spaces=False, ignore_merges=True, add_bos=True)
_register("exaone-moe", [_EXAONE_MOE])
_register("chameleon", _CHAMELEON, clean_spaces=False, add_bos=True)
_register("gpt-4o llama4 kanana2 talkie minimax-m2", [_GPT4O], clean_spaces=False)
_register("granite-embed-multi-97m", [_GRANITE_EMB_MULTI], clean_spaces=False, ignore_merges=True)
_register("tiny_aya cohere2moe", [_DIGIT_GROUPS, _TINY_AYA_WORDS], clean_spaces=False)
_register("superbpe", [r"\p{N}+", r"(?=(\d{3})+(?!\d))"], clean_spaces=False)
_register("bailingmoe bailingmoe2 llada-moe", [_BAILINGMOE], clean_spaces=False)
_register("seed-coder", [_SEED_CODER], clean_spaces=False)
_register("kimi-k2", [_KIMI_K2], clean_spaces=False)
_register("ufakzeka", [_UFAKZEKA], clean_spaces=False)
_register("afmoe", _AFMOE, clean_spaces=False)
_register("laguna", [_NEWLINES, _QWEN2], clean_spaces=False)
# llama.cpp forces add_bos on for gemma4 whatever the metadata says
_register("gemma4 granite-embed-multi-311m", [_NEWLINES], add_bos=True, raw=True)
_register("sarvam-moe", [_NEWLINES], clean_spaces=False, raw=True)
_GEMMA4 = ("gemma4", "granite-embed-multi-311m")  # LLAMA_VOCAB_PRE_TYPE_GEMMA4

PRE_TOKENIZERS: tuple[str, ...] = tuple(sorted(_PRE))
_COMPILED: dict[str, list[PreSplit]] = {}


def pre_tokenizer_regexes(pre: str) -> list[PreSplit]:
    """The compiled regexes for tokenizer.ggml.pre = `pre` (TokenizerError if unknown)."""
    if pre not in _PRE:
        raise TokenizerError(
            f"unknown pre-tokenizer type: '{pre}' (known: {', '.join(PRE_TOKENIZERS)})"
        )
    if pre not in _COMPILED:
        _COMPILED[pre] = [_compile(e) for e in _PRE[pre].exprs]
    return _COMPILED[pre]


def pre_tokenizer_adds_bos(pre: str) -> bool:
    """Whether a BPE vocabulary with this tokenizer.ggml.pre adds BOS when its metadata does not say."""
    settings = _PRE.get(pre or "default")
    return settings is not None and settings.add_bos


def split_words(text: str, splits: list[PreSplit]) -> list[str]:
    """unicode_regex_split: each regex splits every current piece into matches and gaps."""
    ascii_text = text.isascii()
    views: dict[bool, str] = {}
    spans = [(0, len(text))]
    for pat, collapsed in splits:
        view = views.get(collapsed)
        if view is None:
            view = views[collapsed] = (
                text if ascii_text else text.translate(_COLLAPSED if collapsed else _WIDE)
            )
        new = []
        for start, end in spans:
            pos = start
            for m in pat.finditer(view, start, end):
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
        gemma4_model = (
            meta_str(meta, K.MODEL, None) == "gemma4"
        )  # tokenizer.ggml.model "gemma4" means pre gemma4
        pre = "gemma4" if gemma4_model else meta_str(meta, K.PRE, None) or "default"
        if pre not in _PRE:
            raise TokenizerError(
                f"unknown pre-tokenizer type: '{pre}' (known: {', '.join(PRE_TOKENIZERS)})"
            )
        settings = _PRE[pre]
        default_bos = 11 if settings.has_bos and not gemma4_model else None
        super().__init__(
            meta,
            default_bos=default_bos,
            default_eos=None if gemma4_model else 11,
            default_unk=None,
            add_space_prefix=False,
            add_bos=settings.add_bos,
            add_eos=False,
            clean_spaces=settings.clean_spaces,
        )
        self.pre = pre
        self.ignore_merges = settings.ignore_merges
        self.raw = settings.raw
        if pre in _GEMMA4:
            self.add_bos = True  # llama.cpp overrides a false add_bos_token for Gemma 4
        self._patterns = pre_tokenizer_regexes(pre)
        merges = meta_array(meta, K.MERGES, None, "string")
        if merges is None and pre != "kimi-k2":  # llama.cpp lets Kimi-K2 go without merges
            raise TokenizerError(f"BPE tokenizer without '{K.MERGES}'")
        # "left right" -> rank; the first occurrence wins, as with std::map::emplace
        ranks: dict[str, int] = {}
        for i, m in enumerate(merges or ()):
            if m.find(" ", 1) > 0:
                ranks.setdefault(m, i)
        self.ranks = ranks
        self._cache: dict[str, tuple[int, ...]] = {}
        self._kernel_tables: tuple[ByteTable, ByteTable] | None = (
            None  # (vocab, merges) for kernels.merge_bpe
        )

    # --- encode -------------------------------------------------------------------------------
    def _encode_fragment(self, text: str, after_special: bool, out: list[int]) -> None:
        cache = self._cache
        if len(cache) > self._CACHE_LIMIT:
            cache.clear()
        text = llama_codepoints(text)
        if self.raw:
            text = text.replace(" ", "\u2581")  # llama_escape_whitespace
        for word in split_words(text, self._patterns):
            ids = cache.get(word)
            if ids is None:
                ids = cache[word] = self._bpe_word(word)
            out.extend(ids)

    def _bpe_word(self, word: str) -> tuple[int, ...]:
        if self.raw:
            return self._raw_word(word)
        chars = (
            word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_BYTE_LEVEL)
        )
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

    def _raw_word(self, word: str) -> tuple[int, ...]:
        """SPM-style BPE (byte_encode false): merges on the text itself, <0xXX> tokens for the rest."""
        vocab = self.token_to_id
        if (
            self.pre in _GEMMA4 and word.strip("\n") == "" and word in vocab
        ):  # a run of newlines as one token
            return (vocab[word],)
        ids = []
        for s in self._merge(list(word)):
            tid = vocab.get(s)
            if tid is not None:
                ids.append(tid)
                continue
            for b in s.encode("utf-8"):
                tid = vocab.get(f"<0x{b:02X}>")
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
            self._kernel_tables = (
                vocab,
                kernels.ByteTable([m.encode("utf-8", "surrogatepass") for m in merges]),
            )
        return kernels.merge_bpe(chars.encode("utf-8"), *self._kernel_tables)

    # --- decode -------------------------------------------------------------------------------
    def _piece(self, token_id: int) -> bytes:
        from .base import TokenAttr

        attr = self.attrs[token_id]
        text = self.tokens[token_id]
        if attr & (TokenAttr.UNKNOWN | TokenAttr.CONTROL | TokenAttr.USER_DEFINED):
            return text.encode("utf-8", "surrogatepass")
        if attr & TokenAttr.NORMAL:
            if self.raw:
                return text.replace("\u2581", " ").encode("utf-8", "surrogatepass")
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
            out += (
                b"[UNK_BYTE_0x"
                + c.encode("utf-8", "surrogatepass").hex().encode()
                + text.encode("utf-8", "surrogatepass")
                + b"]"
            )
    return bytes(out)
