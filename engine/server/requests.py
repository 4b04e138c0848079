"""From validated HTTP bodies to scheduler requests: prompts, sampling params, limits.

Nothing here touches the network: route handlers call these, so the rules (which field
wins, how a mixed prompt is tokenized, what a logit bias list means) are testable alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import TYPE_CHECKING

from ..errors import APIError, TemplateError, TemplateLimitError
from ..sampling import SamplingParams
from ..scheduler import GenerationRequest
from ..tokenizer.chat_template import encode_chat_prompt
from .constraints import request_grammar
from .errors import invalid
from .schemas import ApplyTemplateRequest, ChatCompletionRequest, CompletionRequest, SamplingFields

if TYPE_CHECKING:
    from ..seams import PromptTemplate
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
}


def sampling_params(state: ServerState, body: SamplingFields, n_probs: int | None = None) -> SamplingParams:
    """The server's default SamplingParams with the request's fields applied."""
    given = body.model_dump(include=set(_SAMPLING_FIELDS), exclude_none=True)
    kw = {_SAMPLING_FIELDS[k]: v for k, v in given.items()}
    if n_probs is not None:
        kw["n_probs"] = n_probs
    if body.logit_bias is not None:
        kw["logit_bias"] = logit_bias(state, body.logit_bias)
    return dataclasses.replace(state.options.default_sampling, **kw)


def logit_bias(state, raw) -> dict[int, float]:
    """OpenAI {"id": bias} or llama.cpp [[id_or_text, bias_or_false], ...] -> {id: bias}."""
    pairs = raw.items() if isinstance(raw, dict) else raw
    n_vocab = state.n_vocab
    out: dict[int, float] = {}
    for key, bias in pairs:
        value = _bias_value(bias)
        for t in _bias_tokens(state, key):
            if n_vocab and not 0 <= t < n_vocab:
                raise invalid(f"logit_bias token id {t} is out of range (vocabulary has {n_vocab} tokens)")
            out[t] = out.get(t, 0.0) + value
    return out


def _bias_value(bias) -> float:
    if bias is False:
        return -math.inf
    try:
        value = float(bias) if isinstance(bias, (int, float)) and not isinstance(bias, bool) else math.nan
    except OverflowError:  # an integer past a double
        value = math.nan
    if not math.isfinite(value):
        raise invalid(f"logit_bias values must be finite numbers or false, got {str(bias)[:40]}")
    return value


def _bias_tokens(state, key) -> list[int]:
    if isinstance(key, str) and not key.lstrip("-").isdigit():
        return state.tokenizer.encode(key, add_special=False, parse_special=False)
    if isinstance(key, str) or (isinstance(key, int) and not isinstance(key, bool)):
        return [int(key)]
    raise invalid(f"logit_bias keys must be token ids or text, got {str(key)[:40]}")


def stop_list(stop) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else [s for s in stop if s]


def n_predict(state, *candidates) -> int:
    """The first given limit among the request's fields, else the server's -n: as in
    llama-server, -n is the default a request's own n_predict / max_tokens overrides."""
    n = next((c for c in candidates if c is not None), -1)
    if n < 0 and state.options.n_predict is not None:
        n = state.options.n_predict
    return n


def check_tokens(state, ids: list[int]) -> list[int]:
    n_vocab = state.n_vocab
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool) or (n_vocab and not 0 <= t < n_vocab):
            raise invalid(f"token id {t!r} is out of range (vocabulary has {n_vocab} tokens)")
    return ids


# -- prompts --------------------------------------------------------------------------------


def tokenize_prompt(state, prompt) -> list[int]:
    """llama.cpp tokenize_mixed: a string, or a list mixing token ids and strings."""
    tok = state.tokenizer
    if isinstance(prompt, str):
        return tok.encode(prompt, add_special=True, parse_special=True)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        return tokenize_prompt(state, prompt[0])
    if isinstance(prompt, list) and all(isinstance(p, (int, str)) and not isinstance(p, bool) for p in prompt):
        if all(isinstance(p, str) for p in prompt) and len(prompt) > 1:
            raise invalid("several prompts in one request are not supported; send one request per prompt")
        ids: list[int] = []
        for i, p in enumerate(prompt):
            if isinstance(p, int):
                ids.append(p)
            else:
                ids.extend(tok.encode(p, add_special=(i == 0), parse_special=True))
        return check_tokens(state, ids)
    raise invalid("'prompt' must be a string, a list of token ids, or a list mixing both")


