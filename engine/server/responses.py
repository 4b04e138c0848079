"""OpenAI Responses API: POST /v1/responses (plain and streaming) and
POST /v1/responses/input_tokens; /responses... without the /v1 prefix too.

A Responses body becomes a chat-completions body (`to_chat_body`, llama-server's
server_chat_convert_responses_to_chatcmpl rules) and goes through the chat pipeline:
requests.chat_request renders the template and builds the GenerationRequest, the scheduler
generates, and ResponsesFormatter shapes the steps as one `response` object or a stream of
typed events:

    response.created, response.in_progress          at once (progress again with return_progress)
    response.output_item.added, response.content_part.added     before the first text
    response.output_text.delta                      per piece of text (timings with timings_per_token)
    response.output_text.done, response.content_part.done, response.output_item.done
    response.completed                              the whole response, usage, timings

Each event is `event: <type>` + `data: {...}`; the stream has no `data: [DONE]`. Responses are
not stored, so `previous_response_id` is a 400: clients send the earlier turns as input items.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse

from . import requests as rq
from .bodies import parse_body
from .errors import api_error, format_validation_errors, invalid
from .openai import Formatter, sse, timings
from .routing import (
    SSE_HEADERS,
    EventStream,
    body_schema,
    client_gone,
    collect,
    server_state,
    submit,
)
from .schemas import ChatCompletionRequest

router = APIRouter()


class ResponsesRequest(BaseModel):
    """POST /v1/responses. Fields the chat pipeline knows (temperature, top_p, stream, the
    llama.cpp sampling fields...) pass through to ChatCompletionRequest, which rejects
    unknown ones; the Responses-only fields are declared here."""

    model_config = ConfigDict(extra="allow")

    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=0)
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    model: str | None = None
    stream: bool = False
    # accepted and ignored: nothing is stored or run in the background here
    include: list[str] | None = None
    truncation: str | None = None
    background: bool | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    stream_options: dict[str, Any] | None = None
    conversation: Any = None
    prompt: Any = None


# Responses fields with no chat-completions counterpart (converted or dropped)
_RESPONSES_ONLY = {
    "input",
    "instructions",
    "max_output_tokens",
    "previous_response_id",
    "tools",
    "tool_choice",
    "text",
    "reasoning",
    "include",
    "truncation",
    "background",
    "max_tool_calls",
    "top_logprobs",
    "stream_options",
    "conversation",
    "prompt",
}


# -- Responses body -> chat-completions body -------------------------------------------------


def to_chat_body(body: ResponsesRequest) -> dict[str, Any]:
    """The chat-completions body for a Responses body; a 400 for what cannot be converted."""
    if body.previous_response_id:
        raise invalid(
            "'previous_response_id' is not supported (responses are not stored): "
            "send the earlier turns as items of 'input'"
        )
    if body.conversation is not None or body.prompt is not None:
        raise invalid(
            "'conversation' and 'prompt' (stored objects) are not supported: send the turns in 'input'"
        )
    given = body.model_dump(exclude_unset=True)
    chat = {k: v for k, v in given.items() if k not in _RESPONSES_ONLY}
    messages: list[dict[str, Any]] = []
    if body.instructions is not None:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
    else:
        for i, item in enumerate(body.input):
            _add_item(messages, item, f"input[{i}]")
    if not messages:
        raise invalid("'input' is empty: give a string or at least one item")
    chat["messages"] = messages
    if body.max_output_tokens is not None:
        chat["max_tokens"] = body.max_output_tokens
    tools = [_chat_tool(t) for t in body.tools or () if t.get("type") == "function"]
    if tools:  # other tool types (web_search, file_search...) have no chat equivalent: skipped
        chat["tools"] = tools
    if body.tool_choice is not None:
        chat["tool_choice"] = _chat_tool_choice(body.tool_choice)
    if body.reasoning and body.reasoning.get("effort") is not None:
        chat["reasoning_effort"] = body.reasoning["effort"]
    fmt = (body.text or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object"):
        chat["response_format"] = _chat_response_format(fmt)
    return chat


def _add_item(messages: list[dict], item: dict[str, Any], where: str) -> None:
    """Append one input item as chat messages; an assistant's items (its text, tool calls,
    reasoning) that follow each other make one assistant message, as in llama-server."""
    kind, role = item.get("type"), item.get("role")
    prev = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
    if role in ("user", "system", "developer") and kind in (None, "message"):
        messages.append({"role": role, "content": _input_parts(item.get("content"), where)})
    elif role == "assistant" and kind in (None, "message"):
        parts = _output_parts(item.get("content"), where)
        if prev is not None:
            prev["content"] = _as_parts(prev.get("content")) + parts
        else:
            messages.append({"role": "assistant", "content": parts})
    elif kind == "function_call":
        call = {
            "id": _text_field(item, "call_id", where),
            "type": "function",
            "function": {
                "name": _text_field(item, "name", where),
                "arguments": _text_field(item, "arguments", where),
            },
        }
        if prev is not None:
            prev.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        content = output if isinstance(output, str) else _input_parts(output, f"{where}.output")
        messages.append(
            {
                "role": "tool",
                "tool_call_id": _text_field(item, "call_id", where),
                "content": content,
            }
        )
    elif kind == "reasoning":
        text = "".join(p.get("text", "") for p in item.get("content") or () if isinstance(p, dict))
        if prev is not None:
            prev["reasoning_content"] = text
        else:
            messages.append({"role": "assistant", "content": None, "reasoning_content": text})
    else:
        raise invalid(
            f"{where}: cannot tell what this item is (type {kind!r}, role {role!r}); expected a "
            "message (role user/system/developer/assistant), function_call, "
            "function_call_output or reasoning item"
        )


def _text_field(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise invalid(f"{where}: '{key}' is required and must be a string")
    return value


def _as_parts(content: Any) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content or [])


def _input_parts(content: Any, where: str) -> list[dict] | str:
    """A user/system/tool message's content: a string, or input_text/input_image parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where}: 'content' must be a string or a list of content parts")
    out: list[dict] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "text"):
            if not isinstance(part.get("text"), str):
                raise invalid(f"{where}.content[{j}]: an input_text part requires 'text'")
            out.append({"type": "text", "text": part["text"]})
        elif kind == "input_image":
            out.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
        elif kind == "input_file":
            raise invalid(f"{where}.content[{j}]: 'input_file' parts are not supported")
        else:
            raise invalid(
                f"{where}.content[{j}]: part type must be one of 'input_text', 'input_image' "
                f"or 'input_file', got {kind!r}"
            )
    return out


