"""Turning logits into a stream of text: the per-sequence state machine and a simple loop.

`SequenceGenerator` owns everything that happens to one sequence after the model has run:
sampling, streaming detokenization, end-of-generation tokens, the token limit and stop
strings. It never touches the model, so two drivers share it:

- `generate()` below: one sequence, prompt then one token at a time (CLI, tests, bench);
- the server's continuous-batching scheduler, which feeds each slot its row of logits.

Both yield `GenerationStep`s, one per sampled token.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import ContextOverflowError, EngineError
from .sampling import SamplingParams, logsumexp, make_sampler, top_logprobs


@dataclass(frozen=True, slots=True)
class GenerationStep:
    """One sampled token and the text it released.

    Attributes:
        token: the sampled token id.
        text_delta: new text to show; may be empty (an incomplete UTF-8 character, text held
            back because it could start a stop string, or an end-of-generation token).
        logprob: natural-log probability of `token` under the raw logits (plain softmax).
        top_logprobs: the `n_probs` most likely (token, logprob) pairs, most likely first.
        finish_reason: None while generating, 'stop' (end-of-generation token or stop
            string) or 'length' (token limit or end of the context) on the last step.
        n_prompt: prompt tokens; n_cached of them were reused from the KV cache.
        n_generated: tokens sampled so far, this one included.
        t_prompt_ms: time from the start of prompt processing to the first token's logits.
        t_gen_ms: time from the first sampled token to this one.
        stop_word: the stop string that ended generation, if one did.
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


class SequenceGenerator:
    """Per-sequence generation state: feed it one row of logits per step with `accept()`.

    Args:
        tokenizer: the model's tokenizer (is_eog, and what the streaming detokenizer needs).
        params: sampling parameters; the sampler and its seeded RNG are built here.
        n_predict: maximum tokens to generate; -1 means no limit.
        stop: stop strings; the text stops before the first occurrence of any of them.
        prompt_tokens: the prompt (the penalties look at it; its length is reported).
        n_cached: prompt tokens reused from the KV cache (reported only).
        detokenizer: a streaming detokenizer (`add(id) -> str`, `flush() -> str`); by
            default `StreamingDetokenizer(tokenizer)`.

    Timing starts when the object is created (call `start_prompt()` to restart it when the
    prompt is actually scheduled). After the step whose finish_reason is set, `accept` must
    not be called again.
    """

    def __init__(
        self,
        tokenizer,
        params: SamplingParams,
        n_predict: int = -1,
        stop: Sequence[str] = (),
        *,
        prompt_tokens: Sequence[int] = (),
        n_cached: int = 0,
        detokenizer=None,
    ):
        self.tokenizer = tokenizer
        self.params = params
        self.n_predict = n_predict
        self.stop = tuple(s for s in stop if s)
        self.n_prompt = len(prompt_tokens)
        self.n_cached = n_cached
        self.sampler = make_sampler(params, _eog_ids(tokenizer) if params.ignore_eos else ())
        if detokenizer is None:
            from .tokenizer.detokenizer import StreamingDetokenizer

            detokenizer = StreamingDetokenizer(tokenizer)
        self._detok = detokenizer
        self._history = list(prompt_tokens)  # prompt + generated: the penalties' window
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

    def start_prompt(self) -> None:
        """Restart the prompt timer (when the prompt starts being processed)."""
        self._t_start = time.perf_counter()

    def accept(self, logits: np.ndarray, *, ctx_full: bool = False) -> GenerationStep:
        """Sample the next token from `logits` (n_vocab,) and return its step.

        Args:
            logits: this sequence's row of raw logits.
            ctx_full: the caller has no room to decode the sampled token, so this step is
                the last one (finish_reason 'length' unless something else ends it first).
        """
        if self.finished:
            raise EngineError("generation already finished")
        token = self.sampler.sample(logits, self._history)
        now = time.perf_counter()
        if self._t_first is None:
            self._t_first = now
            self._t_prompt_ms = (now - self._t_start) * 1e3
        lse = logsumexp(logits)
        self._history.append(token)
        self.tokens.append(token)

        text, stop_word = self._advance(token, ctx_full)
        self.text += text
        return GenerationStep(
            token=token,
            text_delta=text,
            logprob=float(logits[token]) - lse,
            top_logprobs=top_logprobs(logits, self.params.n_probs, lse),
            finish_reason=self.finish_reason,
            n_prompt=self.n_prompt,
            n_generated=len(self.tokens),
            n_cached=self.n_cached,
            t_prompt_ms=self._t_prompt_ms,
            t_gen_ms=(now - self._t_first) * 1e3,
            stop_word=stop_word,
        )

    def _advance(self, token: int, ctx_full: bool) -> tuple[str, str | None]:
        """Update the text state for `token`; returns (text to release, stop word or None)."""
        if not self.params.ignore_eos and self.tokenizer.is_eog(token):
            self.finish_reason = "stop"
            return self._release_all(), None
        self._pending += self._detok.add(token)
        hit = _find_stop(self._pending, self.stop)
        if hit is not None:
            pos, word = hit
            self.finish_reason = "stop"
            text, self._pending = self._pending[:pos], ""
            return text, word
        if ctx_full or 0 <= self.n_predict <= len(self.tokens):
            self.finish_reason = "length"
            return self._release_all(), None
        n_hold = _partial_stop_len(self._pending, self.stop)
        cut = len(self._pending) - n_hold
        text, self._pending = self._pending[:cut], self._pending[cut:]
        return text, None

    def _release_all(self) -> str:
        text = self._pending + self._detok.flush()
        self._pending = ""
        return text


