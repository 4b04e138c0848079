"""What a chat model's output text says: its reasoning, its answer and the tool calls in it.

Models write tool calls as text, each family in its own syntax; the API shapes (OpenAI
`tool_calls`, Anthropic `tool_use` blocks) want them as structured calls. Formats read:

    Hermes / Qwen 2.5 / Qwen 3   <tool_call>{"name": "f", "arguments": {...}}</tool_call>
    Qwen3-Coder                  <tool_call><function=f><parameter=x>1</parameter></function></tool_call>
    Llama 3.x (JSON)             {"name": "f", "parameters": {...}}   (also after <|python_tag|>, or a list)
    Functionary / Llama 3.1      <function=f>{...}</function>
    Mistral                      [TOOL_CALLS][{"name": "f", "arguments": {...}}]   or   [TOOL_CALLS]f[ARGS]{...}
    llama.cpp generic            {"tool_call": {"name": "f", "arguments": {...}}}  /  {"tool_calls": [...]}

Reasoning is the `<think>...</think>` span at the start of a reply (DeepSeek R1, Qwen 3 and
their kin); a template whose generation prompt already opens it makes the reply start inside.

gpt-oss writes the harmony format instead (llama.cpp common/parsers/gpt-oss.cpp), messages
after the prompt's `<|start|>assistant`, each `<|channel|>NAME<|message|>BODY<|end|>`:

    analysis                                         reasoning
    commentary (a preamble) / final                  the answer
    commentary to=functions.f <|constrain|>json      a tool call, its body the arguments, ended
                                                     by <|call|> (the recipient may also sit in
                                                     the role: `<|start|>assistant to=functions.f`)

`parse_message` reads a finished reply. `StreamParser` reads one as it arrives: it releases
reasoning and answer text as soon as it cannot be the start of a tool call or a closing tag,
and keeps tool calls back until the end, when `finish` parses the whole text; so a streamed
reply and the same reply in one piece give the same message.

Bare JSON (the Llama 3 style) only counts as a tool call when it names a tool the request
declared: an answer that happens to be JSON stays an answer. Tagged calls are unambiguous and
are taken whatever the name.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

# Text that starts a tool call in some format; the stream holds back what could begin one.
TOOL_MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<function=", "<|python_tag|>")

_DECODER = json.JSONDecoder()


@dataclass
class ToolCall:
    """One call: `arguments` is JSON text of an object (OpenAI's shape; Anthropic's `input` is
    its parsed form)."""

    name: str
    arguments: str = "{}"
    id: str = ""

    def input(self) -> dict[str, Any]:
        """The arguments as an object ({} when they are not one, as llama-server answers)."""
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass
class ParsedMessage:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class ReplyReading:
    """How a chat reply is read (StreamParser's options): the declared tools a bare-JSON call
    may name, whether tool calls and reasoning are split out, whether the reply starts
    inside a `<think>` the prompt opened, and whether it is in gpt-oss's harmony format."""

    tool_names: tuple[str, ...] = ()
    parse_tools: bool = False
    reasoning: bool = False
    starts_inside: bool = False
    harmony: bool = False


def new_call_id(prefix: str = "call_") -> str:
    return prefix + uuid.uuid4().hex[:24]


# -- reasoning ------------------------------------------------------------------------------


def split_reasoning(text: str, starts_inside: bool = False) -> tuple[str, str]:
    """(reasoning, rest) of a reply. Without a leading `<think>` (or `starts_inside`) there is
    no reasoning; an unclosed one is all reasoning (the reply ran out while thinking)."""
    if not starts_inside:
        stripped = text.lstrip()
        if not stripped.startswith(THINK_OPEN):
            return "", text
        text = stripped[len(THINK_OPEN) :]
    end = text.find(THINK_CLOSE)
    if end < 0:
        return text.strip(), ""
    return text[:end].strip(), text[end + len(THINK_CLOSE) :].lstrip()


def prompt_opens_reasoning(prompt: str) -> bool:
    """A generation prompt ending in `<think>` (DeepSeek R1 templates): the reply starts inside."""
    return prompt.rstrip().endswith(THINK_OPEN)


# -- tool calls -----------------------------------------------------------------------------


def parse_tool_calls(
    text: str, tool_names: Collection[str] | None = None
) -> tuple[str, list[ToolCall]]:
    """(content, calls) of an answer: the text outside the calls, and the calls in order.

    `tool_names`: the declared tools; bare-JSON calls must name one of them. None accepts any.
    Text with no recognisable call comes back unchanged with no calls.
    """
    for parse in (_parse_tagged, _parse_mistral, _parse_function_tags, _parse_bare_json):
        found = parse(text, tool_names)
        if found is not None and found[1]:
            content, calls = found
            for c in calls:
                c.id = c.id or new_call_id()
            return content.strip(), calls
    return text, []


def parse_message(
    text: str,
    *,
    tool_names: Collection[str] | None = None,
    parse_tools: bool = False,
    reasoning: bool = False,
    starts_inside: bool = False,
    harmony: bool = False,
) -> ParsedMessage:
    """A finished reply read as reasoning, content and tool calls (each only when asked for)."""
    if harmony:
        return parse_harmony(
            text, tool_names=tool_names, parse_tools=parse_tools, reasoning=reasoning
        )
    thought = ""
    if reasoning:
        thought, text = split_reasoning(text, starts_inside)
    calls: list[ToolCall] = []
    if parse_tools:
        text, calls = parse_tool_calls(text, tool_names)
    return ParsedMessage(content=text, reasoning=thought, tool_calls=calls)


def _call_from_obj(obj: Any, tool_names: Collection[str] | None) -> ToolCall | None:
    """{"name", "arguments"|"parameters"} (optionally {"function": {...}}) -> ToolCall."""
    if not isinstance(obj, dict):
        return None
    if isinstance(
        obj.get("function"), dict
    ):  # OpenAI-style {"type": "function", "function": {...}}
        inner = _call_from_obj(obj["function"], tool_names)
        if inner is not None and isinstance(obj.get("id"), str):
            inner.id = obj["id"]
        return inner
    name = obj.get("name")
    if not isinstance(name, str) or not name or (tool_names is not None and name not in tool_names):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # already JSON text (some models double-encode)
        try:
            args = json.loads(args)
        except ValueError:
            return ToolCall(name, args, _str(obj.get("id")))
    return ToolCall(name, json.dumps(args, ensure_ascii=False), _str(obj.get("id")))


def _str(x: Any) -> str:
    return x if isinstance(x, str) else ""


def _json_at(text: str, i: int) -> tuple[Any, int] | None:
    """The JSON value starting at text[i] (whitespace skipped) and the index after it."""
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    try:
        return _DECODER.raw_decode(text, i)
    except ValueError:
        return None


_TOOL_CALL_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def _parse_tagged(text: str, tool_names: Collection[str] | None):
    """Hermes / Qwen: <tool_call>JSON</tool_call>, or Qwen3-Coder's XML inside the tags."""
    if "<tool_call>" not in text:
        return None
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0
    for m in _TOOL_CALL_TAG.finditer(text):
        body = m.group(1).strip()
        call = None
        if body.startswith("<function="):
            found = _xml_function(body)
            call = found[0] if found else None
        else:
            parsed = _json_at(body, 0)
            if parsed is not None:
                call = _call_from_obj(parsed[0], None)
        if call is None:
            continue  # not a call after all: leave the text as content
        content.append(text[pos : m.start()])
        calls.append(call)
        pos = m.end()
    content.append(text[pos:])
    return "".join(content), calls


_XML_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|$)", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>\s]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def _xml_function(body: str) -> tuple[ToolCall, int] | None:
    m = _XML_FUNCTION.match(body)
    if m is None:
        return None
    args: dict[str, Any] = {}
    for p in _XML_PARAM.finditer(m.group(2)):
        raw = p.group(2).strip("\n")
        try:
            args[p.group(1)] = json.loads(raw)
        except ValueError:
            args[p.group(1)] = raw
    return ToolCall(m.group(1), json.dumps(args, ensure_ascii=False)), m.end()


