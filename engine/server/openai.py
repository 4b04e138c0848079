"""Response bodies and SSE chunks, in OpenAI's and llama-server's shapes.

A formatter turns the GenerationSteps of one request into either one JSON response or a
stream of chunks. Three of them:

    ChatFormatter        POST /v1/chat/completions   chat.completion(.chunk), [DONE]
    TextFormatter        POST /v1/completions        text_completion, [DONE]
    NativeFormatter      POST /completion            llama.cpp {content, stop, timings...}

A request with several prompts or choices has one formatter per result (its `index`), all
sharing one id; `merge` joins their replies as llama-server does. What llama-server adds on
request is here too: `timings` on every chunk (timings_per_token), `prompt_progress` chunks
(return_progress), `__verbose` (the native reply, with the prompt text), and post-sampling
probabilities (`prob`/`top_probs` instead of `logprob`/`top_logprobs`).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..sequence import GenerationStep
from ..tasks import PromptProgress
from ..version import build_info
from .tool_calls import ParsedMessage, ReplyReading, StreamParser, ToolCall, parse_message

if TYPE_CHECKING:
    from ..seams import ServerTokenizer
    from .state import ServerState

DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def sse_error(body: dict) -> bytes:
    return sse(body)


_FINGERPRINT: str | None = None


def system_fingerprint() -> str:
    """llama-server's `system_fingerprint`: its build, `b<build>-<commit>` (computed once)."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        _FINGERPRINT = build_info()
    return _FINGERPRINT


def timings(step, n_decoded: int) -> dict:
    """llama-server's `timings` object from the last step of a request."""
    n_prompt_done = max(step.n_prompt - step.n_cached, 0)
    t_p, t_g = float(step.t_prompt_ms), float(step.t_gen_ms)
    n_gen_intervals = max(n_decoded - 1, 0)
    return {
        "cache_n": step.n_cached,
        "prompt_n": n_prompt_done,
        "prompt_ms": t_p,
        "prompt_per_token_ms": t_p / n_prompt_done if n_prompt_done else 0.0,
        "prompt_per_second": 1e3 * n_prompt_done / t_p if t_p > 0 else 0.0,
        "predicted_n": n_decoded,
        "predicted_ms": t_g,
        "predicted_per_token_ms": t_g / n_gen_intervals if n_gen_intervals else 0.0,
        "predicted_per_second": 1e3 * n_gen_intervals / t_g if t_g > 0 else 0.0,
    }


def usage(step, n_decoded: int) -> dict:
    return {
        "completion_tokens": n_decoded,
        "prompt_tokens": step.n_prompt,
        "total_tokens": step.n_prompt + n_decoded,
        "prompt_tokens_details": {"cached_tokens": step.n_cached},
    }


def piece(tokenizer, token: int) -> tuple[str, list[int]]:
    """A token's text (UTF-8, invalid bytes replaced) and its raw bytes."""
    try:
        raw = tokenizer.token_to_piece(int(token))
    except Exception:
        raw = b""
    if isinstance(raw, str):
        raw = raw.encode("utf-8")
    return raw.decode("utf-8", "replace"), list(raw)


@dataclass
class Accumulator:
    """Everything collected over a request's steps."""

    text: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    steps: list = field(default_factory=list)  # kept only when log-probabilities are wanted
    last: Any = None

    def add(self, step, keep_step: bool) -> None:
        self.text.append(step.text_delta)
        self.tokens.append(int(step.token))
        if keep_step:
            self.steps.append(step)
        self.last = step

    @property
    def content(self) -> str:
        return "".join(self.text)

    @property
    def finish_reason(self) -> str:
        return (self.last.finish_reason if self.last is not None else None) or "stop"