def _output_parts(content: Any, where: str) -> list[dict]:
    """An assistant message's content: a string, or output_text/refusal parts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}: 'content' must be a string or a list of content parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = "refusal" if kind == "refusal" else "text"
        if kind not in ("output_text", "input_text", "refusal"):
            raise invalid(
                f"{where}.content[{j}]: part type must be 'output_text' or 'refusal', got {kind!r}"
            )
        if not isinstance(part.get(key), str):
            raise invalid(f"{where}.content[{j}]: a {kind} part requires '{key}'")
        out.append({"type": "text", "text": part[key]})  # a refusal is what the assistant said
    return out


def _chat_tool(tool: dict) -> dict:
    function = {k: v for k, v in tool.items() if k != "type"}
    function.setdefault("strict", True)
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict) -> str | dict:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _chat_response_format(fmt: dict) -> dict:
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


def chat_request_body(body: ResponsesRequest) -> ChatCompletionRequest:
    """The validated chat request for a Responses body (errors name the Responses fields)."""
    chat = to_chat_body(body)
    try:
        return ChatCompletionRequest.model_validate(chat)
    except ValidationError as e:
        msg = format_validation_errors(e.errors(include_url=False))
        raise invalid(
            msg.replace("max_tokens", "max_output_tokens").replace("messages.", "input item ")
        ) from None


# -- the response and its events -------------------------------------------------------------


def _rand_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


class ResponsesFormatter(Formatter):
    """A `response` object (plain) or the Responses event stream (stream)."""

    id_prefix = "resp_"

    def __init__(self, *a: Any, body: ResponsesRequest, chat: ChatCompletionRequest, **kw: Any):
        super().__init__(*a, **kw)
        self.id = _rand_id("resp_")
        self.message_id = _rand_id("msg_")
        self.body = body
        self.timings_per_token = bool(chat.timings_per_token)
        self.return_progress = bool(chat.return_progress)
        self.echo = {  # the request's settings, echoed as OpenAI's response object does
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "temperature": chat.temperature,
            "top_p": chat.top_p,
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
            "tools": body.tools or [],
            "metadata": body.metadata or {},
            "parallel_tool_calls": chat.parallel_tool_calls
            if chat.parallel_tool_calls is not None
            else True,
            "previous_response_id": None,
            "reasoning": body.reasoning,
            "store": False,
            "text": body.text or {"format": {"type": "text"}},
            "truncation": body.truncation or "disabled",
            "error": None,
            "incomplete_details": None,
        }
        self._seq = 0
        self._text_started = False
        self._progress_sent = False

    # plain
    def _usage(self) -> dict:
        u = super()._usage()
        return {
            "input_tokens": u["prompt_tokens"],
            "output_tokens": u["completion_tokens"],
            "total_tokens": u["total_tokens"],
            "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens_details": {"reasoning_tokens": 0},
        }

    def _message(self, status: str) -> dict:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": self.acc.content}
        return {
            "id": self.message_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [part],
        }

    def _output(self) -> list[dict]:
        return [self._message("completed")] if self.acc.content else []

    def _response(self, status: str, output: list[dict], usage: dict | None = None) -> dict:
        out = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            **self.echo,
        }
        if status == "completed":
            out["completed_at"] = int(time.time())
        if usage is not None:
            out["usage"] = usage
        return out

    def response(self) -> dict:
        return self._response("completed", self._output(), self._usage())

    # stream
    def _event(self, kind: str, **data: Any) -> dict:
        self._seq += 1
        return {"type": kind, "sequence_number": self._seq, **data}

    def start_events(self) -> list[dict]:
        return [
            self._event("response.created", response=self._response("in_progress", [])),
            self._event("response.in_progress", response=self._response("in_progress", [])),
        ]

    def step_events(self, step) -> list[dict]:
        events = []
        if self.return_progress and not self._progress_sent:
            # the scheduler reports the prompt once it is evaluated: one progress event, complete
            self._progress_sent = True
            progress = {
                "total": step.n_prompt,
                "cache": step.n_cached,
                "processed": step.n_prompt,
                "time_ms": int(step.t_prompt_ms),
            }
            events.append(
                {
                    **self._event(
                        "response.in_progress", response=self._response("in_progress", [])
                    ),
                    "prompt_progress": progress,
                }
            )
        if step.text_delta:
            if not self._text_started:
                self._text_started = True
                item = {
                    "id": self.message_id,
                    "type": "message",
                    "status": "in_progress",
                    "role": "assistant",
                    "content": [],
                }
                events.append(self._event("response.output_item.added", output_index=0, item=item))
                events.append(
                    self._event(
                        "response.content_part.added",
                        item_id=self.message_id,
                        output_index=0,
                        content_index=0,
                        part={"type": "output_text", "text": "", "annotations": []},
                    )
                )
            events.append(
                self._event(
                    "response.output_text.delta",
                    item_id=self.message_id,
                    output_index=0,
                    content_index=0,
                    delta=step.text_delta,
                    logprobs=[],
                )
            )
            if self.timings_per_token:
                events[-1]["timings"] = timings(step, self._n())
        return events

    def final_events(self) -> list[dict]:
        events = []
        output = self._output()
        if output:
            message = output[0]
            part = message["content"][0]
            events.append(
                self._event(
                    "response.output_text.done",
                    item_id=self.message_id,
                    output_index=0,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
            )
            events.append(
                self._event(
                    "response.content_part.done",
                    item_id=self.message_id,
                    output_index=0,
                    content_index=0,
                    part=part,
                )
            )
            events.append(self._event("response.output_item.done", output_index=0, item=message))
        completed = self._event(
            "response.completed", response=self._response("completed", output, self._usage())
        )
        completed["timings"] = self._timings()
        events.append(completed)
        return events


def event_sse(event: dict) -> bytes:
    """One Responses event: `event: <type>` then its data line."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