_FUNCTION_TAG = re.compile(r"<function=([^>\s]+)>")


def _parse_function_tags(text: str, tool_names: Collection[str] | None):
    """Functionary v3.1 / Llama 3.1's custom format: <function=name>{JSON}</function>."""
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0
    for m in _FUNCTION_TAG.finditer(text):
        if m.start() < pos:
            continue
        parsed = _json_at(text, m.end())
        if parsed is None:
            found = _xml_function(text[m.start() :])  # Qwen3-Coder style without <tool_call>
            if found is None:
                continue
            call, length = found
            end = m.start() + length
        else:
            args, end = parsed
            call = ToolCall(m.group(1), json.dumps(args, ensure_ascii=False))
            if text.startswith("</function>", end):
                end += len("</function>")
        content.append(text[pos : m.start()])
        calls.append(call)
        pos = end
    content.append(text[pos:])
    return "".join(content), calls


_MISTRAL_ARGS = re.compile(
    r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[CALL_ID\]\s*([A-Za-z0-9_\-]+)\s*)?\[ARGS\]"
)


def _parse_mistral(text: str, tool_names: Collection[str] | None):
    """Mistral: [TOOL_CALLS] then a JSON list of calls, or (v11+) `name[ARGS]{...}` per call."""
    i = text.find("[TOOL_CALLS]")
    if i < 0:
        return None
    content, rest = text[:i], text[i:]
    calls: list[ToolCall] = []
    pos = 0
    while rest.startswith("[TOOL_CALLS]", pos):
        pos += len("[TOOL_CALLS]")
        parsed = _json_at(rest, pos)
        if parsed is not None and isinstance(parsed[0], (list, dict)):
            items = parsed[0] if isinstance(parsed[0], list) else [parsed[0]]
            calls.extend(c for c in (_call_from_obj(o, None) for o in items) if c is not None)
            pos = parsed[1]
        else:
            while (m := _MISTRAL_ARGS.match(rest, pos)) is not None:
                args = _json_at(rest, m.end())
                if args is None:
                    break
                calls.append(
                    ToolCall(m.group(1), json.dumps(args[0], ensure_ascii=False), m.group(2) or "")
                )
                pos = args[1]
                if rest.startswith("[TOOL_CALLS]", pos) or not rest[pos:].strip():
                    break
        while pos < len(rest) and rest[pos] in " \t\r\n":
            pos += 1
    return content + rest[pos:], calls