class Formatter:
    """Base: subclasses define the shapes. `send_done` adds `data: [DONE]` to streams.

    One formatter shapes one result (`index`) of a request; the results of one request share
    `id` and `created`. `generation_settings`, `prompt_text` and `verbose` feed the native
    reply (and `__verbose`); `post_sampling` reports probabilities after the sampler chain.
    """

    send_done = True

    def __init__(
        self,
        state: ServerState,
        model_name: str,
        tokenizer: ServerTokenizer,
        *,
        n_probs: int = 0,
        include_usage: bool = False,
        return_tokens: bool = False,
        logprobs: bool = False,
        index: int = 0,
        id: str | None = None,
        created: int | None = None,
        generation_settings: dict | None = None,
        prompt_text: str = "",
        verbose: bool = False,
        post_sampling: bool = False,
        timings_per_token: bool = False,
    ):
        self.state = state
        self.model = model_name
        self.tok = tokenizer
        self.n_probs = n_probs
        self.logprobs = logprobs  # OpenAI chat: per-token log-probabilities wanted
        self.include_usage = include_usage
        self.return_tokens = return_tokens
        self.index = index
        self.created = int(time.time()) if created is None else created
        self.id = self.id_prefix + uuid.uuid4().hex[:24] if id is None else id
        self.generation_settings = generation_settings or {}
        self.prompt_text = prompt_text
        self.verbose = verbose
        self.post_sampling = post_sampling
        self.timings_per_token = timings_per_token
        self.acc = Accumulator()
        self.id_slot = -1
        self.t_start = time.perf_counter()
        self.t_prompt_start: float | None = (
            None  # when the first progress report came (the slot took it)
        )

    id_prefix = "cmpl-"

    def add(self, step) -> None:
        self.acc.add(step, keep_step=self.n_probs > 0 or self.logprobs)

    # hooks
    def chunk(self, step) -> list[dict]:
        raise NotImplementedError

    def progress_chunks(self, progress: PromptProgress) -> list[dict]:
        """The chunks of a prompt-progress report (return_progress)."""
        return []

    def final_chunks(self) -> list[dict]:
        raise NotImplementedError

    def response(self) -> dict:
        raise NotImplementedError

    def empty_step(self, n_prompt: int) -> GenerationStep:
        """A stand-in last step for requests that produced no token (n_predict 0, shutdown)."""
        return GenerationStep(
            token=-1,
            text_delta="",
            logprob=0.0,
            top_logprobs=(),
            finish_reason="length",
            n_prompt=n_prompt,
            n_generated=0,
            n_cached=0,
            t_prompt_ms=0.0,
            t_gen_ms=0.0,
        )

    # shared helpers
    def _n(self) -> int:
        return len(self.acc.tokens)

    def _timings(self) -> dict:
        return timings(self.acc.last, self._n()) if self.acc.last is not None else {}

    def _usage(self) -> dict:
        return usage(self.acc.last, self._n())

    def _progress_timings(self, p: PromptProgress) -> dict:
        """llama-server's `timings` while the prompt is evaluated (timings_per_token): zeros at
        the first report, then the prompt tokens decoded so far and the time they took."""
        now = time.perf_counter()
        if self.t_prompt_start is None:
            self.t_prompt_start = now
        n_done = max(p.processed - p.cache, 0)
        t_p = (now - self.t_prompt_start) * 1e3 if n_done else 0.0
        return {
            "cache_n": p.cache,
            "prompt_n": n_done,
            "prompt_ms": t_p,
            "prompt_per_token_ms": t_p / n_done if n_done else 0.0,
            "prompt_per_second": 1e3 * n_done / t_p if t_p > 0 else 0.0,
            "predicted_n": 0,
            "predicted_ms": 0.0,
            "predicted_per_token_ms": 0.0,
            "predicted_per_second": 0.0,
        }

    def _progress(self, p: PromptProgress) -> dict:
        return {
            "total": p.total,
            "cache": p.cache,
            "processed": p.processed,
            "time_ms": int((time.perf_counter() - self.t_start) * 1e3),
        }

    def _top(self, step) -> list[tuple[int, str, list[int], float]]:
        return [(int(t), *piece(self.tok, t), float(lp)) for t, lp in (step.top_logprobs or ())][
            : self.n_probs
        ]

    def _token_probs(self, steps) -> list[dict]:
        """llama-server's per-token probabilities: log-probabilities of the raw logits, or with
        post_sampling the probabilities after the sampler chain (zeros left out)."""
        out = []
        for s in steps:
            text, raw = piece(self.tok, s.token)
            entry: dict[str, Any] = {"id": int(s.token), "token": text, "bytes": raw}
            if self.post_sampling and s.prob is not None:
                entry["prob"] = float(s.prob)
                entry["top_probs"] = [
                    {"id": int(t), "token": tt, "bytes": b, "prob": float(p)}
                    for t, p in s.top_probs[: self.n_probs]
                    if p > 0.0
                    for tt, b in [piece(self.tok, t)]
                ]
            else:
                entry["logprob"] = float(s.logprob)
                entry["top_logprobs"] = [
                    {"id": t, "token": tt, "bytes": b, "logprob": lp}
                    for t, tt, b, lp in self._top(s)
                ]
            out.append(entry)
        return out

    def _stop_type(self) -> str:
        last = self.acc.last
        if last is None or last.finish_reason is None:
            return "none"
        if last.finish_reason == "length":
            return "limit"
        return "word" if last.stop_word else "eos"

    def native(self, stream: bool = False) -> dict:
        """llama-server's native final reply (/completion, and `__verbose` elsewhere)."""
        last = self.acc.last
        body = {
            "index": self.index,
            "content": "" if stream else self.acc.content,
            "tokens": (self.acc.tokens if self.return_tokens and not stream else []),
            "id_slot": self.id_slot,
            "stop": True,
            "model": self.model,
            "tokens_predicted": self._n(),
            "tokens_evaluated": last.n_prompt if last is not None else 0,
            "generation_settings": self.generation_settings,
            "prompt": self.prompt_text,
            "has_new_line": "\n" in self.acc.content,
            "truncated": last.truncated if last is not None else False,
            "stop_type": self._stop_type(),
            "stopping_word": (last.stop_word or "") if last is not None else "",
            "tokens_cached": (last.n_prompt + self._n() - 1) if last is not None else 0,
            "timings": self._timings(),
        }
        if self.n_probs and not stream and self.acc.steps:
            body["completion_probabilities"] = self._token_probs(self.acc.steps)
        return body

    def _with_verbose(self, obj: dict) -> dict:
        if self.verbose:
            obj["__verbose"] = self.native()
        return obj


