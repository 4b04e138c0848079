"""The sandbox chat templates render in: jinja2's ImmutableSandboxedEnvironment plus limits on
the work one render may do.

A chat template comes from the GGUF, so it is untrusted code. jinja2's sandbox keeps it away
from Python internals but not from running for ever or filling memory: a fuzzer found nested
`range(100000)` loops, `'a' * 1000000000` and a namespace string doubled 60 times. Each render
runs under a RenderBudget:

- time: jinja compiles a template to Python; our code generator makes every `{% for %}` loop
  iterate through `environment.ticking(...)`, which ticks once per item, and every call (macros,
  `loop()`, `caller()`, methods) and filter ticks in its hook. A tick reads the monotonic clock
  against the render's deadline (BUDGET_S). Template code can only repeat work through loops
  and calls, so a loop with no output and no calls is stopped too, from template code where
  nothing catches the error. (Not sys.settrace: Python removes a trace function that raises, so
  one exception swallowed by library code would switch the budget off; it would displace a
  debugger's or coverage's tracer; and it made real templates 4-5x slower to render, this 1.7x.)
- sizes: an operation that can build a large string, list or integer in one C call is checked
  before it runs (`*`, `+`, `%`, `**`, `~`, buffers joined, `{{ }}` output, str.format widths,
  str methods such as center/replace/join/translate, the filters that repeat text); what calls
  and filters return is checked after. Strings may hold `size_limit` characters, relative to
  the input: max(MIN_SIZE_LIMIT, INPUT_FACTOR x the conversation's text); lists MAX_ITEMS.
  Library code that is super-linear on text under that limit is checked too (striptags).
- output: the rendered text holds at most `size_limit` characters.
- range(): MAX_RANGE items a call (jinja's limit) and RANGE_TOTAL over the render.
- calls: at most MAX_CALL_DEPTH nested template calls (a macro calling itself), well inside
  Python's recursion limit; RecursionError and MemoryError are reported the same way.

Filters never run while jinja compiles (it folds constant expressions then, outside any
budget): they run at render time instead. The source itself is capped (MAX_SOURCE_CHARS).
A limit raises TemplateLimitError(reason); ChatTemplate.render puts the template's name in front.
Not bounded: memory held at once by many values each under the limits, and C code that is
super-linear on inputs under them (e.g. regular-expression backtracking).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import wraps
from types import BuiltinMethodType, MethodType
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import (
    ImmutableSandboxedEnvironment,
    SandboxedEscapeFormatter,
    SandboxedFormatter,
    safe_range,
)
from jinja2.utils import Namespace, generate_lorem_ipsum
from markupsafe import Markup

from ..errors import TemplateLimitError

BUDGET_S = 2.0  # seconds (monotonic clock) one render may take
MIN_SIZE_LIMIT = 8 << 20  # characters in any string, including the output
INPUT_FACTOR = 4  # ... or this many times the input's characters, if more
MAX_ITEMS = 1 << 20  # items in a list (or keys in a dict) a template builds
RANGE_TOTAL = 1_000_000  # range() items over one render
MAX_INT_BITS = 1 << 16  # integers from * and **
MAX_SOURCE_CHARS = 128 << 10  # template source: the largest real ones are ~17 KB, and jinja
# compiles ~50 KB/s (2-core machine), before the render budget starts
MAX_CALL_DEPTH = 64  # nested macro / loop() / caller() calls

_SIZED = (str, bytes)
_SEQUENCES = (list, tuple)
_CONTAINERS = (list, tuple, dict, set, frozenset)


class RenderBudget:
    """What one render may still do. Hooks find the active one through `current()`."""

    __slots__ = ("budget_s", "deadline", "size_limit", "range_left", "depth")

    def __init__(self, size_limit: int = MIN_SIZE_LIMIT, budget_s: float | None = None):
        self.size_limit = size_limit
        self.range_left = RANGE_TOTAL
        self.depth = 0
        self.budget_s = budget_s
        self.deadline = float("inf") if budget_s is None else time.monotonic() + budget_s

    @classmethod
    def for_input(cls, input_size: int, budget_s: float) -> RenderBudget:
        return cls(max(MIN_SIZE_LIMIT, INPUT_FACTOR * input_size), budget_s)

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"exceeded its {self.budget_s:g} s render budget")

    def check_text(self, n: int, what: str) -> None:
        if n > self.size_limit:
            raise TemplateLimitError(
                f"would build {what}: {n:,} characters, over its limit of {self.size_limit:,}"
            )

    def check_items(self, n: int, what: str) -> None:
        if n > MAX_ITEMS:
            raise TemplateLimitError(
                f"would build {what}: {n:,} items, over its limit of {MAX_ITEMS:,}"
            )

    def oversized(self, value: Any) -> bool:
        if isinstance(value, _SIZED):
            return len(value) > self.size_limit
        return isinstance(value, _CONTAINERS) and len(value) > MAX_ITEMS

    def check_result(self, value: Any, what: str) -> None:
        if isinstance(value, _SIZED):
            self.check_text(len(value), f"a string with {what}")
        elif isinstance(value, _CONTAINERS):
            self.check_items(len(value), f"a {type(value).__name__} with {what}")


class _Ticking:
    """An iterable that ticks its budget once per item; keeps the source's len() (loop.length)."""

    __slots__ = ("_items", "_budget")

    def __init__(self, items: Any, budget: RenderBudget):
        self._items, self._budget = items, budget

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Any]:
        tick = self._budget.tick
        for item in self._items:
            tick()
            yield item


