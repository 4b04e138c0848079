"""From validated HTTP bodies to scheduler requests: prompts, sampling params, limits.

Nothing here touches the network: route handlers call these, so the rules (which field
wins, how a mixed prompt is tokenized, what a logit bias list means) are testable alone.
The rules are llama-server's (tools/server/server-schema.cpp, server-common.cpp):

- `n_predict` wins over `max_completion_tokens`, which wins over `max_tokens`; the server's
  -n is the default when none is given (server-schema.cpp: the request's value overrides it,
  it does not cap it).
- A prompt is text, token ids, ids mixed with text, or {"prompt_string": ...}; a list of
  several of those asks for one result each.
- `n` (`n_cmpl`) asks for that many choices per prompt, at most one per slot; choice i > 0
  samples with seed + i (unless the seed is random) on any free slot.
- A chat whose last message is the assistant's is continued (assistant prefill);
  `continue_final_message` asks for it explicitly.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import TYPE_CHECKING, Any

from ..errors import APIError, TemplateError, TemplateLimitError
from ..sampling import DEFAULT_SEED, SamplingParams, sampler_names
from ..scheduler import GenerationRequest
from ..tokenizer.chat_template import encode_chat_prompt
from . import media
from .constraints import request_grammar
from .errors import exceed_context, invalid
from .schemas import (
    ApplyTemplateRequest,
    ChatCompletionRequest,
    CompletionRequest,
    OpenAICommon,
    SamplingFields,
)
from .settings import generation_settings
from .tool_calls import THINK_OPEN, ReplyReading, is_harmony_template, prompt_opens_reasoning

if TYPE_CHECKING:
    from ..seams import PromptTemplate
    from ..vision import MediaSpan
    from .state import ServerState

# request field -> SamplingParams field
_SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "n_probs": "n_probs",
    "min_keep": "min_keep",
    "ignore_eos": "ignore_eos",
    "dynatemp_range": "dynatemp_range",
    "dynatemp_exponent": "dynatemp_exponent",
    "top_n_sigma": "top_n_sigma",
    "xtc_probability": "xtc_probability",
    "xtc_threshold": "xtc_threshold",
}

MAX_PROMPTS = 256  # prompts in one request; llama-server has no limit, each one is a task
PROMPT_STRING_KEY = "prompt_string"  # llama-server's prompt object keys
MULTIMODAL_KEY = "multimodal_data"


def sampling_params(
    state: ServerState, body: SamplingFields, n_probs: int | None = None, logprobs: bool = False
) -> SamplingParams:
    """The server's default SamplingParams with the request's fields applied; `logprobs`: the
    reply reports each token's log-probability even without n_probs (OpenAI chat's logprobs)."""
    given = body.model_dump(include=set(_SAMPLING_FIELDS), exclude_none=True)
    kw: dict[str, Any] = {_SAMPLING_FIELDS[k]: v for k, v in given.items()}
    if n_probs is not None:
        kw["n_probs"] = n_probs
    kw["logprobs"] = logprobs  # (n_probs > 0 computes them anyway: SequenceGenerator.accept)
    if body.samplers is not None:
        kw["samplers"] = sampler_names(body.samplers)
    if body.post_sampling_probs is not None:
        kw["post_sampling_probs"] = body.post_sampling_probs
    if body.logit_bias is not None:
        kw["logit_bias"] = logit_bias(state, body.logit_bias)
    return dataclasses.replace(state.options.default_sampling, **kw)


def logit_bias(state: ServerState, raw: Any) -> dict[int, float]:
    """llama-server's logit_bias forms -> {id: bias}; a bias false bans the token (-inf).

    A list of [token, bias] pairs, where the token is an id or text (tokenized, every piece
    biased); or an object {key: bias}, where a key that is an integer is an id and any other
    key is text. Biases of one token add up, as llama.cpp applies each entry in turn.
    """
    if isinstance(raw, dict):
        pairs = [(_key_token(k), v) for k, v in raw.items()]
    elif isinstance(raw, list):
        pairs = []
        for pair in raw:
            if not isinstance(pair, list) or len(pair) != 2:
                raise invalid(
                    f"logit_bias list entries must be [token, bias] pairs, got {str(pair)[:40]}"
                )
            pairs.append((pair[0], pair[1]))
    else:
        raise invalid("logit_bias must be a list of [token, bias] pairs or an object {token: bias}")
    n_vocab = state.n_vocab
    out: dict[int, float] = {}
    for key, bias in pairs:
        value = _bias_value(bias)
        for t in _bias_tokens(state, key):
            if n_vocab and not 0 <= t < n_vocab:
                raise invalid(
                    f"logit_bias token id {t} is out of range (vocabulary has {n_vocab} tokens)"
                )
            out[t] = out.get(t, 0.0) + value
    return out


def _key_token(key: str) -> int | str:
    """An object key: an integer (llama.cpp strtol over the whole key) is an id, else text."""
    try:
        return int(key, 10) if key.strip() == key else key
    except ValueError:
        return key


def _bias_value(bias: Any) -> float:
    if bias is False:
        return -math.inf
    try:
        value = (
            float(bias)
            if isinstance(bias, (int, float)) and not isinstance(bias, bool)
            else math.nan
        )
    except OverflowError:  # an integer past a double
        value = math.nan
    if not math.isfinite(value):
        raise invalid(f"logit_bias values must be finite numbers or false, got {str(bias)[:40]}")
    return value


def _bias_tokens(state: ServerState, key: Any) -> list[int]:
    if isinstance(key, str):  # text: every token of it, as tokenized without special handling
        return state.tokenizer.encode(key, add_special=False, parse_special=False)
    if isinstance(key, int) and not isinstance(key, bool):
        return [key]
    raise invalid(f"logit_bias keys must be token ids or text, got {str(key)[:40]}")


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else [s for s in stop if s]


def n_predict(state: ServerState, *candidates: int | None) -> int:
    """The first given limit among the request's fields, else the server's -n (llama-server:
    -n is the default a request's own n_predict / max_tokens overrides, not a cap)."""
    n = next((c for c in candidates if c is not None), -1)
    if n < 0 and state.options.n_predict is not None:
        n = state.options.n_predict
    return n


def check_tokens(state: ServerState, ids: list[int]) -> list[int]:
    n_vocab = state.n_vocab
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool) or (n_vocab and not 0 <= t < n_vocab):
            raise invalid(f"token id {t!r} is out of range (vocabulary has {n_vocab} tokens)")
    return ids


