"""Anthropic Messages API: POST /v1/messages and POST /v1/messages/count_tokens.

A Messages body is converted to a chat-completions body, as llama-server's
server_chat_convert_anthropic_to_oai does, and then goes the chat route's way: the same
template rendering, tokenization, sampling parameters and scheduler. What is Anthropic's
own is the conversion in and the shapes out:

    system (text or text blocks)      -> a system message
    text / image / thinking blocks    -> content parts / image parts / reasoning_content
    tool_use blocks                   -> the assistant message's tool_calls
    tool_result blocks                -> role "tool" messages after the message holding them
    tools[].input_schema              -> OpenAI function tools for the template
    stop_sequences, max_tokens (4096 when absent: llama-server is lenient there), temperature,
    top_p, top_k, stream, chat_template_kwargs; every other field is ignored, as llama-server does.

The reply is read by tool_calls (reasoning, text, tool calls) into thinking, text and
tool_use blocks, streamed as message_start, content_block_start/delta/stop (blocks numbered
in order, each closed before the next opens), message_delta and message_stop.

Errors keep the server's {"error": {code, message, type}} body, which llama-server sends on
these routes too, with "type": "error" added at the top so that Anthropic's clients read
them as well. Images (base64 or url sources) become image parts, which engine/server/media.py
loads; without a multimodal projector they are llama-server's 500 "image input is not supported".
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from ..errors import APIError
from ..sequence import GenerationStep
from . import requests as rq
from .bodies import parse_body
from .errors import api_error, format_validation_errors, invalid
from .routing import (
    SSE_HEADERS,
    EventStream,
    body_schema,
    client_gone,
    collect,
    server_state,
    submit,
)
from .schemas import ChatCompletionRequest, ChatMessage, few_stops
from .tool_calls import ReplyReading, StreamParser, ToolCall, new_call_id

router = APIRouter()

DEFAULT_MAX_TOKENS = 4096  # llama-server's value when a request leaves max_tokens out


# -- request bodies ---------------------------------------------------------------------------


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = Field(..., min_length=1, max_length=64)
    content: str | list[dict[str, Any]] | None = None


class CountTokensRequest(BaseModel):
    """POST /v1/messages/count_tokens; fields nobody reads here are ignored, as llama-server does."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[AnthropicMessage]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | str | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int | None = Field(None, ge=-1)
    stop_sequences: list[str] | str | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)

    @field_validator("stop_sequences")
    @classmethod
    def _few_stops(cls, v):
        return few_stops(v)


class _ChatBody(ChatCompletionRequest):
    """The converted body: a chat-completions request, but an empty conversation is allowed
    (llama-server renders it: the template's generation prompt alone)."""

    messages: list[ChatMessage] = Field(default_factory=list)


# -- Anthropic -> chat completions --------------------------------------------------------------


def _billing_header(text: str) -> str:
    """Claude Code's system prompt starts with a per-request `cch=xxxxx;` stamp that would
    defeat prompt caching; llama-server blanks it to fffff, and so does this."""
    prefix = "x-anthropic-billing-header:"
    if not text.startswith(prefix):
        return text
    i = text.find("cch=", len(prefix))
    if i < 0 or i + 9 >= len(text) or text[i + 9] != ";":
        return text
    return text[: i + 4] + "fffff" + text[i + 9 :]


