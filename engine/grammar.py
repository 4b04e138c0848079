"""Constrained decoding: a grammar (GBNF, Lark, JSON schema, regex) as a per-token mask.

llguidance does the parsing. This module owns the three pieces around it:

- `Grammar`: a request's grammar, converted to llguidance's form and checked, with no
  tokenizer attached (cheap to build on an HTTP thread; the error names the problem).
- `vocabulary_for(tokenizer)`: llguidance's view of OUR vocabulary (every token's bytes,
  control tokens marked, the end-of-generation ids, our tokenize function). Building it
  walks the whole vocabulary (~1 s for 49k tokens), so it is built once per tokenizer and
  cached.
- `GrammarMatcher`: one sequence's parser state. Per token: `apply(logits)` sets every
  token the grammar forbids to -inf (before any other sampler, so top-k/top-p/min-p only
  ever see allowed tokens), then `accept(token)` advances the parser. Once the grammar is
  complete only the end-of-generation tokens are allowed, so generation ends there.

llguidance is imported lazily: only requests that carry a grammar pay for it.
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import GrammarError
from .grammar_limits import check_source, on_compiler_thread

if TYPE_CHECKING:
    import llguidance

    from .seams import GenerationTokenizer

GRAMMAR_KINDS = ("gbnf", "lark", "json_schema", "regex")

# Whitespace allowed between JSON tokens: llama.cpp's json-schema-to-grammar SPACE_RULE
# (| " " | "\n"{1,2} [ \t]{0,20}). llguidance's default allows unbounded whitespace, in
# which small models can loop until the token limit. A schema's own "x-guidance" wins.
_JSON_DEFAULTS = {
    "whitespace_pattern": r"(?: |\n{1,2}[ \t]{0,20})?",
    # llama.cpp's converter ignores keywords it does not implement (uniqueItems, not, ...)
    "lenient": True,
}

_PROBES = 4  # allowed first tokens each request's grammar is tried with (_first_mask_matcher)
_NEG_INF = np.float32(-np.inf)
_NEG_INF_BITS = _NEG_INF.view(np.uint32)


def _llg() -> Any:
    try:
        import llguidance
        import llguidance.gbnf_to_lark  # noqa: F401  (a submodule __init__ does not name)
    except ImportError as e:  # a core dependency; only a broken install gets here
        # (PackageNotFoundError is one too: llguidance reads its own version at import, so a
        # bundle needs its metadata, packaging/ggstation.spec)
        raise GrammarError(
            "constrained output needs the 'llguidance' package (pip install llguidance)"
        ) from e
    return llguidance


# -- a request's grammar ---------------------------------------------------------------------


@dataclass(frozen=True)
class Grammar:
    """A checked grammar in llguidance's form, independent of any tokenizer.

    Attributes:
        kind: 'gbnf' (llama.cpp's grammar format; Lark text is accepted too), 'lark',
            'json_schema' or 'regex'.
        source: the grammar as the caller gave it (a JSON schema as JSON text).
        compiled: llguidance's grammar definition (what an LLMatcher is built from).
    """

    kind: str
    source: str
    compiled: str
    # LLTokenizer -> a matcher checked against it at its first mask, copied per sequence
    _prototypes: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_gbnf(cls, text: str) -> Grammar:
        """A llama.cpp GBNF grammar (with a `root` rule), or Lark text (`start:` rule)."""
        llg = _llg()
        if is_lark(text):
            return cls.from_lark(text)
        check_source("gbnf", text)
        try:
            lark = gbnf_to_lark(text)
        except RecursionError:
            raise GrammarError("failed to parse grammar: nested too deeply") from None
        except Exception as e:  # the converter raises plain Exceptions with the position
            raise GrammarError(f"failed to parse grammar: {e}") from None
        return cls._checked("gbnf", text, lambda: llg.LLMatcher.grammar_from_lark(lark))

    @classmethod
    def from_lark(cls, text: str) -> Grammar:
        llg = _llg()
        check_source("lark", text)
        return cls._checked("lark", text, lambda: llg.LLMatcher.grammar_from_lark(text))

    @classmethod
    def from_json_schema(cls, schema: Any) -> Grammar:
        """A JSON schema (a dict, a bool, or its JSON text); `{}` means any JSON value."""
        llg = _llg()
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(
                f"a JSON schema must be an object or a boolean, got {type(schema).__name__}"
            )
        try:
            text = json.dumps(schema, ensure_ascii=False)
            check_source("json_schema", text)
            closed = json.dumps(close_objects(schema) if isinstance(schema, dict) else schema)
        except RecursionError:
            raise GrammarError("invalid JSON schema: nested too deeply") from None
        except (ValueError, TypeError) as e:
            raise GrammarError(f"invalid JSON schema: {e}") from None
        return cls._checked(
            "json_schema",
            text,
            lambda: llg.LLMatcher.grammar_from_json_schema(closed, defaults=_JSON_DEFAULTS),
            what="JSON schema",
        )

    @classmethod
    def from_regex(cls, pattern: str) -> Grammar:
        llg = _llg()
        check_source("regex", pattern)
        return cls._checked(
            "regex", pattern, lambda: llg.LLMatcher.grammar_from_regex(pattern), what="regex"
        )

    def check_vocabulary(self, tokenizer: GenerationTokenizer) -> None:
        """Check the grammar against a model's vocabulary, up to its first token's mask
        (building and caching the vocabulary: call this off the scheduler's thread).

        A grammar that compiles can still fail once a vocabulary meets it ("Too many items",
        lexer fuel): found here, that is the request's error, not one after it started; and
        the matcher built here is what every sequence of the request copies.

        Raises:
            GrammarError: naming the problem.
        """
        self._prototype(vocabulary_for(tokenizer))

    def _prototype(self, vocab: Any) -> Any:
        """A matcher over `vocab` that has computed its first mask (built on the compiler's
        thread once, then reused)."""
        proto = self._prototypes.get(vocab)
        if proto is None:
            proto = self._prototypes[vocab] = on_compiler_thread(
                lambda: _first_mask_matcher(self.compiled, vocab)
            )
        return proto

    @classmethod
    def _checked(cls, kind: str, source: str, compile_fn: Any, what: str = "grammar") -> Grammar:
        """Compile and validate on the compiler's thread (grammar_limits: the native code
        recurses over the grammar's structure)."""

        def run() -> str:
            try:
                compiled = str(compile_fn())
            except (ValueError, TypeError) as e:
                raise GrammarError(f"invalid {what}: {e}") from None
            is_error, messages = _llg().LLMatcher.validate_grammar_with_warnings(compiled)
            if is_error:
                raise GrammarError(f"invalid {what}: {_first_line(messages)}")
            return compiled

        return cls(kind, source, on_compiler_thread(run))


def _first_mask_matcher(compiled: str, vocab: Any) -> Any:
    """An LLMatcher over `vocab` after its first mask; GrammarError if either fails."""
    llg = _llg()
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(compiled, vocab)
    if is_error:
        raise GrammarError(f"invalid grammar: {_first_line(messages)}")
    matcher = llg.LLMatcher(vocab, compiled, log_level=0)
    bits = np.zeros((1, (int(vocab.vocab_size) + 31) // 32), dtype=np.int32)
    if not matcher.is_error():
        matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
    if matcher.is_error():
        raise GrammarError(f"invalid grammar: {_first_line([matcher.get_error()])}")
    allowed = np.flatnonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))
    for token in allowed[np.linspace(0, len(allowed) - 1, min(len(allowed), _PROBES)).astype(int)]:
        # a grammar whose Earley rows explode after one token fails there whichever token
        # it was: a few allowed ones, spread over the vocabulary, find most such grammars
        probe = matcher.deep_copy()
        if probe.consume_token(int(token)) and not probe.is_error():
            probe.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        if probe.is_error():
            raise GrammarError(
                f"invalid grammar: it fails after its first token: {_first_line([probe.get_error()])}"
            )
    return matcher


def _first_line(messages: list[str]) -> str:
    """A parser message without the parser state llguidance appends on later lines."""
    text = str(messages[0]).strip() if messages else ""
    return text.splitlines()[0][:500] if text else "unknown error"


def is_lark(text: str) -> bool:
    """Lark rather than GBNF: llama.cpp's `%llguidance` header, or a `start:` rule in a text
    without GBNF's `::=` (llguidance's own check also takes GBNF's `start ::=` for Lark)."""
    return text.lstrip().startswith("%llguidance") or (
        "::=" not in text and re.search(r"(?m)^\s*start\s*:", text) is not None
    )


def gbnf_to_lark(text: str) -> str:
    """llguidance's GBNF-to-Lark converter, with every rule renamed first.

    The converter renames `root` to Lark's `start` and folds case and dashes (`a-b` and
    `aB` both become `a_b`), so a grammar with a rule named `start`, or two names that fold
    alike, fails with "Rule 'start' already exists" where llama.cpp accepts it. Here each
    rule gets a name that is already folded and unique (`<name>_<index>`) before that step.
    """
    conv = _llg().gbnf_to_lark
    rules = conv.GrammarParser().parse(text)
    try:
        new = {}
        for i, name in enumerate(rules):
            base = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "rule"
            new[name] = (
                "root" if name == "root" else f"{'r_' if base[0].isdigit() else ''}{base}_{i}"
            )
        stack: list[Any] = list(rules.values())
        while stack:
            node = stack.pop()
            if isinstance(node, conv.RuleRefNode):
                node.name = new.get(node.name, node.name)
            stack.extend(node.children())
        for r in rules.values():
            r.name = new[r.name]
        rules = {r.name: r for r in rules.values()}
        _resolve(conv, rules)
    except AttributeError:  # the converter's internals changed: convert as it does
        return str(conv.gbnf_to_lark(text))
    out = ["%llguidance {}\n"]
    for r in sorted(rules.values(), key=lambda r: r.order):
        out.append(str(r))
    return "\n".join(out) + "\n"


def _resolve(conv: Any, rules: dict[str, Any]) -> None:
    """The converter's `resolve`, in linear time: link references, name `root` Lark's
    `start`, and mark the rules that are terminals (every rule they name is one; never the
    root, never a rule on a cycle), upper-cased as Lark wants them.

    The converter finds terminals by re-scanning every rule until nothing changes, one rule
    per pass along a chain: a 5 000-rule chain took ~30 s of a core. Names are already
    folded and unique (gbnf_to_lark), so no renaming can clash.
    """
    deps: dict[str, set[str]] = {}
    for i, r in enumerate(rules.values()):
        r.order = i
        r.alternatives = r.alternatives.simplify()
        names: set[str] = set()
        stack = [r.alternatives]
        while stack:
            node = stack.pop()
            if isinstance(node, conv.RuleRefNode):
                if node.name not in rules:
                    raise Exception(f"Rule '{node.name}' not found")
                node.target = rules[node.name]
                names.add(node.name)
            stack.extend(node.children())
        deps[r.name] = names
    if "root" not in rules:
        raise Exception("No 'root' rule found")
    users: dict[str, list[str]] = {name: [] for name in rules}
    for name, named in deps.items():
        for d in named:
            users[d].append(name)
    waiting = {name: len(named) for name, named in deps.items()}
    ready = [name for name, n in waiting.items() if n == 0 and name != "root"]
    while ready:
        name = ready.pop()
        rules[name].rule_is_terminal = True
        for user in users[name]:
            waiting[user] -= 1
            if waiting[user] == 0 and user != "root":
                ready.append(user)
    for r in rules.values():
        r.name = "start" if r.name == "root" else r.name.upper() if r.rule_is_terminal else r.name


# where a JSON schema holds subschemas: keyword -> how (one schema, a list, a name map)
_SUBSCHEMA_ONE = (
    "additionalProperties",
    "items",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "additionalItems",
)
_SUBSCHEMA_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SUBSCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def close_objects(schema: Any, depth: int = 0) -> Any:
    """A copy of `schema` in which every object schema with `properties` and no
    `additionalProperties` gets `additionalProperties: false`.

    This is llama.cpp's reading (common/json-schema.cpp): listed properties close the object.
    JSON Schema itself leaves it open, which lets a model add keys nobody asked for.
    """
    if not isinstance(schema, dict) or depth > 64:
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    for key in _SUBSCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = close_objects(out[key], depth + 1)
    for key in _SUBSCHEMA_LIST:
        if isinstance(out.get(key), list):
            out[key] = [close_objects(x, depth + 1) for x in out[key]]
    for key in _SUBSCHEMA_MAP:
        if isinstance(out.get(key), dict):
            out[key] = {k: close_objects(v, depth + 1) for k, v in out[key].items()}
    return out


def compile_grammar(kind: str, source: Any) -> Grammar:
    """`Grammar.from_<kind>(source)`; raises GrammarError naming the problem."""
    builders = {
        "gbnf": Grammar.from_gbnf,
        "lark": Grammar.from_lark,
        "json_schema": Grammar.from_json_schema,
        "regex": Grammar.from_regex,
    }
    if kind not in builders:
        raise GrammarError(f"unknown grammar kind {kind!r} (one of {', '.join(GRAMMAR_KINDS)})")
    return builders[kind](source)


# -- the vocabulary as llguidance sees it ------------------------------------------------------

# tokenizer -> LLTokenizer, built once per tokenizer (weak: an unloaded model frees its entry)
_VOCABS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_VOCABS_LOCK = threading.Lock()

_CONTROL = 1 << 3  # TokenAttr.CONTROL
_USER_DEFINED = 1 << 4  # TokenAttr.USER_DEFINED
_SPECIAL_PREFIX = b"\xff"  # llguidance's mark of a special token (never valid UTF-8)


def token_bytes(tokenizer: GenerationTokenizer) -> list[bytes]:
    """Every token's bytes, special tokens prefixed with 0xFF as llguidance expects.

    Special here means what llama.cpp's llguidance bridge marks: control tokens, and
    user-defined tokens that look like `<...>`. A grammar can still name them (`<|im_end|>`
    in Lark), but plain text never matches them.
    """
    attr = getattr(tokenizer, "token_attr", None)
    out = []
    for i in range(tokenizer.n_vocab):
        piece = tokenizer.token_to_piece(i, special=True)
        if attr is not None:
            a = attr(i)
            special = bool(a & _CONTROL) or (
                bool(a & _USER_DEFINED) and piece.startswith(b"<") and piece.endswith(b">")
            )
        else:  # a tokenizer without attributes: hidden when not rendering specials
            special = bool(piece) and not tokenizer.token_to_piece(i, special=False)
        out.append(_SPECIAL_PREFIX + piece if special else piece)
    return out


class _TokenizerAdapter:
    """The object llguidance.TokenizerWrapper reads: tokens, EOS/BOS and a tokenize call."""

    def __init__(self, tokenizer: GenerationTokenizer, eos_id: int):
        self.eos_token_id = eos_id
        self.bos_token_id = tokenizer.bos_id
        self.tokens = token_bytes(tokenizer)
        # weakly: llguidance keeps this adapter, _VOCABS keeps llguidance's tokenizer for as long
        # as `tokenizer` lives, and a strong reference back would keep both alive for good
        self._tokenizer = weakref.ref(tokenizer) if hasattr(tokenizer, "encode") else None
        self._byte_ids = {b[0]: i for i, b in enumerate(self.tokens) if len(b) == 1}

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "surrogateescape")
        tokenizer = self._tokenizer() if self._tokenizer is not None else None
        if tokenizer is not None:
            return list(tokenizer.encode(text, add_special=False, parse_special=False))
        # no encoder (test fakes): one token per byte where the vocabulary has them
        data = text.encode("utf-8", "surrogateescape")
        return [self._byte_ids[b] for b in data if b in self._byte_ids]


def vocabulary_for(tokenizer: GenerationTokenizer) -> llguidance.LLTokenizer:
    """llguidance's tokenizer over `tokenizer`'s vocabulary, built on first use and cached.

    Args:
        tokenizer: the model's tokenizer (token_to_piece, eog_ids, bos_id, encode).
    """
    with _VOCABS_LOCK:
        vocab = _VOCABS.get(tokenizer)
        if vocab is None:
            vocab = _VOCABS[tokenizer] = _build_vocabulary(tokenizer)
        return vocab


def _build_vocabulary(tokenizer: GenerationTokenizer) -> llguidance.LLTokenizer:
    llg = _llg()
    eog = sorted(int(t) for t in tokenizer.eog_ids if 0 <= t < tokenizer.n_vocab)
    eos = getattr(tokenizer, "eos_id", None)
    if not eog and eos is None:
        raise GrammarError("the model has no end-of-generation token: a grammar cannot end")
    eos_ids = eog if eog else [int(eos)]  # type: ignore[arg-type]
    adapter = _TokenizerAdapter(tokenizer, eos_ids[0])
    try:
        return llg.LLTokenizer(
            llg.TokenizerWrapper(adapter), n_vocab=tokenizer.n_vocab, eos_token=eos_ids
        )
    except Exception as e:  # llguidance rejects vocabularies it cannot index
        raise GrammarError(f"cannot build the grammar vocabulary for this model: {e}") from e


# -- one sequence's parser state ---------------------------------------------------------------


class GrammarMatcher:
    """A grammar's parse state for one sequence, as a mask over the logits.

    Args:
        grammar: the checked grammar.
        tokenizer: the model's tokenizer (its llguidance vocabulary is cached).

    Raises:
        GrammarError: the grammar does not fit this vocabulary.
    """

    def __init__(self, grammar: Grammar, tokenizer: GenerationTokenizer):
        self.grammar = grammar
        vocab = vocabulary_for(tokenizer)
        self._matcher = grammar._prototype(vocab).deep_copy()
        self.vocab_size = int(vocab.vocab_size)
        # one bit per token in llguidance's layout: (1, ceil(vocab_size / 32)) int32
        self._bits = np.zeros((1, (self.vocab_size + 31) // 32), dtype=np.int32)
        self.n_tokens = 0  # tokens accepted

    @property
    def stopped(self) -> bool:
        """The grammar is complete (or failed): only end-of-generation tokens are allowed."""
        return bool(self._matcher.is_stopped())

    @property
    def error(self) -> str:
        return str(self._matcher.get_error())

    def allowed(self, n_vocab: int | None = None) -> np.ndarray:
        """(n_vocab,) bool: the tokens the grammar allows next. `n_vocab` is the width of a
        logits row; ids past the tokenizer's vocabulary (padded output rows) are never
        allowed."""
        n = self.vocab_size if n_vocab is None else int(n_vocab)
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little").view(bool)
        if n <= bits.size:
            return bits[:n]
        return np.concatenate([bits, np.zeros(n - bits.size, dtype=bool)])

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """A copy of `logits` (n_vocab,) with every token the grammar forbids set to -inf."""
        keep = self.allowed(logits.shape[0])
        n_keep = int(np.count_nonzero(keep))
        if n_keep * 8 < keep.size:  # the usual case: a few allowed tokens, scatter them
            out = np.full(keep.size, -np.inf, dtype=logits.dtype)
            ids = np.flatnonzero(keep)
            out[ids] = logits[ids]
            return out
        if logits.dtype == np.float32 and logits.flags.c_contiguous:
            # np.where on a dense, irregular mask mispredicts a branch per token (~4x
            # slower at 50 % density); select through the bits instead: m is 0 or ~0
            m = np.negative(keep.view(np.uint8), dtype=np.int32).view(np.uint32)
            bits = logits.view(np.uint32) & m
            bits |= _NEG_INF_BITS & ~m
            return bits.view(np.float32)
        return np.where(keep, logits, _NEG_INF).astype(logits.dtype, copy=False)

    def accept(self, token: int) -> bool:
        """Advance past `token`; False (and the matcher in its error state) if the grammar
        forbids it."""
        ok = bool(self._matcher.consume_token(int(token)))
        self.n_tokens += ok
        return ok