# -- prompts --------------------------------------------------------------------------------


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


Prompt = tuple[list[int], tuple["MediaSpan", ...]]  # a prompt's tokens and its images' spans


def tokenize_prompts(state: ServerState, prompt: Any) -> list[Prompt]:
    """llama-server's tokenize_input_prompts: one token list (and image spans) per prompt.

    A list with any token id in it is one prompt (ids, or ids mixed with text); any other
    list holds several prompts, each text, ids, mixed, or a prompt object.
    """
    if isinstance(prompt, list) and not any(_is_id(p) for p in prompt):
        if not prompt:
            raise invalid("'prompt' must not be empty")
        if len(prompt) > MAX_PROMPTS:
            raise invalid(
                f"at most {MAX_PROMPTS} prompts are allowed in one request, got {len(prompt)}"
            )
        return [_subprompt(state, p) for p in prompt]
    return [_subprompt(state, prompt)]


def _subprompt(state: ServerState, p: Any) -> Prompt:
    if isinstance(p, str) or (
        isinstance(p, list) and all(_is_id(x) or isinstance(x, str) for x in p)
    ):
        return check_tokens(state, _tokenize_mixed(state, p)), ()
    if isinstance(p, dict) and PROMPT_STRING_KEY in p:
        text = p[PROMPT_STRING_KEY]
        if p.get(MULTIMODAL_KEY) is not None:
            # {"prompt_string": "... <__media__> ...", "multimodal_data": [base64, ...]}
            images = media.multimodal_data(state, p[MULTIMODAL_KEY])
            if not isinstance(text, str):
                raise invalid(f"'{PROMPT_STRING_KEY}' must be a string with 'multimodal_data'")
            refuse_oversized(state, len(text.encode("utf-8", "surrogatepass")))
            mp = media.tokenize(state, text, images)
            return list(mp.tokens), tuple(mp.media)
        if not isinstance(text, (str, list)) or (
            isinstance(text, list) and not all(_is_id(x) or isinstance(x, str) for x in text)
        ):
            raise invalid(
                f"'{PROMPT_STRING_KEY}' must be a string or a list of token ids and strings"
            )
        return check_tokens(state, _tokenize_mixed(state, text)), ()
    raise invalid(
        "'prompt' elements must be a string, a list of token ids, a list mixing token ids "
        f"and strings, or an object with a '{PROMPT_STRING_KEY}'"
    )