def _image_part(block: dict[str, Any]) -> dict[str, Any] | None:
    source = block.get("source")
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type') or 'image/jpeg'};base64,{source.get('data') or ''}"
    elif source.get("type") == "url":
        url = str(source.get("url") or "")
    else:
        return None  # file ids and the like: dropped, as llama-server drops them
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result(block: dict[str, Any]) -> dict[str, Any]:
    content = block.get("content")
    if isinstance(content, list):
        parts: list[dict[str, Any]] = []
        has_images = False
        for c in content:
            if not isinstance(c, dict):
                continue
            if c.get("type") == "text":
                parts.append({"type": "text", "text": str(c.get("text") or "")})
            elif c.get("type") == "image":
                has_images = True
                image = _image_part(c)
                if image is not None:
                    parts.append(image)
        if has_images:  # parts, as OpenAI's multimodal tool messages have them
            out: str | list[dict[str, Any]] = parts
        else:  # text only: one string, as every template can take
            out = "".join(p["text"] for p in parts)
    else:
        out = content if isinstance(content, str) else ""
    return {"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), "content": out}


def _convert_message(i: int, msg: AnthropicMessage) -> list[dict[str, Any]]:
    """One Anthropic message -> chat messages (itself, then a tool message per tool_result)."""
    raw = msg.model_dump(exclude_unset=True)
    if "content" not in msg.model_fields_set:
        if msg.role == "assistant":
            return []  # nothing said: llama-server drops it
        raise invalid(f"messages[{i}]: all non-assistant messages must contain 'content'")
    if not isinstance(msg.content, list):
        return [raw]
    content: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    reasoning = ""
    for j, block in enumerate(msg.content):
        kind = block.get("type")
        if kind == "text":
            if not isinstance(block.get("text", ""), str):
                raise invalid(f"messages[{i}].content[{j}]: 'text' must be a string")
            content.append({"type": "text", "text": block.get("text", "")})
        elif kind == "thinking":
            reasoning += str(block.get("thinking") or "")
        elif kind == "image":
            part = _image_part(block)
            if part is not None:
                content.append(part)
        elif kind == "tool_use":
            args = block.get("input", {})
            tool_calls.append(
                {
                    "id": str(block.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name") or ""),
                        "arguments": json.dumps(
                            args if args is not None else {}, ensure_ascii=False
                        ),
                    },
                }
            )
        elif kind == "tool_result":
            results.append(_tool_result(block))
        # redacted_thinking, document, server tool blocks...: nothing a local model can use
    out: list[dict[str, Any]] = []
    if content or tool_calls or reasoning:
        m: dict[str, Any] = {"role": msg.role, "content": content or ""}
        if tool_calls:
            m["tool_calls"] = tool_calls
        if reasoning:
            m["reasoning_content"] = reasoning
        out.append(m)
    return out + results


def _tool_choice(choice: dict[str, Any] | str | None) -> str | None:
    kind = choice.get("type") if isinstance(choice, dict) else choice
    return {"auto": "auto", "any": "required", "tool": "required", "none": "none"}.get(str(kind))


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise invalid(f"tools[{i}]: 'name' must be a non-empty string")
        schema = t.get("input_schema", {})
        if not isinstance(schema, dict):
            raise invalid(f"tools[{i}]: 'input_schema' must be a JSON schema object")
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": str(t.get("description") or ""),
                    "parameters": schema,
                },
            }
        )
    return out


def to_chat(body: CountTokensRequest) -> _ChatBody:
    """The chat-completions body llama-server would make of an Anthropic one."""
    messages: list[dict[str, Any]] = []
    if body.system is not None:
        if isinstance(body.system, str):
            system = _billing_header(body.system)
        else:
            system = "".join(
                _billing_header(str(b.get("text") or ""))
                for b in body.system
                if b.get("type") == "text"
            )
        messages.append({"role": "system", "content": system})
    for i, m in enumerate(body.messages):
        messages.extend(_convert_message(i, m))
    chat: dict[str, Any] = {"messages": messages, "model": body.model}
    tools = _tools(body.tools)
    if tools:
        chat["tools"] = tools
    choice = _tool_choice(body.tool_choice)
    if choice is not None:
        chat["tool_choice"] = choice
    if body.chat_template_kwargs is not None:
        chat["chat_template_kwargs"] = body.chat_template_kwargs
    if isinstance(body, MessagesRequest):
        chat["max_tokens"] = DEFAULT_MAX_TOKENS if body.max_tokens is None else body.max_tokens
        chat["stop"] = body.stop_sequences
        chat.update(
            body.model_dump(include={"temperature", "top_p", "top_k", "stream"}, exclude_none=True)
        )
    try:
        return _ChatBody.model_validate(chat)
    except ValidationError as e:
        raise invalid(format_validation_errors(e.errors(include_url=False))) from None


# -- responses --------------------------------------------------------------------------------