_active = threading.local()


def current() -> RenderBudget:
    """The budget of the render on this thread; outside one, size limits only."""
    budget = getattr(_active, "budget", None)
    return budget if budget is not None else RenderBudget()


def input_size(messages: list[dict], variables: Mapping[str, Any]) -> int:
    """Characters of a render's input (what its size limit grows with): message contents, and
    everything else the template is given except messages made of role and content only."""
    n = 0
    for m in messages:
        content = m.get("content")
        if type(content) is str and len(m) <= 2:
            n += len(content) + 32
        else:
            n += text_size(m, sys.maxsize)
    for key, value in variables.items():
        if key != "messages":
            n += text_size(value, sys.maxsize)
    return n


def render_limited(
    template: jinja2.Template, variables: dict[str, Any], budget: RenderBudget
) -> str:
    """Render `template` (compiled by a LimitedSandbox) under `budget` on this thread.

    Raises:
        TemplateLimitError: a limit was hit (RecursionError and MemoryError included).
        Whatever else the template raises.
    """
    outer = getattr(_active, "budget", None)
    _active.budget = budget
    try:
        pieces: list[str] = []
        total, limit = 0, budget.size_limit
        for piece in template.generate(**variables):
            total += len(piece)
            if total > limit:
                budget.check_text(total, "an output")
            pieces.append(piece)
        return "".join(pieces)
    except RecursionError:
        raise TemplateLimitError(
            "recursed too deeply (a macro that calls itself without end?)"
        ) from None
    except MemoryError:
        raise TemplateLimitError("ran out of memory") from None
    finally:
        _active.budget = outer


# --- sizes --------------------------------------------------------------------------------------
def text_size(value: Any, limit: int) -> int:
    """About how many characters `value` becomes as text (str(), `~`, join, tojson): a shared
    item counts once per place it appears, as it prints. Stops counting past `limit`."""
    if type(value) is str:
        return len(value)
    memo: dict[int, int] = {}

    def size(v: Any) -> int:
        t = type(v)
        if t is str:
            return len(v)
        if t is int:
            return v.bit_length() // 3 + 2
        if v is None or t is bool or t is float:
            return 8
        if isinstance(v, _SIZED):
            return len(v) if isinstance(v, str) else 4 * len(v)
        key = id(v)
        if key in memo:
            return memo[key]
        memo[key] = 3  # a cycle prints as [...]
        if isinstance(v, Namespace):
            v = v._Namespace__attrs  # its repr shows them
        total = 2
        if t is dict or isinstance(v, Mapping):
            for k, x in v.items():
                total += size(k) + size(x) + 4
                if total > limit:
                    break
        elif t is list or t is tuple or isinstance(v, (list, tuple, set, frozenset)):
            for x in v:
                total += size(x) + 2
                if total > limit:
                    break
        else:
            total = 32  # Undefined, a macro, a loop...: a short repr
        memo[key] = total
        return total

    return size(value)


