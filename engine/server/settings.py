"""What llama-server reports as a request's `generation_settings` (the /completion reply, the
slot `params` of /slots, /props' `default_generation_settings.params`).

The object has every key llama-server's task_params::to_json writes, in its order, so clients
that read one (its web UI, the test suite, monitoring) find it. Sampling fields this engine
applies come from the request's SamplingParams; the ones it accepts but does not apply (DRY,
Mirostat, adaptive-p...) report the request's value, else llama-server's default, so a
client reads back what it sent. A banned token's bias (-inf) is JSON null, as llama-server
writes it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..scheduler import GenerationRequest
    from .schemas import SamplingFields
    from .state import ServerState

# llama.cpp's defaults (common_params_sampling) for the fields reported but not applied here
REPORTED_DEFAULTS: dict[str, Any] = {
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": 64,
    "dry_sequence_breakers": ["\n", ":", '"', "*"],
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "adaptive_target": -1.0,
    "adaptive_decay": 0.9,
}


def _bias_list(bias: dict[int, float], eog_ids: list[int]) -> list[dict]:
    out = [{"bias": b if math.isfinite(b) else None, "token": int(t)} for t, b in bias.items()]
    # llama-server appends the end-of-generation bans of ignore_eos after the request's own
    out += [{"bias": None, "token": int(t)} for t in eog_ids]
    return out


def generation_settings(
    state: ServerState,
    req: GenerationRequest | None = None,
    stream: bool = False,
    body: SamplingFields | None = None,
) -> dict:
    """llama-server's `generation_settings` for `req` (the server's defaults when None), with the
    accepted-but-not-applied fields `body` gave."""
    params = req.params if req is not None else state.options.default_sampling
    given = body.model_dump(exclude_none=True) if body is not None else {}
    extra = {k: given.get(k, v) for k, v in REPORTED_DEFAULTS.items()}
    p = dataclasses.asdict(params)
    eog = sorted(state.tokenizer.eog_ids) if params.ignore_eos and state.is_ready else []
    n_predict = req.n_predict if req is not None else state.options.n_predict
    n_keep = req.n_keep if req is not None and req.n_keep is not None else _server_n_keep(state)
    return {
        "seed": int(p["seed"]) & 0xFFFFFFFF,  # a uint32 in llama.cpp: -1 reads 4294967295
        "temperature": p["temperature"],
        "dynatemp_range": p["dynatemp_range"],
        "dynatemp_exponent": p["dynatemp_exponent"],
        "top_k": p["top_k"],
        "top_p": p["top_p"],
        "min_p": p["min_p"],
        "top_n_sigma": p["top_n_sigma"],
        "xtc_probability": p["xtc_probability"],
        "xtc_threshold": p["xtc_threshold"],
        "typical_p": p["typical_p"],
        "repeat_last_n": p["repeat_last_n"],
        "repeat_penalty": p["repeat_penalty"],
        "presence_penalty": p["presence_penalty"],
        "frequency_penalty": p["frequency_penalty"],
        "dry_multiplier": extra["dry_multiplier"],
        "dry_base": extra["dry_base"],
        "dry_allowed_length": extra["dry_allowed_length"],
        "dry_penalty_last_n": extra["dry_penalty_last_n"],
        "dry_sequence_breakers": extra["dry_sequence_breakers"],
        "mirostat": extra["mirostat"],
        "mirostat_tau": extra["mirostat_tau"],
        "mirostat_eta": extra["mirostat_eta"],
        "adaptive_target": extra["adaptive_target"],
        "adaptive_decay": extra["adaptive_decay"],
        "stop": list(req.stop) if req is not None else [],
        "max_tokens": n_predict,
        "n_predict": n_predict,
        "n_keep": n_keep,
        "n_discard": given.get("n_discard", 0),
        "ignore_eos": p["ignore_eos"],
        "stream": stream,
        "logit_bias": _bias_list(dict(params.logit_bias), eog),
        "n_probs": p["n_probs"],
        "min_keep": p["min_keep"],
        "grammar": given.get("grammar", ""),
        "grammar_lazy": given.get("grammar_lazy", False),
        "grammar_triggers": [],
        "preserved_tokens": [],
        "chat_format": "Content-only",
        "reasoning_format": given.get("reasoning_format", "deepseek"),
        "reasoning_in_content": False,
        "generation_prompt": given.get("generation_prompt", ""),
        "samplers": list(p["samplers"]),
        "speculative.types": "none",
        "timings_per_token": given.get("timings_per_token", False),
        "post_sampling_probs": p["post_sampling_probs"],
        "backend_sampling": given.get("backend_sampling", False),
        "lora": [],
    }


def _server_n_keep(state: ServerState) -> int:
    return int(getattr(state.scheduler, "n_keep", 0) or 0) if state.is_ready else 0
