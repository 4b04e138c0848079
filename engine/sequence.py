"""One sequence's generation state: logits in, sampled tokens and released text out.

`SequenceGenerator` owns everything that happens to a sequence after the model has run:
the grammar mask (engine/grammar.py), sampling, streaming detokenization, end-of-generation
tokens, the token limit and stop strings, and the sequence's timings. It never touches the
model: the scheduler (engine/scheduler.py) feeds each slot its row of logits, and every front
end (server, CLI, desktop app) gets the `GenerationStep`s it returns.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .errors import EngineError
from .sampling import SamplingParams, candidate_probs, logsumexp, make_sampler, top_logprobs
from .seams import GenerationTokenizer
from .tokenizer.detokenizer import StreamingDetokenizer

if TYPE_CHECKING:
    from .grammar import Grammar


@dataclass(frozen=True, slots=True)
class GenerationStep:
    """One sampled token and the text it released.

    Attributes:
        token: the sampled token id.
        text_delta: new text to show; may be empty (an incomplete UTF-8 character, text held
            back because it could start a stop string, or an end-of-generation token).
        logprob: natural-log probability of `token` under the raw logits (plain softmax); NaN
            when the request's SamplingParams.logprobs is False and it asks for no n_probs.
        top_logprobs: the `n_probs` most likely (token, logprob) pairs, most likely first.
        finish_reason: None while generating, 'stop' (end-of-generation token or stop
            string) or 'length' (token limit or end of the context) on the last step.
        n_prompt: prompt tokens; n_cached of them were reused from the KV cache.
        n_generated: tokens sampled so far, this one included.
        t_prompt_ms: time from the start of prompt processing to the first token's logits.
        t_gen_ms: time from the first sampled token to this one.
        stop_word: the stop string that ended generation, if one did.
        truncated: the context ran out: a context shift dropped tokens, or the reply was cut
            at the end of the context (llama-server's `truncated`).
        prob: with params.post_sampling_probs, `token`'s probability after the sampler chain
            (None otherwise); top_probs: the `n_probs` most likely (token, probability) pairs
            after the chain, most likely first.
    """

    token: int
    text_delta: str
    logprob: float
    top_logprobs: tuple[tuple[int, float], ...]
    finish_reason: str | None
    n_prompt: int
    n_generated: int
    n_cached: int
    t_prompt_ms: float
    t_gen_ms: float
    stop_word: str | None = None
    truncated: bool = False
    prob: float | None = None
    top_probs: tuple[tuple[int, float], ...] = ()


class Detokenizer(Protocol):
    """Token ids in, newly complete text out (engine.tokenizer.detokenizer)."""

    def add(self, token_id: int) -> str: ...
    def flush(self) -> str: ...


class SequenceGenerator:
    """Per-sequence generation state: feed it one row of logits per step with `accept()`.

    Args:
        tokenizer: the model's tokenizer (is_eog, and what the streaming detokenizer needs).
        params: sampling parameters; the sampler and its seeded RNG are built here.
        n_predict: maximum tokens to generate; -1 means no limit.
        n_room: tokens the context has room for; reaching it ends the reply like n_predict
            but marks it truncated (-1: unlimited, the caller shifts the context).
        stop: stop strings; the text stops before the first occurrence of any of them.
        prompt_tokens: the prompt (the penalties look at it; its length is reported).
        n_cached: prompt tokens reused from the KV cache (reported only).
        detokenizer: a streaming detokenizer (`add(id) -> str`, `flush() -> str`); by
            default `StreamingDetokenizer(tokenizer)`.
        grammar: constrain the output to this grammar: every step samples only among the
            tokens it allows (llama.cpp applies its grammar first too), and once it is
            complete only end-of-generation tokens are, so the reply ends with 'stop'.

    The prompt timer starts when the object is created: the scheduler creates it when the
    request takes its slot. After the step whose finish_reason is set, `accept` must not be
    called again.
    """

    def __init__(
        self,
        tokenizer: GenerationTokenizer,
        params: SamplingParams,
        n_predict: int = -1,
        stop: Sequence[str] = (),
        *,
        n_room: int = -1,
        prompt_tokens: Sequence[int] = (),
        n_cached: int = 0,
        detokenizer: Detokenizer | None = None,
        grammar: Grammar | None = None,
    ):
        self.tokenizer = tokenizer
        self.params = params
        self.n_predict = n_predict
        self.n_room = n_room
        self.truncated = False  # also set by the scheduler when it shifts the context
        self.stop = tuple(s for s in stop if s)
        self.n_prompt = len(prompt_tokens)
        self.n_cached = n_cached
        self.sampler = make_sampler(params, sorted(tokenizer.eog_ids) if params.ignore_eos else ())
        self._detok = detokenizer if detokenizer is not None else StreamingDetokenizer(tokenizer)
        self.matcher = None
        if grammar is not None:
            from .grammar import GrammarMatcher  # llguidance only for constrained requests

            self.matcher = GrammarMatcher(grammar, tokenizer)
        # prompt + generated: the penalties' window (image positions, negative, are no tokens)
        self._history = [t for t in prompt_tokens if t >= 0]
        self.tokens: list[int] = []  # generated ids
        self.text = ""  # text released so far (concatenation of every text_delta)
        self.finish_reason: str | None = None
        self._pending = ""  # detokenized text not yet released (may start a stop string)
        self._t_start = time.perf_counter()
        self._t_first: float | None = None
        self._t_prompt_ms = 0.0

    @property
    def seed(self) -> int:
        """The seed the sampler actually uses."""
        return self.sampler.seed

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def accept(self, logits: np.ndarray) -> GenerationStep:
        """Sample the next token from `logits` (n_vocab,) and return its step.

        Args:
            logits: this sequence's row of raw logits. Log-probabilities are reported from
                these, before the grammar mask (llama-server's default, pre-sampling probs).
        """
        if self.finished:
            raise EngineError("generation already finished")
        if self.matcher is None:
            token = self.sampler.sample(logits, self._history)
        else:
            token = self._sample_constrained(logits)
        now = time.perf_counter()
        if self._t_first is None:
            self._t_first = now
            self._t_prompt_ms = (now - self._t_start) * 1e3
        lse = logsumexp(logits) if self.params.logprobs or self.params.n_probs > 0 else None
        prob: float | None = None
        top_probs: tuple[tuple[int, float], ...] = ()
        if self.params.post_sampling_probs and self.sampler.last_candidates is not None:
            prob, top_probs = candidate_probs(
                self.sampler.last_candidates, self.params.n_probs, token
            )
        self._history.append(token)
        self.tokens.append(token)

        text, stop_word = self._advance(token)
        self.text += text
        return GenerationStep(
            token=token,
            text_delta=text,
            logprob=float(logits[token]) - lse if lse is not None else math.nan,
            top_logprobs=top_logprobs(logits, self.params.n_probs, lse),
            finish_reason=self.finish_reason,
            n_prompt=self.n_prompt,
            n_generated=len(self.tokens),
            n_cached=self.n_cached,
            t_prompt_ms=self._t_prompt_ms,
            t_gen_ms=(now - self._t_first) * 1e3,
            stop_word=stop_word,
            truncated=self.truncated,
            prob=prob,
            top_probs=top_probs,
        )

    def _sample_constrained(self, logits: np.ndarray) -> int:
        """Sample among the tokens the grammar allows, then advance the grammar."""
        m = self.matcher
        assert m is not None
        if m.error:  # a parser limit hit on an earlier step: fail rather than end silently
            raise EngineError(f"grammar: {m.error}")
        token = self.sampler.sample(m.apply(logits), self._history)
        if not m.accept(token):
            raise EngineError(f"the grammar rejected token {token}: {m.error}")
        return token

    def _advance(self, token: int) -> tuple[str, str | None]:
        """Update the text state for `token`; returns (text to release, stop word or None)."""
        # an end-of-generation token the grammar accepted completes it, even with ignore_eos
        # (the sampler only picks one when the grammar allows nothing else)
        if (self.matcher is not None or not self.params.ignore_eos) and self.tokenizer.is_eog(
            token
        ):
            self.finish_reason = "stop"
            return self._release_all(), None
        self._pending += self._detok.add(token)
        hit = _find_stop(self._pending, self.stop)
        if hit is not None:
            pos, word = hit
            self.finish_reason = "stop"
            text, self._pending = self._pending[:pos], ""
            return text, word
        n = len(self.tokens)
        if 0 <= self.n_predict <= n or 0 <= self.n_room <= n:
            self.finish_reason = "length"
            self.truncated |= 0 <= self.n_room <= n and not 0 <= self.n_predict <= n
            return self._release_all(), None
        n_hold = _partial_stop_len(self._pending, self.stop)
        cut = len(self._pending) - n_hold
        text, self._pending = self._pending[:cut], self._pending[cut:]
        return text, None

    def _release_all(self) -> str:
        text = self._pending + self._detok.flush()
        self._pending = ""
        return text


# -- helpers -------------------------------------------------------------------------------


def _find_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """Earliest occurrence of any stop string in `text`: (position, stop string)."""
    best = None
    for s in stops:
        pos = text.find(s)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, s)
    return best


def _partial_stop_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best