def _replaced_size(s: str | bytes, old: Any, new: Any, count: Any = -1) -> int:
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * max(0, len(new) - len(old))


def _width(w: Any) -> int:
    return w if isinstance(w, int) else len(w) if isinstance(w, str) else 0


# printf conversions: %[(key)][flags][width][.precision]; `*` takes the number from the args
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d*)(?:\.(\*|\d*))?")


def _printf_size(fmt: str | bytes, args: Any, budget: RenderBudget) -> int:
    """Characters `fmt % args` can produce (a mapping key may be used many times)."""
    text = fmt if isinstance(fmt, str) else fmt.decode("latin-1")
    values = (
        list(args.values())
        if isinstance(args, Mapping)
        else list(args)
        if isinstance(args, tuple)
        else [args]
    )
    widths = stars = conversions = 0
    for m in _PRINTF.finditer(text):
        conversions += 1
        for g in m.groups():
            if g == "*":
                stars += 1
            elif g:
                if len(g) > 9:
                    budget.check_text(10 ** len(g), "a formatted string")
                widths += int(g)
    if stars:
        widths += stars * max((v for v in values if isinstance(v, int)), default=0)
    largest = max((text_size(v, budget.size_limit) for v in values), default=0)
    return len(text) + widths + conversions * largest


def _format_spec_width(spec: str, budget: RenderBudget) -> int:
    numbers = re.findall(r"\d+", spec)
    if any(len(n) > 9 for n in numbers):
        budget.check_text(10**9, "a formatted field")
    return max((int(n) for n in numbers), default=0)