def generate(
    ctx,
    prompt_tokens: Sequence[int],
    params: SamplingParams = SamplingParams(),
    *,
    n_predict: int = -1,
    stop: Sequence[str] = (),
    seq_id: int = 0,
    n_keep: int = 0,
    context_shift: bool = False,
    cancel: threading.Event | None = None,
    cached: list[int] | None = None,
) -> Iterator[GenerationStep]:
    """Generate from one sequence of `ctx`: prompt in chunks of n_batch, then token by token.

    Args:
        ctx: an engine.context.Context.
        prompt_tokens: the tokenized prompt.
        params: sampling parameters.
        n_predict: maximum tokens to generate; -1 means until a stop condition.
        stop: stop strings.
        seq_id: the KV-cache sequence to use.
        n_keep: with context_shift, positions at the start never discarded (-1: the whole
            prompt).
        context_shift: when the context is full, discard half of the positions after
            n_keep and continue (llama.cpp --context-shift) instead of finishing 'length'.
        cancel: when set, generation stops before the next model call (no final step).
        cached: the tokens currently in the KV cache for seq_id. The longest common prefix
            with the prompt is reused, and the list is kept equal to the cache's contents
            (trimmed, extended, shifted) so the caller can pass it again next turn. None
            clears the sequence first.

    Yields:
        One GenerationStep per sampled token; the last one has finish_reason set.

    Raises:
        ContextOverflowError: the prompt does not fit in the sequence's context.
    """
    from .batch import Batch

    n_prompt = len(prompt_tokens)
    n_ctx = ctx.n_ctx_seq
    if n_prompt == 0:
        raise EngineError("the prompt is empty")
    if n_prompt >= n_ctx:
        raise ContextOverflowError(
            f"the prompt has {n_prompt} tokens but the context holds {n_ctx} "
            f"(it needs at least {n_prompt + 1}); raise -c/--ctx-size"
        )
    if n_predict == 0:
        return
    if cached is None:
        cached = []
    n_cached = min(_common_prefix(cached, prompt_tokens), n_prompt - 1)
    ctx.kv.seq_rm(seq_id, n_cached, -1)
    del cached[n_cached:]

    tokenizer = ctx.model.tokenizer
    gen = SequenceGenerator(
        tokenizer, params, n_predict, stop, prompt_tokens=prompt_tokens, n_cached=n_cached
    )
    n_batch = ctx.n_batch
    logits = None
    for i in range(n_cached, n_prompt, n_batch):
        if cancel is not None and cancel.is_set():
            return
        chunk = list(prompt_tokens[i : i + n_batch])
        last = i + n_batch >= n_prompt
        out = ctx.decode(Batch.for_sequence(chunk, i, seq_id, logits_last=last))
        cached.extend(chunk)
        if last:
            logits = out[-1]

    n_keep = n_prompt if n_keep < 0 else n_keep
    n_past = n_prompt
    while True:
        if cancel is not None and cancel.is_set():
            return
        room = n_past < n_ctx or (context_shift and (n_past - min(n_keep, n_past)) // 2 > 0)
        step = gen.accept(logits, ctx_full=not room)
        yield step
        if step.finish_reason is not None:
            return
        if n_past >= n_ctx:  # context shift (llama.cpp: n_discard = (n_past - n_keep) / 2)
            keep = min(n_keep, n_past)
            n_discard = (n_past - keep) // 2
            ctx.kv.seq_shift_discard(seq_id, keep, n_discard)
            del cached[keep : keep + n_discard]
            n_past -= n_discard
        if cancel is not None and cancel.is_set():
            return
        logits = ctx.decode(Batch.for_sequence([step.token], n_past, seq_id))[-1]
        cached.append(step.token)
        n_past += 1


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


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _eog_ids(tokenizer) -> list[int]:
    """Every end-of-generation id of the vocabulary (for ignore_eos)."""
    ids = getattr(tokenizer, "eog_ids", None)
    if ids is not None:
        return list(ids)
    n_vocab = getattr(tokenizer, "n_vocab", 0)
    return [t for t in range(n_vocab) if tokenizer.is_eog(t)]