def _parse_bare_json(text: str, tool_names: Collection[str] | None):
    """Llama 3.x and llama.cpp's generic format: the whole answer is JSON (or JSON objects
    separated by `;`), optionally after <|python_tag|>."""
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>") :]
    calls: list[ToolCall] = []
    pos = 0
    while True:
        parsed = _json_at(body, pos)
        if parsed is None:
            return None
        value, pos = parsed
        if isinstance(value, dict) and ("tool_call" in value or "tool_calls" in value):
            items = value.get("tool_calls") or [value.get("tool_call")]
            items = items if isinstance(items, list) else [items]
        else:
            items = value if isinstance(value, list) else [value]
        found = [_call_from_obj(o, tool_names) for o in items]
        if any(c is None for c in found):
            return None  # JSON that is not (only) calls to declared tools: an answer
        calls.extend(c for c in found if c is not None)
        rest = body[pos:].lstrip()
        if rest.startswith(";"):
            pos = body.index(";", pos) + 1
            continue
        if rest:
            return None
        return "", calls


# -- harmony (gpt-oss) ----------------------------------------------------------------------

HARMONY_MARKER = "<|channel|>"  # a template that writes it is gpt-oss's (llama.cpp's detection)
_H_START, _H_MESSAGE = "<|start|>", "<|message|>"
_H_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_H_CHANNEL = re.compile(r"<\|channel\|>([A-Za-z0-9_-]*)")
_H_RECIPIENT = re.compile(r"(?:^|\s)to=([^\s<]+)")


def is_harmony_template(source: str) -> bool:
    return HARMONY_MARKER in source


