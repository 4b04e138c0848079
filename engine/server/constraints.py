"""From a request body to an output constraint: `grammar`, `json_schema`, `response_format`.

llama-server's rules (tools/server/server-common.cpp, server-schema.cpp):

- `grammar` is GBNF (llguidance also takes Lark text: a `start:` rule or `%llguidance`).
- `json_schema` is a JSON schema; an empty schema `{}` means any JSON object.
- chat `response_format`: `{"type": "text"}` constrains nothing; `{"type": "json_object"}`
  means any object, or the `schema` it carries; `{"type": "json_schema", "json_schema":
  {"schema": ...}}` is OpenAI's structured output (a `schema` next to `type` is accepted
  too); any other type is a 400.
- chat: `grammar` together with a JSON schema (from either field) is a 400 (llama-server
  answers 500), and so is `grammar` with tools.
- completions: a non-empty `grammar` wins over `json_schema` (llama-server's order).
  `response_format` is honoured there too (llama-server ignores it on completions).

Every invalid grammar or schema is a 400 whose message is the parser's, prefixed with the
field it came from; nothing here can answer 500.
"""

from __future__ import annotations

from typing import Any

from ..errors import GrammarError
from ..grammar import Grammar, compile_grammar
from .errors import invalid, not_supported
from .schemas import ChatCompletionRequest, OpenAICommon

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")


def request_grammar(body: OpenAICommon, *, chat: bool, tokenizer: Any = None) -> Grammar | None:
    """The constraint a chat or completion body asks for, or None.

    Args:
        body: a chat or text completion's body (reads `grammar`, `json_schema`,
            `response_format`, `grammar_lazy`, and a chat's `tools` and `tool_choice`).
        chat: a chat completion (llama-server's chat rules) rather than a completion.
        tokenizer: the model's tokenizer: the grammar is checked against its vocabulary,
            which is built here once (on the request's thread, not the scheduler's).

    Raises:
        APIError: 400 naming the field and the problem; 501 for a lazy grammar.
    """
    grammar = body.grammar or ""
    schema = body.json_schema
    rf_schema = response_format_schema(body.response_format)
    if rf_schema is not None:
        schema = rf_schema
    if grammar and schema is not None:
        if chat or rf_schema is not None:
            raise invalid(
                "Cannot use both json_schema and grammar (response_format sets a JSON schema)"
                if rf_schema is not None
                else "Cannot use both json_schema and grammar"
            )
        schema = None  # completions: the grammar wins, as in llama-server
    if chat and grammar and isinstance(body, ChatCompletionRequest) and _has_tools(body):
        raise invalid("Cannot use custom grammar constraints with tools.")
    if body.grammar_lazy and (grammar or schema is not None):
        raise not_supported(
            "grammar_lazy is not supported: the grammar applies from the first token"
        )
    if grammar:
        return _compile("grammar", "gbnf", grammar, tokenizer)
    if schema is not None:
        field = "response_format" if rf_schema is not None else "json_schema"
        if isinstance(schema, dict) and not schema:
            schema = {"type": "object"}  # llama-server: an empty schema means any object
        return _compile(field, "json_schema", schema, tokenizer)
    return None


def response_format_schema(rf: Any) -> Any:
    """The JSON schema an OpenAI `response_format` asks for, or None for plain text.

    Raises:
        APIError: 400 for a type other than text / json_object / json_schema.
    """
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise invalid('\'response_format\' must be an object such as {"type": "json_object"}')
    kind = rf.get("type", "")
    if kind in ("", "text", None):
        return None
    if kind == "json_object":
        return rf.get("schema", {})
    if kind == "json_schema":
        wrapper = rf.get("json_schema")
        if isinstance(wrapper, dict) and "schema" in wrapper:
            return wrapper["schema"]
        if wrapper is not None and not isinstance(wrapper, dict):
            raise invalid("response_format.json_schema must be an object with a 'schema'")
        return rf.get("schema", {})
    raise invalid(
        f'response_format type must be one of "text", "json_object" or '
        f'"json_schema", but got: {str(kind)[:80]}'
    )


def _compile(field: str, kind: str, source: Any, tokenizer: Any) -> Grammar:
    try:
        g = compile_grammar(kind, source)
        if tokenizer is not None:
            g.check_vocabulary(tokenizer)
    except GrammarError as e:
        raise invalid(f"{field}: {e}", param=field) from None
    return g


def _has_tools(body: ChatCompletionRequest) -> bool:
    return bool(body.tools) and body.tool_choice != "none"
