"""pydantic models of the request bodies, with the ranges llama-server and OpenAI accept.

Every field OpenAI's SDK or llama.cpp's clients send is declared (applied where this engine
implements it, accepted and ignored otherwise), so `extra="forbid"` only rejects fields
nobody defines; a typo such as `max_token` becomes a 400 that names the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_N_PROBS = 100  # llama.cpp has no limit; an n_vocab-wide reply per token is not useful
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_STOP = 16
_INT64 = (-(2**63), 2**63 - 1)
_UINT64_MAX = 2**64 - 1


def few_stops(v: Any) -> Any:
    """A stop field's value, refused when it lists more than MAX_STOP strings."""
    if isinstance(v, list) and len(v) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop strings are allowed")
    return v


# A prompt as llama-server takes it: text, token ids, ids mixed with text, an object
# {"prompt_string": ..., "multimodal_data": [...]}, or a list of several of those (one result
# each). requests.tokenize_prompts checks the shape and says what is wrong.
Prompt = str | dict[str, Any] | list[Any]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _drop_namespaced(cls, data: Any) -> Any:
        # llama.cpp clients send "speculative.n_max" style keys; nothing here uses them
        if isinstance(data, dict) and any(isinstance(k, str) and "." in k for k in data):
            return {k: v for k, v in data.items() if not (isinstance(k, str) and "." in k)}
        return data

    @model_validator(mode="after")
    def _ints_fit_int64(self) -> Any:
        # llama-server reads these into C integers; past int64 numpy and the sampler raise
        # OverflowError (a 500) where a 400 names the field
        for name, value in self:
            if type(value) is int and not _INT64[0] <= value <= (
                _UINT64_MAX if name == "seed" else _INT64[1]
            ):
                raise ValueError(
                    f"{name} is out of range: {str(value)[:40]} does not fit a 64-bit integer"
                )
        return self


class SamplingFields(_Body):
    """Sampling and stopping fields shared by every generation endpoint (llama.cpp names)."""

    temperature: float | None = Field(None, ge=0.0, le=100.0)
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    top_k: int | None = Field(None, ge=-1)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    typical_p: float | None = Field(None, ge=0.0, le=1.0)
    top_n_sigma: float | None = None
    repeat_penalty: float | None = Field(None, ge=0.0, le=100.0)
    repeat_last_n: int | None = Field(None, ge=-1)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    penalize_nl: bool | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: list[str] | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    mirostat: int | None = Field(None, ge=0, le=2)
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    adaptive_target: float | None = Field(None, le=1.0)
    adaptive_decay: float | None = Field(None, ge=0.0, le=0.99)
    seed: int | None = Field(None, ge=-1, le=2**64 - 1)
    logit_bias: dict[str, Any] | list[Any] | None = None  # checked by requests.logit_bias
    ignore_eos: bool | None = None
    min_keep: int | None = Field(None, ge=0)
    n_probs: int | None = Field(None, ge=0, le=MAX_N_PROBS)
    stop: str | list[str] | None = None
    cache_prompt: bool | None = None
    id_slot: int | None = Field(None, ge=-1)
    n_keep: int | None = Field(None, ge=-1)
    n_discard: int | None = None
    n_indent: int | None = None
    t_max_predict_ms: int | None = None
    t_max_prompt_ms: int | None = None
    samplers: list[str] | str | None = None
    grammar: str | None = None
    grammar_lazy: bool | None = None
    grammar_triggers: list[Any] | None = None
    preserved_tokens: list[Any] | None = None
    json_schema: dict | None = None
    return_tokens: bool | None = None
    return_progress: bool | None = None
    post_sampling_probs: bool | None = None
    timings_per_token: bool | None = None
    response_fields: list[str] | None = None
    lora: list[Any] | None = None
    n_cmpl: int | None = Field(None, ge=1)
    id_task: int | None = None
    verbose: bool | None = None
    backend_sampling: bool | None = None
    sse_ping_interval: int | None = Field(None, ge=-1)
    n_cache_reuse: int | None = Field(None, ge=0)
    chat_format: int | None = None
    generation_prompt: str | None = None
    reasoning_control: bool | None = None
    reasoning_budget_tokens: int | None = Field(None, ge=-1)

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v):
        return few_stops(v)


class OpenAICommon(SamplingFields):
    """The fields chat and text completions share: OpenAI's create-completion fields (mostly
    accepted and ignored), streaming, and response_format (a JSON schema, constraints.py)."""

    model: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=0)
    n_predict: int | None = Field(None, ge=-1)
    n: int | None = Field(None, ge=1)  # at most the server's slots (requests.n_choices)
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    response_format: dict[str, Any] | None = None  # engine/server/constraints.py


class ContentPart(BaseModel):
    """One part of a message's content; only text parts are rendered (others are a 400)."""

    model_config = ConfigDict(extra="allow")

    type: str | None = None
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = Field(..., min_length=1, max_length=64)
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class ChatCompletionRequest(OpenAICommon):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    web_search_options: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: str | None = None
    parse_tool_calls: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | str | None = None  # true, "content" or "reasoning_content"
    enable_thinking: bool | None = None


class CompletionRequest(OpenAICommon):
    """POST /v1/completions (OpenAI) and POST /completion (llama.cpp native)."""

    prompt: Prompt = Field(..., alias="prompt")
    content: Prompt | None = None  # llama.cpp's older name for prompt
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    image_data: list[Any] | None = None
    multimodal_data: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _content_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and "prompt" not in data and "content" in data:
            data = dict(data)
            data["prompt"] = data.pop("content")
        return data


class TokenizeRequest(_Body):
    content: str
    model: str | None = None  # routes the request in router mode; a single model ignores it
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Body):
    tokens: list[int] = Field(..., max_length=1_000_000)
    model: str | None = None


class ApplyTemplateRequest(_Body):
    messages: list[ChatMessage] = Field(..., min_length=1)
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    model: str | None = None


EmbeddingInput = str | list[str] | list[int] | list[list[int]]


class EmbeddingsRequest(_Body):
    """POST /v1/embeddings (OpenAI) and POST /embedding (llama.cpp: `content`)."""

    input: EmbeddingInput | None = None
    content: EmbeddingInput | None = None
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    embd_normalize: int | None = Field(None, ge=-1)

    @model_validator(mode="after")
    def _one_input(self):
        if self.input is None and self.content is None:
            raise ValueError("'input' (or 'content') is required")
        return self

    @property
    def items(self) -> EmbeddingInput:
        items = self.input if self.input is not None else self.content
        assert items is not None  # _one_input rejects a body without either
        return items