def _harmony_messages(text: str) -> list[tuple[str, str, bool]]:
    """(header, body, ended) of each message of a reply that continues `<|start|>assistant`.
    A last message whose header is not finished yet is left out."""
    out = []
    segments = text.split(_H_START)
    for i, seg in enumerate(segments):
        if i:  # "<|start|>ROLE...": the role word, then the header as in the first message
            seg = seg[len("assistant") :] if seg.startswith("assistant") else seg
        m = seg.find(_H_MESSAGE)
        if m < 0:
            continue  # header still arriving (or stray text between messages)
        header, rest = seg[:m], seg[m + len(_H_MESSAGE) :]
        ends = [j for j in (rest.find(e) for e in _H_ENDS) if j >= 0]
        end = min(ends) if ends else len(rest)
        out.append((header, rest[:end], bool(ends)))
    return out


def parse_harmony(
    text: str,
    *,
    tool_names: Collection[str] | None = None,
    parse_tools: bool = False,
    reasoning: bool = True,
    partial: bool = False,
) -> ParsedMessage:
    """A harmony reply as reasoning (analysis), content (commentary preambles and final) and
    tool calls (messages to functions.NAME). Messages to other recipients, or to tools when
    none are parsed, are dropped (llama.cpp's "unsolicited" rule). Without reasoning the
    analysis stays in the content with its markers, as llama.cpp's reasoning_format none.
    partial: the text is still arriving; the unfinished tail that could be the start of an
    end token is held back and tool calls are left for the end."""
    if HARMONY_MARKER not in text and _H_MESSAGE not in text:
        # no header at all: the model ignored the format (or its first header is arriving)
        opening = partial and any(
            h.startswith(text[: len(h)]) for h in (HARMONY_MARKER, _H_START, " to=")
        )
        return ParsedMessage(content="" if opening else text)
    msg = ParsedMessage()
    thoughts: list[str] = []
    content: list[str] = []
    for header, body, ended in _harmony_messages(text):
        if partial and not ended:
            body = body[: len(body) - _held_tail(body, _H_ENDS + (_H_START,))]
        channel = m.group(1) if (m := _H_CHANNEL.search(header)) else ""
        recipient = r.group(1) if (r := _H_RECIPIENT.search(header)) else ""
        if recipient:
            name = recipient[len("functions.") :] if recipient.startswith("functions.") else ""
            if name and parse_tools and (tool_names is None or name in tool_names) and not partial:
                msg.tool_calls.append(_harmony_call(name, body))
        elif channel == "analysis":
            if reasoning:
                thoughts.append(body)
            else:
                content.append(
                    f"{HARMONY_MARKER}analysis{_H_MESSAGE}{body}" + ("<|end|>" if ended else "")
                )
        else:  # final, commentary (a preamble), or no channel at all
            content.append(body)
    msg.reasoning, msg.content = "".join(thoughts), "".join(content)
    for c in msg.tool_calls:
        c.id = c.id or new_call_id()
    return msg


def _harmony_call(name: str, body: str) -> ToolCall:
    """The arguments as the model wrote them (llama.cpp keeps the JSON text, spacing included)."""
    return ToolCall(name, body.strip())


# -- streaming ------------------------------------------------------------------------------


