"""What a grammar may cost before llguidance sees it, and the thread llguidance compiles on.

llguidance is native code that recurses over a grammar's structure while it converts and
checks it: a chain of a few thousand rules (`r0 ::= "x" r1`, ...), of Lark terminals, or of
JSON-schema `$ref`s overflows an 8 MiB stack and kills the whole process with SIGSEGV, where
Python's own recursion limit would have raised. Two things keep that out of the server:

- `check_source` bounds what a request can hand over: its length, its number of rules, and
  its counted repetitions (llama.cpp's own limit of 2 000, llama-grammar.cpp), each a
  GrammarError (a 400) naming the bound, before any conversion.
- `on_compiler_thread` runs every call that compiles or validates a grammar on one thread
  whose stack is large enough for any grammar within those bounds (256 MiB of address space,
  committed only as far as a compile reaches). Running a compiled matcher recurses far less:
  masks over a 3 000-deep chain ran on a 256 KiB stack, so the scheduler's thread only ever
  computes masks and never compiles.
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from .errors import GrammarError

MAX_GRAMMAR_CHARS = 256 * 1024  # a grammar's or JSON schema's text
MAX_RULES = 10_000  # GBNF / Lark rules and terminals
MAX_REPETITION = 2_000  # llama.cpp's MAX_REPETITION_THRESHOLD for x{n} / x{m,n}
COMPILER_STACK_BYTES = 256 << 20

T = TypeVar("T")

# a rule's head at the start of a line: GBNF `name ::=`, Lark `name:` / `?name:` / `NAME.2:`
_GBNF_RULE = re.compile(r"(?m)^[ \t]*[A-Za-z0-9_-]+[ \t]*::=")
_LARK_RULE = re.compile(r"(?m)^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_]*(?:\.-?\d+)?[ \t]*:(?!:)")
# a counted repetition {n} / {m,} / {m,n}; a JSON object in a Lark %json or %llguidance
# directive never matches (it starts with a quote or a brace)
_REPETITION = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def check_source(kind: str, text: str) -> None:
    """Refuse a grammar whose size alone makes it too costly to compile.

    Args:
        kind: 'gbnf', 'lark', 'json_schema' (its JSON text) or 'regex'.
        text: the grammar as the request gave it.

    Raises:
        GrammarError: naming the bound that was exceeded.
    """
    what = "JSON schema" if kind == "json_schema" else "regex" if kind == "regex" else "grammar"
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(
            f"the {what} is too large: {len(text)} characters, at most {MAX_GRAMMAR_CHARS}"
        )
    if kind in ("gbnf", "lark"):
        n_rules = len((_GBNF_RULE if "::=" in text else _LARK_RULE).findall(text))
        if n_rules > MAX_RULES:
            raise GrammarError(f"the grammar has too many rules: {n_rules}, at most {MAX_RULES}")
    # a literal's text is not a repetition; a schema's counts (maxLength...) are no braces,
    # but its `pattern`s are regexes
    _check_repetitions(what, _LITERAL.sub('""', text) if kind in ("gbnf", "lark") else text)


def _check_repetitions(what: str, text: str) -> None:
    for m in _REPETITION.finditer(text):
        for count in m.groups():
            if count and int(count) > MAX_REPETITION:
                raise GrammarError(
                    f"the {what} repeats too often: {m.group(0)!r}, "
                    f"at most {MAX_REPETITION} repetitions"
                )


class _CompilerThread:
    """One daemon thread with a large stack that runs submitted calls in order."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[[], T]) -> T:
        if threading.current_thread() is self._thread:
            return fn()
        future: Future[T] = Future()
        self._start()
        self._jobs.put((fn, future))
        return future.result()

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            for size in (COMPILER_STACK_BYTES, COMPILER_STACK_BYTES // 4):
                # stack_size is process-wide: set it only for this thread's creation
                previous = threading.stack_size(size)
                try:
                    thread = threading.Thread(
                        target=self._loop, name="grammar-compiler", daemon=True
                    )
                    thread.start()
                except (RuntimeError, MemoryError, ValueError):  # address space capped (ulimit -v)
                    continue
                finally:
                    threading.stack_size(previous)
                self._thread = thread
                return
            raise GrammarError(
                "cannot start the grammar compiler's thread: not enough address space "
                f"for its {COMPILER_STACK_BYTES // 4 >> 20} MiB stack"
            )

    def _loop(self) -> None:
        while True:
            fn, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # handed to the caller, who raises it on its thread
                future.set_exception(e)


_COMPILER = _CompilerThread()


def on_compiler_thread(fn: Callable[[], T]) -> T:
    """fn() on the grammar compiler's large-stack thread; its result or its exception."""
    return _COMPILER.run(fn)