# -- routes ----------------------------------------------------------------------------------


async def _chat_from(request: Request):
    s = server_state(request)
    body = await parse_body(request, ResponsesRequest)
    chat = chat_request_body(body)
    req, _ = await run_in_threadpool(rq.chat_request, s, chat)
    return s, body, chat, req


@router.post("/v1/responses", openapi_extra=body_schema(ResponsesRequest))
@router.post("/responses", openapi_extra=body_schema(ResponsesRequest), include_in_schema=False)
async def create_response(request: Request):
    s, body, chat, req = await _chat_from(request)
    fmt = ResponsesFormatter(s, body.model or s.model_alias, s.tokenizer, body=body, chat=chat)
    if body.stream:
        handle = submit(s, req) if req.n_predict != 0 else None
        return EventStream(
            _stream(handle, fmt, len(req.prompt)),
            on_close=handle.cancel if handle is not None else (lambda: None),
            headers=SSE_HEADERS,
        )
    if req.n_predict == 0:  # nothing to generate: an empty response, as llama-server
        fmt.acc.last = fmt.empty_step(len(req.prompt))
        return JSONResponse(fmt.response())
    handle = submit(s, req)
    try:
        if not await collect(request, handle, fmt.add):
            return client_gone()
    except asyncio.CancelledError:
        handle.cancel()
        raise
    except Exception as e:
        raise api_error(e) from None
    if fmt.acc.last is None:  # ended without a token (server shutting down)
        fmt.acc.last = fmt.empty_step(len(req.prompt))
    return JSONResponse(fmt.response())


async def _stream(handle, fmt: ResponsesFormatter, n_prompt: int):
    try:
        for event in fmt.start_events():
            yield event_sse(event)
        if handle is not None:
            async for steps in handle.abatches():  # one write for the tokens that came together
                out = []
                for step in steps:
                    fmt.add(step)
                    out += [event_sse(event) for event in fmt.step_events(step)]
                if out:
                    yield b"".join(out)
        if fmt.acc.last is None:
            fmt.acc.last = fmt.empty_step(n_prompt)
        for event in fmt.final_events():
            yield event_sse(event)
    except Exception as e:  # headers are sent: the error goes in the stream, as llama-server's
        yield sse(api_error(e).body())
    finally:
        if handle is not None and not handle.done:
            handle.cancel()


@router.post("/v1/responses/input_tokens", openapi_extra=body_schema(ResponsesRequest))
@router.post(
    "/responses/input_tokens", openapi_extra=body_schema(ResponsesRequest), include_in_schema=False
)
async def count_input_tokens(request: Request):
    """How many prompt tokens the request's input renders to (OpenAI's input token count)."""
    _, _, _, req = await _chat_from(request)
    return {"object": "response.input_tokens", "input_tokens": len(req.prompt)}