class ChatFormatter(Formatter):
    id_prefix = "chatcmpl-"

    def __init__(self, *a: Any, reading: ReplyReading | None = None, **kw: Any):
        super().__init__(*a, **kw)
        self._sent_role = False
        # with tools or a thinking template, the reply is read as reasoning, content and tool
        # calls (llama-server's reasoning_content and tool_calls) instead of passed through
        self.reader = StreamParser(**dataclasses.asdict(reading)) if reading is not None else None
        self._message: ParsedMessage | None = None

    def _deltas(self, text: str) -> list[dict]:
        if self.reader is None:
            return [{"content": text}] if text else []
        return [
            {"content" if kind == "content" else "reasoning_content": t}
            for kind, t in self.reader.feed(text)
        ]

    def _finish_reason(self) -> str:
        if self._message is not None and self._message.tool_calls:
            return "tool_calls"
        return self.acc.finish_reason

    def _parsed(self) -> ParsedMessage:
        if self._message is None:
            if self.reader is None:
                self._message = ParsedMessage(content=self.acc.content)
            else:
                self._message = parse_message(
                    self.acc.content,
                    tool_names=self.reader.tool_names,
                    parse_tools=self.reader.parse_tools,
                    reasoning=self.reader.reasoning,
                    starts_inside=self.reader.starts_inside,
                    harmony=self.reader.harmony,
                )
        return self._message

    @staticmethod
    def _calls_json(calls: list[ToolCall], with_index: bool) -> list[dict]:
        return [
            {
                **({"index": i} if with_index else {}),
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(calls)
        ]

    def _obj(self, choices: list, **extra) -> dict:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": system_fingerprint(),
            "choices": choices,
            **extra,
        }

    def _logprob_entries(self, steps) -> list[dict]:
        if self.post_sampling:
            return self._token_probs(steps)
        out = []
        for s in steps:
            text, raw = piece(self.tok, s.token)
            out.append(
                {
                    "id": int(s.token),
                    "token": text,
                    "logprob": float(s.logprob),
                    "bytes": raw,
                    "top_logprobs": [
                        {"id": t, "token": tt, "logprob": lp, "bytes": b}
                        for t, tt, b, lp in self._top(s)
                    ],
                }
            )
        return out

    def _role(self) -> dict:
        return self._obj(
            [
                {
                    "index": self.index,
                    "delta": {"role": "assistant", "content": None},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ]
        )

    def chunk(self, step) -> list[dict]:
        out = []
        if not self._sent_role:
            self._sent_role = True
            out.append(self._role())
        deltas = self._deltas(step.text_delta)
        if self.logprobs and not step.finish_reason and not deltas:
            deltas = [{"content": ""}]
        for i, delta in enumerate(deltas):
            choice = {
                "index": self.index,
                "delta": delta,
                "finish_reason": None,
                "logprobs": {"content": self._logprob_entries([step])}
                if self.logprobs and i == 0
                else None,
            }
            out.append(self._obj([choice]))
        if self.timings_per_token and out:
            out[-1]["timings"] = self._timings()
        return out

    def progress_chunks(self, progress: PromptProgress) -> list[dict]:
        # llama-server sends each progress report as a role delta carrying prompt_progress
        return [{**self._role(), "prompt_progress": self._progress(progress)}]

    def final_chunks(self) -> list[dict]:
        out = []
        if not self._sent_role:
            self._sent_role = True
            out.append(self._role())
        if self.reader is not None:
            owed, self._message = self.reader.finish()
            for kind, text in owed:
                delta = {"content" if kind == "content" else "reasoning_content": text}
                out.append(
                    self._obj(
                        [
                            {
                                "index": self.index,
                                "delta": delta,
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ]
                    )
                )
            if self._message.tool_calls:
                calls = {"tool_calls": self._calls_json(self._message.tool_calls, with_index=True)}
                out.append(
                    self._obj(
                        [
                            {
                                "index": self.index,
                                "delta": calls,
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ]
                    )
                )
        out.append(
            self._obj(
                [
                    {
                        "index": self.index,
                        "delta": {},
                        "logprobs": None,
                        "finish_reason": self._finish_reason(),
                    }
                ]
            )
        )
        if self.include_usage:
            out.append(self._obj([], usage=self._usage()))
        out[-1]["timings"] = self._timings()  # on the last chunk, as llama-server
        self._with_verbose(out[0])
        return out

    def response(self) -> dict:
        msg = self._parsed()
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if msg.tool_calls and not msg.content else msg.content,
        }
        if msg.reasoning:
            message["reasoning_content"] = msg.reasoning
        if msg.tool_calls:
            message["tool_calls"] = self._calls_json(msg.tool_calls, with_index=False)
        choice = {
            "index": self.index,
            "message": message,
            "logprobs": {"content": self._logprob_entries(self.acc.steps)}
            if self.logprobs
            else None,
            "finish_reason": self._finish_reason(),
        }
        return self._with_verbose(
            {
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": system_fingerprint(),
                "choices": [choice],
                "usage": self._usage(),
                "timings": self._timings(),
            }
        )


class TextFormatter(Formatter):
    """OpenAI legacy completions; `logprobs` in the legacy shape."""

    def _logprobs(self, steps) -> dict | None:
        if not self.n_probs and not steps:
            return None
        tokens, lps, tops, offsets, off = [], [], [], [], 0
        for s in steps:
            text, _ = piece(self.tok, s.token)
            tokens.append(text)
            lps.append(float(s.logprob))
            tops.append({tt: lp for _, tt, _, lp in self._top(s)})
            offsets.append(off)
            off += len(s.text_delta)
        return {
            "tokens": tokens,
            "token_logprobs": lps,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def _obj(self, text: str, finish, logprobs=None, **extra) -> dict:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": system_fingerprint(),
            "choices": [
                {"text": text, "index": self.index, "logprobs": logprobs, "finish_reason": finish}
            ],
            **extra,
        }

    def chunk(self, step) -> list[dict]:
        if not step.text_delta:
            return []
        lp = self._logprobs([step]) if self.n_probs else None
        obj = self._obj(step.text_delta, None, lp)
        if self.timings_per_token:
            obj["timings"] = self._timings()
        return [obj]

    def progress_chunks(self, progress: PromptProgress) -> list[dict]:
        return [{**self._obj("", None), "prompt_progress": self._progress(progress)}]

    def final_chunks(self) -> list[dict]:
        out = [self._obj("", self.acc.finish_reason, None)]
        if self.include_usage:
            out.append({**self._obj("", None), "choices": [], "usage": self._usage()})
        out[-1]["timings"] = self._timings()
        self._with_verbose(out[0])
        return out

    def response(self) -> dict:
        lp = self._logprobs(self.acc.steps) if self.n_probs else None
        return self._with_verbose(
            self._obj(
                self.acc.content,
                self.acc.finish_reason,
                lp,
                usage=self._usage(),
                timings=self._timings(),
            )
        )


class NativeFormatter(Formatter):
    """llama.cpp's /completion: `content`, `stop`, `stop_type`, `tokens_cached`, `timings`.

    `response_fields` keeps only the listed fields of the final reply; a field with a slash
    ("generation_settings/n_predict") is taken from inside an object and keyed by that path.
    """

    send_done = False

    def __init__(self, *a: Any, response_fields: list[str] | None = None, **kw: Any):
        super().__init__(*a, **kw)
        self.response_fields = response_fields or []

    def _partial(self, step: GenerationStep | None, progress: PromptProgress | None = None) -> dict:
        last = self.acc.last
        obj: dict[str, Any] = {
            "index": self.index,
            "content": step.text_delta if step is not None else "",
            "tokens": [int(step.token)] if step is not None else [],
            "stop": False,
            "id_slot": self.id_slot,
            "tokens_predicted": self._n(),
            "tokens_evaluated": last.n_prompt
            if last is not None
            else (progress.total if progress else 0),
        }
        if self.timings_per_token and last is not None:
            obj["timings"] = self._timings()
        elif self.timings_per_token and progress is not None:
            obj["timings"] = self._progress_timings(progress)
        if progress is not None:
            obj["prompt_progress"] = self._progress(progress)
        if self.n_probs and step is not None:
            obj["completion_probabilities"] = self._token_probs([step])
        return obj

    def chunk(self, step) -> list[dict]:
        return [self._partial(step)]

    def progress_chunks(self, progress: PromptProgress) -> list[dict]:
        return [self._partial(None, progress)]

    def final_chunks(self) -> list[dict]:
        return [self.native(stream=True)]

    def response(self) -> dict:
        body = self.native(stream=False)
        return nested_fields(self.response_fields, body) if self.response_fields else body


def nested_fields(paths: list[str], obj: dict) -> dict:
    """llama-server's json_get_nested_values: each path ("a/b") found in obj, keyed by the path."""
    out = {}
    for path in paths:
        cur: Any = obj
        for key in path.split("/"):
            if not (isinstance(cur, dict) and key in cur):
                break
            cur = cur[key]
        else:
            out[path] = cur
    return out


def merge(results: list[dict], native: bool) -> dict | list:
    """The reply of a request with several results: one object when there is one; a list
    (native); else the first object with every result's choice (OpenAI shapes), its usage
    and timings those of the first result, as llama-server answers."""
    if len(results) == 1:
        return results[0]
    if native:
        return results
    first = dict(results[0])
    first["choices"] = [c for r in results for c in r["choices"]]
    return first
