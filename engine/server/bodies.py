"""Request bodies, read under a size limit and decoded into JSON values that every later step
(pydantic, the chat template, json.dumps when a field is echoed) can handle.

`load_json` is the one decoder of the server's routes and of the router's proxy. Beyond
`json.loads` it refuses, with a 400:

- nesting deeper than MAX_JSON_DEPTH: Python's decoder, pydantic's serialiser, repr() and
  Jinja all recurse, so `[[[[...]]]]` would end in a RecursionError somewhere. llama-server's
  nlohmann parser is iterative and has no limit; no real request comes near this one;
- lone UTF-16 surrogates (`"\\ud800"`): Python decodes them into strings that cannot be
  encoded back, so echoing one fails. nlohmann rejects them at parse time too, with the
  messages used here;
- numbers that overflow a double (`1e999`) and the NaN/Infinity constants, which JSON does
  not have and which cannot be written back into a JSON response.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from .errors import format_validation_errors, invalid

MAX_JSON_DEPTH = 512

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_HIGH = "invalid string: surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF"
_LOW = "invalid string: surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF"

Body = TypeVar("Body", bound=BaseModel)


class _Rejected(ValueError):
    """A JSON text that parses but that this server refuses (its message is the answer)."""


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise invalid(f"request body too large ({int(declared)} bytes; the limit is {limit})")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise invalid(f"request body too large (more than {limit} bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The request's JSON object validated as `model`; every failure is a 400."""
    raw = await read_body(request, request.app.state.server.options.max_body_bytes)
    if not raw.strip():
        raise invalid("the request body is empty; expected a JSON object")
    data = load_json(raw)
    if not isinstance(data, dict):
        raise invalid(f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise invalid(format_validation_errors(e.errors(include_url=False))) from None


def load_json(raw: bytes) -> Any:
    """Decode a request body.

    Raises:
        APIError: 400, saying what is wrong (bad UTF-8, bad JSON, too deep, lone surrogate,
            a number out of range).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid(f"the request body is not valid UTF-8 (byte {e.start})") from None
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise invalid(
            f"the request body nests arrays and objects {depth} levels deep; "
            f"the limit is {MAX_JSON_DEPTH}"
        )
    try:
        data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except _Rejected as e:
        raise invalid(str(e)) from None
    except ValueError as e:
        raise invalid(f"malformed JSON in the request body: {e}") from None
    if _SURROGATE_ESCAPE.search(raw):
        _check_surrogates(data)
    return data


def json_depth(raw: bytes) -> int:
    """How deep arrays and objects nest in a JSON text (brackets inside strings excluded).

    Exact for valid JSON; for invalid JSON it is at least the depth json.loads reaches before
    it fails, since both read strings by the same rule up to that point.
    """
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return 0  # cannot be deeper than the limit: skip the scan for ordinary bodies
    brackets = np.frombuffer(_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS), np.uint8)
    opens = (brackets == ord("[")) | (brackets == ord("{"))
    return int(np.cumsum(opens.astype(np.int32) * 2 - 1).max(initial=0))


def _reject_constant(name: str):
    raise _Rejected(f"malformed JSON in the request body: {name} is not a valid JSON number")


def _finite_float(text: str) -> float:
    x = float(text)
    if math.isinf(x):
        raise _Rejected(f"the number {text[:32]} in the request body is out of range")
    return x


def _check_surrogates(data: Any) -> None:
    """Raise a 400 for the first string (or key) holding a lone surrogate, naming where."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, str):
            _check_text(node, where)
        elif isinstance(node, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(node))
        elif isinstance(node, dict):
            for k, v in node.items():
                _check_text(k, f"{where} (a key)" if where else "a key")
                stack.append((v, f"{where}.{k}" if where else k))


def _check_text(s: str, where: str) -> None:
    if s.isascii():
        return
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = ord(s[e.start])
        at = f" in '{where[:80]}'" if where else ""
        raise invalid(
            f"malformed JSON in the request body: {_HIGH if bad < 0xDC00 else _LOW}{at}"
        ) from None