def _sse(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def error_body(e: APIError) -> dict[str, Any]:
    """The server's error body, readable by Anthropic's clients too ("type": "error")."""
    return {"type": "error", **e.body()}


class MessageBuilder:
    """The Anthropic message (or its stream events) of one request's steps."""

    def __init__(
        self,
        model: str,
        *,
        tool_names: list[str],
        parse_tools: bool,
        reasoning: bool,
        starts_inside: bool,
        stop_sequences: list[str],
        n_prompt: int,
        harmony: bool = False,
    ):
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model = model
        self.parser = StreamParser(
            tool_names=tool_names,
            parse_tools=parse_tools,
            reasoning=reasoning,
            starts_inside=starts_inside,
            harmony=harmony,
        )
        self.stop_sequences = stop_sequences
        self.n_prompt, self.n_cached, self.n_decoded = n_prompt, 0, 0
        self.last: GenerationStep | None = None
        self.started = False
        self.blocks: list[
            str
        ] = []  # kinds of the blocks opened, in order; the last one may be open
        self.open = False
        self.tool_calls: list[ToolCall] = []
        self._owed: list[tuple[str, str]] = []

    def prefill(self, text: str) -> None:
        """The reply continues `text` (an assistant prefill): it is the start of the answer."""
        self._owed = self.parser.feed(text)

    # -- shared ---------------------------------------------------------------------------------
    def add(self, step: GenerationStep) -> list[tuple[str, str]]:
        if self.last is None:
            self.n_prompt, self.n_cached = step.n_prompt, step.n_cached
        self.last = step
        self.n_decoded += 1
        owed, self._owed = self._owed, []
        return owed + self.parser.feed(step.text_delta)

    def stop_reason(self) -> str:
        if self.last is None or self.last.finish_reason != "stop":
            return "max_tokens"
        return "tool_use" if self.tool_calls else "end_turn"

    def stop_sequence(self) -> str | None:
        word = self.last.stop_word if self.last is not None else None
        return word if word and word in self.stop_sequences else None

    def usage(self) -> dict[str, int]:
        return {
            "cache_read_input_tokens": self.n_cached,
            "input_tokens": self.n_prompt - self.n_cached,
            "output_tokens": self.n_decoded,
        }

    def _message(
        self, content: list, stop_reason: str | None, stop_sequence: str | None, usage: dict
    ) -> dict:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": self.model,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage,
        }

    # -- one response ---------------------------------------------------------------------------
    def response(self) -> dict[str, Any]:
        _, msg = self.parser.finish()
        self.tool_calls = msg.tool_calls
        content: list[dict[str, Any]] = []
        if msg.reasoning:
            content.append({"type": "thinking", "thinking": msg.reasoning, "signature": ""})
        if msg.content:
            content.append({"type": "text", "text": msg.content})
        for call in msg.tool_calls:
            content.append(_tool_use(call))
        return self._message(content, self.stop_reason(), self.stop_sequence(), self.usage())

    # -- a stream -------------------------------------------------------------------------------
    def start_events(self) -> list[dict[str, Any]]:
        if self.started:
            return []
        self.started = True
        usage = {**self.usage(), "output_tokens": 0}
        return [{"type": "message_start", "message": self._message([], None, None, usage)}]

    def step_events(self, step: GenerationStep) -> list[dict[str, Any]]:
        deltas = self.add(step)
        return self.start_events() + self._delta_events(deltas)

    def _delta_events(self, deltas: list[tuple[str, str]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for kind, text in deltas:
            block = "thinking" if kind == "reasoning" else "text"
            if not (self.open and self.blocks[-1] == block):
                out += self._close() + self._open({"type": block, block: ""})
            field = "thinking" if block == "thinking" else "text"
            out.append(
                {
                    "type": "content_block_delta",
                    "index": len(self.blocks) - 1,
                    "delta": {"type": f"{block}_delta", field: text},
                }
            )
        return out

    def _open(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        self.blocks.append(block["type"])
        self.open = True
        return [
            {"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": block}
        ]

    def _close(self) -> list[dict[str, Any]]:
        if not self.open:
            return []
        self.open = False
        index = len(self.blocks) - 1
        out: list[dict[str, Any]] = []
        if self.blocks[-1] == "thinking":  # Anthropic's clients expect a signature before the stop
            out.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": ""},
                }
            )
        return out + [{"type": "content_block_stop", "index": index}]

    def final_events(self) -> list[dict[str, Any]]:
        deltas, msg = self.parser.finish()
        deltas, self._owed = self._owed + deltas, []
        self.tool_calls = msg.tool_calls
        out = self.start_events() + self._delta_events(deltas) + self._close()
        for call in msg.tool_calls:
            block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            out += self._open(block)
            out.append(
                {
                    "type": "content_block_delta",
                    "index": len(self.blocks) - 1,
                    "delta": {
                        "type": "input_json_delta",
                        "partial_json": json.dumps(call.input(), ensure_ascii=False),
                    },
                }
            )
            out += self._close()
        out.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": self.stop_reason(), "stop_sequence": self.stop_sequence()},
                "usage": {"output_tokens": self.n_decoded},
            }
        )
        out.append({"type": "message_stop"})
        return out


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": call.id or new_call_id("toolu_"),
        "name": call.name,
        "input": call.input(),
    }