# A text of N bytes has at least N / max_token_bytes tokens. A prompt that cannot fit is
# refused before it is tokenized: a few MB of text keep a tokenizer busy for tens of seconds,
# which llama-server answers in a fraction of one. The margin keeps the bound safe should a
# tokenizer ever fold bytes (none of ours normalises): refusing a prompt that fits is worse
# than tokenizing one that does not.
_TOKEN_BYTES_MARGIN = 1.5


def refuse_oversized(state: ServerState, n_bytes: int, n_ids: int = 0) -> None:
    """Raise the context-size 400 when `n_bytes` of text plus `n_ids` token ids cannot fit."""
    at_least = n_ids + int(n_bytes / (state.tokenizer.max_token_bytes * _TOKEN_BYTES_MARGIN))
    if at_least >= state.n_ctx_seq > 0:
        raise exceed_context(at_least, state.n_ctx_seq, at_least=True)


def _tokenize_mixed(state: ServerState, p: str | list) -> list[int]:
    """llama.cpp tokenize_mixed: special tokens are added only for text that comes first."""
    tok = state.tokenizer
    parts = [p] if isinstance(p, str) else p
    texts = [x for x in parts if isinstance(x, str)]
    refuse_oversized(
        state, sum(len(x.encode("utf-8", "surrogatepass")) for x in texts), len(parts) - len(texts)
    )
    if isinstance(p, str):
        return tok.encode(p, add_special=True, parse_special=True)
    ids: list[int] = []
    for i, x in enumerate(p):
        if isinstance(x, str):
            ids.extend(tok.encode(x, add_special=(i == 0), parse_special=True))
        else:
            ids.append(x)
    return ids


def prompt_text(state: ServerState, prompt: Any, ids: list[int]) -> str:
    """The `prompt` a native reply echoes: the text as sent, else the prompt detokenized."""
    if isinstance(prompt, str):
        return prompt
    try:
        return state.tokenizer.decode(ids)
    except Exception:  # an id the detokenizer cannot show: the echo is only informative
        return ""


# -- several choices ------------------------------------------------------------------------


def n_choices(state: ServerState, body: OpenAICommon) -> int:
    """`n_cmpl`, else OpenAI's `n`: choices per prompt, at most the server's slots."""
    n = body.n_cmpl if body.n_cmpl is not None else body.n
    n = 1 if n is None else n
    if not 1 <= n <= max(state.n_slots, 1):
        raise invalid(
            f"'n' must be between 1 and the server's {state.n_slots} slots (-np), got {n}"
        )
    return n


def with_choices(reqs: list[GenerationRequest], n: int) -> list[GenerationRequest]:
    """Each request followed by its n - 1 siblings, in llama-server's result order.

    A sibling samples with seed + i (a random seed stays random) and takes any slot: only
    the first keeps the request's id_slot, so two choices never wait for one slot.
    """
    out = []
    for req in reqs:
        out.append(req)
        for i in range(1, n):
            seed = req.params.seed & 0xFFFFFFFF
            if seed != DEFAULT_SEED:
                seed = (seed + i) & 0xFFFFFFFF
            out.append(
                dataclasses.replace(
                    req, params=dataclasses.replace(req.params, seed=seed), id_slot=-1
                )
            )
    return out


# -- chat ------------------------------------------------------------------------------------


def chat_template(state: ServerState) -> PromptTemplate:
    if state.chat_template is None:
        raise invalid("this model has no chat template; start the server with --chat-template")
    return state.chat_template


def _messages(
    state: ServerState, body: ChatCompletionRequest | ApplyTemplateRequest, images: list[bytes]
) -> list[dict]:
    """The messages as the template sees them, checked as llama-server checks them; each
    image part becomes the media marker, its bytes appended to `images` in order."""
    out = []
    for i, m in enumerate(body.messages):
        d = m.model_dump(exclude_none=True)
        if m.role != "assistant" and "content" not in m.model_fields_set:
            raise invalid(f"messages[{i}]: every message but the assistant's must have 'content'")
        if m.role == "assistant" and m.content is None and not m.tool_calls:
            if "content" not in m.model_fields_set:
                raise invalid(
                    f"messages[{i}]: an assistant message must have 'content' or 'tool_calls'"
                )
        c = d.get("content")
        if isinstance(c, list):
            d["content"] = media.content_with_markers(state, c, images, f"messages[{i}]")
        out.append(d)
    return out