def check_binop(op: str, left: Any, right: Any, budget: RenderBudget) -> None:
    """Refuse `left op right` before Python builds a result over the limits."""
    if op == "*":
        if isinstance(left, int) and not isinstance(right, int):
            left, right = right, left
        if isinstance(right, int) and not isinstance(right, bool):
            if isinstance(left, _SIZED):
                budget.check_text(len(left) * max(right, 0), "a repeated string")
            elif isinstance(left, _SEQUENCES):
                budget.check_items(len(left) * max(right, 0), "a repeated list")
            elif isinstance(left, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise TemplateLimitError(f"would build an integer of over {MAX_INT_BITS:,} bits")
    elif op == "+":
        if isinstance(left, _SIZED) and isinstance(right, _SIZED):
            budget.check_text(len(left) + len(right), "a string")
        elif isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
            budget.check_items(len(left) + len(right), "a list")
    elif op == "%":
        if isinstance(left, _SIZED):
            budget.check_text(_printf_size(left, right, budget), "a formatted string")
    elif op == "**":
        if (
            isinstance(left, int)
            and isinstance(right, int)
            and right > 0
            and abs(left) > 1
            and left.bit_length() * right > MAX_INT_BITS
        ):
            raise TemplateLimitError(f"would build an integer of over {MAX_INT_BITS:,} bits")


# str and bytes methods that can build much more than they are given: name -> result size
_METHOD_SIZES: dict[str, Callable[..., int]] = {
    "center": lambda s, width, *a: max(len(s), _width(width)),
    "ljust": lambda s, width, *a: max(len(s), _width(width)),
    "rjust": lambda s, width, *a: max(len(s), _width(width)),
    "zfill": lambda s, width: max(len(s), _width(width)),
    "expandtabs": lambda s, tabsize=8: len(s) * max(_width(tabsize), 1),
    "replace": _replaced_size,
    "translate": lambda s, table, *a: (
        len(s) * max([len(v) for v in table.values() if isinstance(v, _SIZED)] + [1])
        if isinstance(table, Mapping)
        else len(s)
    ),
}


def check_striptags(text: Any, budget: RenderBudget) -> None:
    """markupsafe's striptags copies the text once per tag it removes: quadratic."""
    text = str(text)
    work = min(text.count("<"), text.count(">")) * len(text)
    if work > 16 * budget.size_limit:
        raise TemplateLimitError(
            f"would make striptags copy {work:,} characters, over its limit of "
            f"{16 * budget.size_limit:,}"
        )


_LIST_METHODS = frozenset({"append", "pop"})


def check_call(obj: Any, args: tuple, kwargs: dict, budget: RenderBudget) -> tuple:
    """Refuse a str/bytes method call that would build too much, or an append past MAX_ITEMS;
    returns the args to call with (join's iterable made a list, so it can be measured and
    still be joined)."""
    owner = getattr(obj, "__self__", None)
    if type(owner) is list and getattr(obj, "__name__", "") == "append":
        budget.check_items(len(owner) + 1, "a list by append()")
        return args
    if not isinstance(owner, _SIZED):
        return args
    name = getattr(obj, "__name__", "")
    if name == "striptags":
        check_striptags(owner, budget)
    if name == "join" and len(args) == 1 and not kwargs:
        items = list(args[0])
        budget.check_items(len(items), "a joined list")
        budget.check_text(
            len(owner) * len(items) + text_size(items, budget.size_limit), "a joined string"
        )
        return (items,)
    estimate = _METHOD_SIZES.get(name)
    if estimate is not None:
        try:
            n = estimate(owner, *args, **kwargs)
        except (TypeError, ValueError, AttributeError):
            return args  # bad arguments: the call itself says so
        budget.check_text(n, f"a string with {name}()")
    return args


# --- filters --------------------------------------------------------------------------------------
# filter name -> size of the result (characters), from the filter's own arguments
def _join_size(value: list, d: Any = "", attribute: Any = None) -> int:
    return len(value) * _width(d) + text_size(value, current().size_limit)


def _indent_size(s: Any, width: Any = 4, *a: Any, **kw: Any) -> int:
    s = str(s)
    return len(s) + (s.count("\n") + 1) * _width(width)


def _wordwrap_size(
    s: Any,
    width: Any = 79,
    break_long_words: Any = True,
    wrapstring: Any = None,
    *a: Any,
    **kw: Any,
) -> int:
    s = str(s)
    return len(s) + (len(s) // max(_width(width), 1) + 1) * max(_width(wrapstring), 1)


def _format_size(value: Any, *args: Any, **kwargs: Any) -> int:
    return _printf_size(str(value), kwargs or args, current())


def _tojson_size(x: Any, ensure_ascii: Any = False, indent: Any = None, *a: Any, **kw: Any) -> int:
    if _width(indent) > 64:
        raise TemplateLimitError(f"asked tojson for an indent of {_width(indent):,} (at most 64)")
    return 0


def _sum_size(iterable: list, attribute: Any = None, start: Any = 0) -> int:
    if isinstance(start, (*_SEQUENCES, *_SIZED)):  # quadratic: each step copies what it has so far
        n = len(start) + sum(len(x) for x in iterable if isinstance(x, (*_SEQUENCES, *_SIZED)))
        current().check_items(n, "a summed list")
        work = len(iterable) * n // 2
        if work > 16 * MAX_ITEMS:
            raise TemplateLimitError(
                f"would make sum copy {work:,} items, over its limit of {16 * MAX_ITEMS:,}"
            )
    return 0


def _batch_size(value: Any, linecount: Any, fill_with: Any = None) -> int:
    current().check_items(_width(linecount), "a batch")
    return 0


def _striptags_size(value: Any) -> int:
    check_striptags(value, current())
    return 0


def _list_size(value: Any) -> int:
    if isinstance(value, _SIZED):
        current().check_items(len(value), "a list of characters")
    return 0


_FILTER_SIZES: dict[str, Callable[..., int]] = {
    "join": _join_size,
    "center": lambda value, width=80: max(len(str(value)), _width(width)),
    "indent": _indent_size,
    "replace": lambda s, old, new, count=None: _replaced_size(
        str(s), str(old), str(new), -1 if count is None else count
    ),
    "wordwrap": _wordwrap_size,
    "format": _format_size,
    "tojson": _tojson_size,
    "sum": _sum_size,
    "batch": _batch_size,
    "list": _list_size,
    "striptags": _striptags_size,
}
_MATERIALIZE = {"join", "sum"}  # filters whose iterable is measured, so it is made a list first
# filters that do not turn their arguments into text: a container given to them is not measured
# (templates call `messages|length` and the like once per message)
_CONTAINER_FILTERS = frozenset(
    {
        "abs",
        "attr",
        "batch",
        "count",
        "d",
        "default",
        "dictsort",
        "first",
        "float",
        "groupby",
        "int",
        "items",
        "last",
        "length",
        "list",
        "map",
        "max",
        "min",
        "reject",
        "rejectattr",
        "reverse",
        "round",
        "select",
        "selectattr",
        "slice",
        "sort",
        "sum",
        "unique",
        "random",
        "join",
    }
)


def _guard_filter(name: str, f: Callable) -> Callable:
    n_pass = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0
    estimate = _FILTER_SIZES.get(name)
    label = f"the {name} filter"
    measure_args = name not in _CONTAINER_FILTERS

    @wraps(f)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = getattr(_active, "budget", None)
        if budget is None:  # jinja folding a constant while it compiles: the render will run it
            raise TemplateLimitError(f"{label} runs only inside a limited render")
        budget.tick()
        if (
            name in _MATERIALIZE
            and len(args) > n_pass
            and not isinstance(args[n_pass], (*_SEQUENCES, *_SIZED))
        ):
            items = list(args[n_pass])
            budget.check_items(len(items), f"a list for {label}")
            args = (*args[:n_pass], items, *args[n_pass + 1 :])
        if measure_args:  # a container of shared strings prints larger than it is
            for a in (*args[n_pass:], *kwargs.values()):
                if type(a) is not str:
                    budget.check_text(
                        text_size(a, budget.size_limit), f"the text of an argument to {label}"
                    )
        if estimate is not None:
            try:
                n = estimate(*args[n_pass:], **kwargs)
            except (TypeError, ValueError, AttributeError):
                n = 0  # bad arguments: the filter itself says so
            budget.check_text(n, f"a string with {label}")
        result = f(*args, **kwargs)
        if budget.oversized(result):
            budget.check_result(result, label)
        return result

    return guarded


# --- the environment ------------------------------------------------------------------------------
class _SizedFormatter(SandboxedFormatter):
    """str.format in the sandbox, counting what the fields add up to (`'{0}{0}{0}'` included)."""

    _total = 0

    def vformat(self, format_string: str, args: Any, kwargs: Any) -> str:
        self._total = len(format_string)
        return super().vformat(format_string, args, kwargs)

    def format_field(self, value: Any, format_spec: str) -> Any:
        budget = current()
        self._total += _format_spec_width(format_spec, budget) + text_size(value, budget.size_limit)
        budget.check_text(self._total, "a formatted string")
        return super().format_field(value, format_spec)


class _SizedEscapeFormatter(_SizedFormatter, SandboxedEscapeFormatter):
    pass


class _CodeGenerator(CodeGenerator):
    """jinja's code generator, with every for loop ticking the budget once per item and
    `a ~ b` measuring its parts before joining them."""

    _loop_iters: set[int] | None = None

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        if self._loop_iters is None:
            self._loop_iters = set()
        self._loop_iters.add(id(node.iter))  # jinja has no custom nodes: marked by identity
        super().visit_For(node, frame)

    def visit(self, node: nodes.Node, *args: Any, **kwargs: Any) -> Any:
        if self._loop_iters and id(node) in self._loop_iters:
            self._loop_iters.discard(id(node))
            self.write("environment.ticking(")
            super().visit(node, *args, **kwargs)
            self.write(")")
            return None
        return super().visit(node, *args, **kwargs)

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        else:
            join = "markup_join" if frame.eval_ctx.autoescape else "str_join"
        self.write(f"environment.checked_join({join}, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


def _range(*args: Any) -> range:
    rng = safe_range(*args)
    budget = current()
    budget.range_left -= len(rng)
    if budget.range_left < 0:
        raise TemplateLimitError(f"asked range() for more than {RANGE_TOTAL:,} items in all")
    return rng


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    current().check_text(_width(n) * _width(max) * 12, "lorem ipsum")
    return generate_lorem_ipsum(n, html, min, max)


def _finalize(value: Any) -> Any:
    """Every `{{ }}` output goes through here before str(): a list of shared strings may print
    far larger than it is."""
    if not isinstance(value, str):
        budget = current()
        budget.check_text(text_size(value, budget.size_limit), "printed text")
    return value


def _concat(pieces: Iterable[str]) -> str:
    """Joins the buffers of macros, `{% set %}` blocks and call blocks."""
    if not isinstance(pieces, list):
        pieces = list(pieces)
    budget = current()
    budget.tick()
    budget.check_text(sum(map(len, pieces)), "a block's text")
    return "".join(pieces)


class LimitedSandbox(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment whose hooks apply the active RenderBudget."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self, **options: Any):
        super().__init__(finalize=_finalize, **options)
        self.concat = _concat  # type: ignore[method-assign]
        self.globals["range"] = _range
        self.globals["lipsum"] = _lipsum

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        # llama.cpp's engine lets templates append to and pop from lists (Kimi-K2-Thinking
        # builds one); nothing else mutable is allowed, and appends are counted (check_call)
        if type(obj) is list and attr in _LIST_METHODS:
            return True
        return super().is_safe_attribute(obj, attr, value)

    def guard_filters(self) -> None:
        """Wrap every filter (call once, after adding your own)."""
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}

    def ticking(self, iterable: Any) -> _Ticking:
        return _Ticking(iterable, current())

    # `~` and `+` on strings build most of a prompt: under MIN_SIZE_LIMIT (the least any render
    # allows) they need no budget.
    def checked_join(self, join: Callable[[Iterable[Any]], str], values: tuple) -> str:
        if None in values:  # llama.cpp: `none ~ 'text'` is 'text', not 'Nonetext'
            values = tuple("" if v is None else v for v in values)
        n = 0
        for v in values:
            if type(v) is not str:
                budget = current()
                n += text_size(v, budget.size_limit)
            else:
                n += len(v)
        if n > MIN_SIZE_LIMIT:
            current().check_text(n, "a joined string")
        return join(values)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "+" and type(left) is str and type(right) is str:
            if len(left) + len(right) > MIN_SIZE_LIMIT:
                current().check_text(len(left) + len(right), "a string")
            return left + right
        if operator == "+" and (
            left is None and isinstance(right, str) or right is None and isinstance(left, str)
        ):
            return left or right  # llama.cpp concatenates none with text as the empty string
        budget = current()
        budget.tick()
        check_binop(operator, left, right, budget)
        return self.binop_table[operator](left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = current()
        budget.tick()
        args = check_call(__obj, args, kwargs, budget)
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level ticks too
            args = (_Ticking(args[0], budget), *args[1:])
        budget.depth += 1
        try:
            if budget.depth > MAX_CALL_DEPTH:
                what = "macro" if isinstance(__obj, Macro) else "call"
                raise TemplateLimitError(
                    f"nested {what}s more than {MAX_CALL_DEPTH} deep (a macro that "
                    "calls itself without end?)"
                )
            result = super().call(__context, __obj, *args, **kwargs)
        finally:
            budget.depth -= 1
        if budget.oversized(result):
            budget.check_result(result, f"{getattr(__obj, '__name__', 'a call')}()")
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """jinja's, with a formatter that counts the characters each field adds."""
        if not isinstance(value, (MethodType, BuiltinMethodType)) or value.__name__ not in (
            "format",
            "format_map",
        ):
            return None
        owner = value.__self__
        if not isinstance(owner, str):
            return None
        formatter: SandboxedFormatter
        if isinstance(owner, Markup):
            formatter = _SizedEscapeFormatter(self, escape=owner.escape)
        else:
            formatter = _SizedFormatter(self)
        is_format_map = value.__name__ == "format_map"
        str_type = type(owner)

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_format_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs, args = args[0], ()
            return str_type(formatter.vformat(owner, args, kwargs))

        return wraps(value)(wrapper)