# -- routes -----------------------------------------------------------------------------------


def _error(e: BaseException) -> JSONResponse:
    err = api_error(e)
    return JSONResponse(error_body(err), status_code=err.status)


def _prepare(s, body: MessagesRequest):
    """Scheduler request and reply reader of a Messages body (blocking: renders and tokenizes)."""
    chat = to_chat(body)
    req, prompt_text = rq.chat_request(s, chat)
    reading = rq.reply_reading(s, chat, prompt_text) or ReplyReading()
    builder = MessageBuilder(
        body.model or s.model_alias,
        tool_names=list(reading.tool_names),
        parse_tools=reading.parse_tools,
        reasoning=reading.reasoning,
        starts_inside=reading.starts_inside,
        stop_sequences=rq.stop_list(body.stop_sequences),
        n_prompt=len(req.prompt),
        harmony=reading.harmony,
    )
    builder.prefill(_prefill_text(chat, prompt_text))
    return req, builder


def _prefill_text(chat: _ChatBody, prompt_text: str) -> str:
    """The text of a final assistant message the prompt continues (llama-server answers it
    as the start of the reply); "" when the prompt does not end with it."""
    if not chat.messages or chat.messages[-1].role != "assistant" or chat.messages[-1].tool_calls:
        return ""
    content = chat.messages[-1].content
    if isinstance(content, list):
        texts = [p.text or "" for p in content if p.type in (None, "text")]
        candidates = ["\n\n".join(texts), "\n".join(texts), "".join(texts)]
    else:
        candidates = [content or ""]
    return next((t for t in candidates if t and prompt_text.endswith(t)), "")


@router.post("/v1/messages", openapi_extra=body_schema(MessagesRequest))
async def messages(request: Request) -> Response:
    s = server_state(request)
    try:
        body = await parse_body(request, MessagesRequest)
        req, builder = await run_in_threadpool(_prepare, s, body)
        if req.n_predict == 0:  # nothing to generate
            if body.stream:
                return EventStream(
                    _static_stream(builder), on_close=lambda: None, headers=SSE_HEADERS
                )
            return JSONResponse(builder.response())
        handle = submit(s, req)
    except Exception as e:
        return _error(e)
    if body.stream:
        return EventStream(_stream(handle, builder), on_close=handle.cancel, headers=SSE_HEADERS)
    try:
        if not await collect(request, handle, builder.add):
            return client_gone()
    except asyncio.CancelledError:
        handle.cancel()
        raise
    except Exception as e:
        handle.cancel()
        return _error(e)
    return JSONResponse(builder.response())


async def _stream(handle, builder: MessageBuilder):
    try:
        async for steps in handle.abatches():  # one write for the tokens that came together
            out = b"".join(_sse(event) for step in steps for event in builder.step_events(step))
            if out:
                yield out
        for event in builder.final_events():
            yield _sse(event)
    except Exception as e:  # headers are sent: the error goes in the stream
        yield _sse(error_body(api_error(e)))
    finally:
        if not handle.done:
            handle.cancel()


async def _static_stream(builder: MessageBuilder):
    for event in builder.final_events():
        yield _sse(event)


@router.post("/v1/messages/count_tokens", openapi_extra=body_schema(CountTokensRequest))
async def count_tokens(request: Request) -> Response:
    """{"input_tokens": N}: the prompt /v1/messages would evaluate, rendered and tokenized."""
    s = server_state(request)
    try:
        body = await parse_body(request, CountTokensRequest)

        def count() -> int:
            return len(rq.chat_prompt_tokens(s, to_chat(body)))

        return JSONResponse({"input_tokens": await run_in_threadpool(count)})
    except Exception as e:
        return _error(e)