def _continuation(
    state: ServerState, body: ChatCompletionRequest | ApplyTemplateRequest, messages: list[dict]
) -> tuple[bool, bool]:
    """(add_generation_prompt, continue the last message), llama-server's rules."""
    add_gen = body.add_generation_prompt if body.add_generation_prompt is not None else True
    # only a chat completion asks to continue; /apply-template has no such field
    flag = body.continue_final_message if isinstance(body, ChatCompletionRequest) else None
    cont = flag is True or flag in ("content", "reasoning_content")
    last_is_assistant = bool(messages) and messages[-1].get("role") == "assistant"
    if not cont and state.options.prefill_assistant and last_is_assistant:
        if len(messages) >= 2 and messages[-2].get("role") == "assistant":
            raise invalid("Cannot have 2 or more assistant messages at the end of the list.")
        cont, add_gen = True, False
    if cont and add_gen:
        raise invalid("Cannot set both add_generation_prompt and continue_final_message to true.")
    if cont and last_is_assistant and messages[-1].get("tool_calls"):
        raise invalid("Cannot continue an assistant message that contains tool calls.")
    return add_gen, cont


def _content_text(message: dict, delimiter: str = "\n\n") -> str:
    """A message's text: its string, or its text parts joined (llama.cpp render_content)."""
    c = message.get("content")
    if isinstance(c, list):
        return delimiter.join(str(p.get("text", "")) for p in c if p.get("type", "text") == "text")
    return c if isinstance(c, str) else ""


def render_chat(state: ServerState, body: ChatCompletionRequest | ApplyTemplateRequest) -> str:
    """Apply the chat template (images loaded, each a media marker in the text)."""
    return render_chat_media(state, body)[0]


def render_chat_media(
    state: ServerState, body: ChatCompletionRequest | ApplyTemplateRequest
) -> tuple[str, list[bytes]]:
    """The rendered prompt and the images its media markers stand for, in order; a template
    that rejects the messages is a 400.

    A continued final message: the conversation before it, rendered up to the generation
    prompt, followed by the message's text, which the model then goes on with.
    """
    template = chat_template(state)
    images: list[bytes] = []
    messages = _messages(state, body, images)
    kwargs = dict(state.options.chat_template_kwargs or {})
    kwargs.update(body.chat_template_kwargs or {})
    _check_template_kwargs(kwargs)
    add_gen, cont = _continuation(state, body, messages)
    try:
        if cont:
            head = template.render(
                messages[:-1], add_generation_prompt=True, tools=body.tools, **kwargs
            )
            return head + _content_text(messages[-1]), images
        text = template.render(messages, add_generation_prompt=add_gen, tools=body.tools, **kwargs)
        return text, images
    except TemplateLimitError:
        raise  # the model's template is at fault (its limits grow with the input): a 500, as llama-server
    except TemplateError as e:
        raise invalid(f"the chat template rejected the messages: {e}") from None


# Template variables the server sets itself. llama-server lets chat_template_kwargs override
# them (messages, tools, bos/eos) and so renders a conversation other than the validated one;
# here that is a 400 naming the key.
RESERVED_TEMPLATE_VARIABLES = {
    "messages": "use the request's 'messages'",
    "tools": "use the request's 'tools'",
    "add_generation_prompt": "use the request's 'add_generation_prompt'",
    "bos_token": "the model's own token is used",
    "eos_token": "the model's own token is used",
}


def _check_template_kwargs(kwargs: dict) -> None:
    for key in kwargs:
        if key in RESERVED_TEMPLATE_VARIABLES:
            raise invalid(
                f"chat_template_kwargs may not set {key!r}: the server sets it "
                f"({RESERVED_TEMPLATE_VARIABLES[key]})"
            )


def reply_reading(
    state: ServerState, body: ChatCompletionRequest, prompt_text: str
) -> ReplyReading | None:
    """How the reply to a chat body is read: tool calls split out when the body declares tools
    (and neither tool_choice "none" nor parse_tool_calls false says otherwise), reasoning when
    the template knows `<think>` (unless reasoning_format "none"); None when neither applies.
    A gpt-oss (harmony) template's replies are always read: their channels are markup."""
    tool_names = tuple(
        str((t.get("function") or {}).get("name") or t.get("name") or "") for t in body.tools or []
    )
    parse_tools = (
        bool(tool_names) and body.tool_choice != "none" and body.parse_tool_calls is not False
    )
    source = state.chat_template.source if state.chat_template is not None else ""
    if is_harmony_template(source):
        return ReplyReading(
            tool_names=tool_names,
            parse_tools=parse_tools,
            reasoning=body.reasoning_format != "none",
            harmony=True,
        )
    reasoning = THINK_OPEN in source and body.reasoning_format != "none"
    if not (parse_tools or reasoning):
        return None
    return ReplyReading(
        tool_names=tool_names,
        parse_tools=parse_tools,
        reasoning=reasoning,
        starts_inside=reasoning and prompt_opens_reasoning(prompt_text),
    )