def _held_tail(text: str, markers: Collection[str]) -> int:
    """How many characters at the end of `text` could be the start of one of `markers`."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if m.startswith(text[-n:]):
                best = n
                break
    return best


def _trailing_space(text: str) -> int:
    return len(text) - len(text.rstrip())


class StreamParser:
    """Splits a reply into reasoning and content deltas as its text arrives.

    feed(delta) -> [("reasoning" | "content", text), ...] safe to send now; finish() -> the
    last deltas and the whole ParsedMessage (with its tool calls).
    """

    def __init__(
        self,
        *,
        tool_names: Collection[str] | None = None,
        parse_tools: bool = False,
        reasoning: bool = False,
        starts_inside: bool = False,
        harmony: bool = False,
    ):
        self.tool_names = tool_names
        self.parse_tools = parse_tools
        self.reasoning = reasoning
        self.starts_inside = starts_inside
        self.harmony = harmony
        self.text = ""  # everything fed
        self._pending = ""  # fed but not yet released
        self._mode = (
            "reasoning" if (reasoning and starts_inside) else ("start" if reasoning else "content")
        )
        self.sent_reasoning = ""
        self.sent_content = ""

    def feed(self, delta: str) -> list[tuple[str, str]]:
        self.text += delta
        if self.harmony:
            return self._feed_harmony()
        self._pending += delta
        out: list[tuple[str, str]] = []
        while True:
            before = (self._mode, len(self._pending))
            self._step(out)
            if (self._mode, len(self._pending)) == before:
                return [(k, t) for k, t in out if t]

    def _feed_harmony(self) -> list[tuple[str, str]]:
        """Harmony replies are re-read whole as they grow (they are short next to the work of
        generating them): what a partial read adds to each part is sent."""
        msg = parse_harmony(
            self.text,
            tool_names=self.tool_names,
            parse_tools=self.parse_tools,
            reasoning=self.reasoning,
            partial=True,
        )
        out: list[tuple[str, str]] = []
        for kind, now, sent in (
            ("reasoning", msg.reasoning, self.sent_reasoning),
            ("content", msg.content, self.sent_content),
        ):
            if len(now) > len(sent) and now.startswith(sent):
                self._emit(out, kind, now[len(sent) :], strip=False)
        return out

    def _step(self, out: list[tuple[str, str]]) -> None:
        p = self._pending
        if self._mode == "start":
            head = p.lstrip()
            if head.startswith(THINK_OPEN):
                self._pending = head[len(THINK_OPEN) :]
                self._mode = "reasoning"
            elif not THINK_OPEN.startswith(head):
                self._mode = "content"
        elif self._mode == "reasoning":
            end = p.find(THINK_CLOSE)
            if end >= 0:
                self._emit(out, "reasoning", p[:end].rstrip())
                self._pending = p[end + len(THINK_CLOSE) :].lstrip()
                self._mode = "content" if self._pending else "after_reasoning"
            else:  # trailing whitespace waits: the reasoning is sent stripped, as parse_message has it
                keep = _held_tail(p, (THINK_CLOSE,))
                keep += _trailing_space(p[: len(p) - keep])
                self._emit(out, "reasoning", p[: len(p) - keep])
                self._pending = p[len(p) - keep :]
        elif self._mode == "after_reasoning":  # the answer's leading whitespace is dropped
            self._pending = p.lstrip()
            if self._pending:
                self._mode = "content"
        elif self._mode == "content":
            if not self.parse_tools:
                self._emit(out, "content", p)
                self._pending = ""
                return
            if not self.sent_content and p.lstrip()[:1] in ("{", "["):
                self._mode = "tools"  # maybe a bare-JSON call: decided at the end
                return
            hits = [i for i in (p.find(m) for m in TOOL_MARKERS) if i >= 0]
            if hits:
                self._emit(out, "content", p[: min(hits)].rstrip())
                self._pending = p[min(hits) :]
                self._mode = "tools"
                return
            # trailing whitespace waits too: content before a call is sent stripped
            keep = _held_tail(p, TOOL_MARKERS)
            keep += _trailing_space(p[: len(p) - keep])
            self._emit(out, "content", p[: len(p) - keep])
            self._pending = p[len(p) - keep :]
        # "tools": everything waits for finish()

    def _emit(self, out: list[tuple[str, str]], kind: str, text: str, strip: bool = True) -> None:
        if not text:
            return
        if kind == "reasoning":
            if strip and not self.sent_reasoning:
                text = text.lstrip()
            self.sent_reasoning += text
        else:
            self.sent_content += text
        out.append((kind, text))

    def finish(self) -> tuple[list[tuple[str, str]], ParsedMessage]:
        """The deltas still owed and the whole message. What was sent is never taken back:
        if the final parse disagrees with it (a tag that turned out not to be a call), the
        message keeps what the client already has."""
        msg = parse_message(
            self.text,
            tool_names=self.tool_names,
            parse_tools=self.parse_tools,
            reasoning=self.reasoning,
            starts_inside=self.starts_inside,
            harmony=self.harmony,
        )
        out: list[tuple[str, str]] = []
        for kind, final, sent in (
            ("reasoning", msg.reasoning, self.sent_reasoning),
            ("content", msg.content, self.sent_content),
        ):
            if final.startswith(sent):
                rest = final[len(sent) :]
            else:
                rest = ""
                final = sent
            if kind == "reasoning":
                msg.reasoning = final
            else:
                msg.content = final
            if rest:
                out.append((kind, rest))
        return out, msg