def chat_template(state: ServerState) -> PromptTemplate:
    if state.chat_template is None:
        raise invalid("this model has no chat template; start the server with --chat-template")
    return state.chat_template


def render_chat(state: ServerState, body: ChatCompletionRequest | ApplyTemplateRequest) -> str:
    """Apply the chat template; a template that rejects the messages is a 400."""
    template = chat_template(state)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    for i, m in enumerate(messages):
        c = m.get("content")
        if isinstance(c, list):
            for part in c:
                if part.get("type") not in (None, "text"):
                    raise invalid(f"messages[{i}]: content part of type {part.get('type')!r} is not "
                                  "supported (text only: this server has no multimodal support)")
    kwargs = dict(state.options.chat_template_kwargs or {})
    kwargs.update(body.chat_template_kwargs or {})
    _check_template_kwargs(kwargs)
    add_gen = body.add_generation_prompt if body.add_generation_prompt is not None else True
    try:
        return template.render(messages, add_generation_prompt=add_gen,
                                          tools=body.tools, **kwargs)
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
            raise invalid(f"chat_template_kwargs may not set {key!r}: the server sets it "
                          f"({RESERVED_TEMPLATE_VARIABLES[key]})")


def chat_request(state, body: ChatCompletionRequest) -> tuple[GenerationRequest, str]:
    grammar = request_grammar(body, chat=True, tokenizer=state.tokenizer)
    template = chat_template(state)
    prompt_text = render_chat(state, body)
    ids = encode_chat_prompt(state.tokenizer, prompt_text)
    n_probs = (body.top_logprobs or 0) if body.logprobs else (body.n_probs or 0)
    req = GenerationRequest(
        prompt=ids,
        params=sampling_params(state, body, n_probs=n_probs),
        n_predict=n_predict(state, body.max_completion_tokens, body.max_tokens, body.n_predict),
        stop=stop_list(body.stop) + list(template.stop_strings),
        cache_prompt=state.options.cache_prompt if body.cache_prompt is None else body.cache_prompt,
        id_slot=-1 if body.id_slot is None else body.id_slot,
        grammar=grammar,
    )
    return req, prompt_text


def completion_request(state, body: CompletionRequest, native: bool) -> GenerationRequest:
    if body.echo:
        raise invalid("'echo' is not supported")
    grammar = request_grammar(body, chat=False, tokenizer=state.tokenizer)
    ids = tokenize_prompt(state, body.prompt)
    if native:
        n_probs = body.n_probs or 0
        limit = n_predict(state, body.n_predict, body.max_tokens)
    else:
        n_probs = body.logprobs if body.logprobs is not None else (body.n_probs or 0)
        limit = n_predict(state, body.max_tokens, body.n_predict)
    return GenerationRequest(
        prompt=ids,
        params=sampling_params(state, body, n_probs=n_probs),
        n_predict=limit,
        stop=stop_list(body.stop),
        cache_prompt=state.options.cache_prompt if body.cache_prompt is None else body.cache_prompt,
        id_slot=-1 if body.id_slot is None else body.id_slot,
        grammar=grammar,
    )


def generation_settings(state, req: GenerationRequest | None = None, stream: bool = False) -> dict:
    """llama-server's `generation_settings` / slot `params` object."""
    params = req.params if req is not None else state.options.default_sampling
    d = {}
    for k, v in dataclasses.asdict(params).items():
        if isinstance(v, dict):  # logit_bias: llama.cpp lists [token, bias], false = banned
            v = [[int(t), b if math.isfinite(b) else False] for t, b in v.items()]
        elif isinstance(v, float) and not math.isfinite(v):
            v = None
        d[k] = v
    d.update({
        "n_ctx": state.n_ctx_seq,
        "n_predict": req.n_predict if req is not None else state.options.n_predict,
        "stop": list(req.stop) if req is not None else [],
        "stream": stream,
        "cache_prompt": req.cache_prompt if req is not None else state.options.cache_prompt,
        "model": state.model_alias,
    })
    return d


def dumps_safe(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


__all__ = ["APIError", "chat_request", "completion_request", "generation_settings", "tokenize_prompt"]