def chat_request(state: ServerState, body: ChatCompletionRequest) -> tuple[GenerationRequest, str]:
    """The request for one choice of a chat completion, and the rendered prompt text."""
    grammar = request_grammar(body, chat=True, tokenizer=state.tokenizer)
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid("top_logprobs requires logprobs to be set to true")
    template = chat_template(state)
    text, images = render_chat_media(state, body)
    refuse_oversized(state, len(text.encode("utf-8", "surrogatepass")))
    ids, spans = _chat_prompt(state, text, images)
    n_probs = (body.top_logprobs or 0) if body.logprobs else (body.n_probs or 0)
    req = GenerationRequest(
        prompt=ids,
        params=sampling_params(state, body, n_probs=n_probs, logprobs=bool(body.logprobs)),
        n_predict=n_predict(state, body.n_predict, body.max_completion_tokens, body.max_tokens),
        stop=stop_list(body.stop) + list(template.stop_strings),
        cache_prompt=state.options.cache_prompt if body.cache_prompt is None else body.cache_prompt,
        id_slot=-1 if body.id_slot is None else body.id_slot,
        n_keep=body.n_keep,
        grammar=grammar,
        media=spans,
    )
    return req, text


def chat_prompt_tokens(state: ServerState, body: ChatCompletionRequest) -> list[int]:
    """The prompt tokens a chat body renders to (each image its projected tokens)."""
    text, images = render_chat_media(state, body)
    refuse_oversized(state, len(text.encode("utf-8", "surrogatepass")))
    return _chat_prompt(state, text, images)[0]


def _chat_prompt(
    state: ServerState, text: str, images: list[bytes]
) -> tuple[list[int], tuple[MediaSpan, ...]]:
    """A rendered chat's tokens and image spans. With a projector, llama-server tokenizes every
    chat through mtmd_tokenize: a marker typed as text with no image is then a 400."""
    if not images and (state.projector is None or media.MEDIA_MARKER not in text):
        return encode_chat_prompt(state.tokenizer, text), ()
    prompt = media.tokenize(state, text, images)
    return list(prompt.tokens), tuple(prompt.media)


def completion_requests(state: ServerState, body: CompletionRequest) -> list[GenerationRequest]:
    """One request per prompt of a /completion or /v1/completions body."""
    if body.echo:
        raise invalid("'echo' is not supported")
    grammar = request_grammar(body, chat=False, tokenizer=state.tokenizer)
    prompts = tokenize_prompts(state, body.prompt)
    n_probs = body.n_probs if body.n_probs is not None else (body.logprobs or 0)
    base = GenerationRequest(
        prompt=prompts[0][0],
        params=sampling_params(state, body, n_probs=n_probs),
        n_predict=n_predict(state, body.n_predict, body.max_tokens),
        stop=stop_list(body.stop),
        cache_prompt=state.options.cache_prompt if body.cache_prompt is None else body.cache_prompt,
        id_slot=-1 if body.id_slot is None else body.id_slot,
        n_keep=body.n_keep,
        grammar=grammar,
    )
    return [dataclasses.replace(base, prompt=ids, media=spans) for ids, spans in prompts]


def completion_request(
    state: ServerState, body: CompletionRequest, native: bool = True
) -> GenerationRequest:
    """The request of a body with one prompt (several are a 400)."""
    reqs = completion_requests(state, body)
    if len(reqs) > 1:
        raise invalid("several prompts are not accepted here; send one prompt")
    return reqs[0]


def verbose(state: ServerState, body: SamplingFields) -> bool:
    """Whether replies carry `__verbose` (the request's `verbose`, else the server's --verbose)."""
    return (
        body.verbose if body.verbose is not None else bool(getattr(state.options, "verbose", False))
    )


def dumps_safe(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


__all__ = [
    "APIError",
    "chat_request",
    "completion_requests",
    "generation_settings",
    "tokenize_prompts",
]
