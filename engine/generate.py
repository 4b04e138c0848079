"""generate(): one completion from one prompt, for the CLI, tests and scripts.

There is one decode driver, the scheduler: this runs a one-slot Scheduler stepped inline on
the caller's thread, so `ggstation generate`, `ggstation chat` and `ggstation serve` share
prompt-prefix reuse, context shift, stop rules and timings.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from .sampling import SamplingParams
from .scheduler import Scheduler
from .seams import DecodeContext, GenerationTokenizer, MediaSpanLike
from .sequence import GenerationStep
from .tasks import GenerationRequest


def generate(
    ctx: DecodeContext,
    tokenizer: GenerationTokenizer,
    prompt_tokens: Sequence[int],
    params: SamplingParams | None = None,
    *,
    n_predict: int = -1,
    stop: Sequence[str] = (),
    n_keep: int = 0,
    context_shift: bool = False,
    cancel: threading.Event | None = None,
    media: Sequence[MediaSpanLike] = (),
) -> Iterator[GenerationStep]:
    """Generate from a fresh sequence 0 of `ctx`: the prompt in chunks of n_batch, then
    token by token.

    Args:
        ctx: the context (its sequence 0 is cleared first).
        tokenizer: the model's tokenizer.
        prompt_tokens: the tokenized prompt.
        params: sampling parameters (default: SamplingParams()).
        n_predict: most tokens to generate; -1 means until a stop condition.
        stop: stop strings.
        n_keep: with context_shift, prompt tokens a shift keeps (BOS added; -1: all).
        context_shift: when the context is full, discard half of what follows n_keep and
            continue (llama.cpp --context-shift) instead of finishing with 'length'.
        cancel: when set, generation stops before the next model call (no final step).
        media: the prompt's image spans (engine.vision.MediaPrompt.media).

    Yields:
        One GenerationStep per sampled token; the last one has finish_reason set.

    Raises:
        ContextOverflowError: the prompt does not fit in the sequence's context.
        InvalidRequestError: empty prompt or token ids out of range.
    """
    if n_predict == 0:
        return
    scheduler = Scheduler(ctx, tokenizer, n_slots=1, context_shift=context_shift, n_keep=n_keep)
    request = GenerationRequest(
        list(prompt_tokens), params or SamplingParams(), n_predict, stop, media=tuple(media)
    )
    yield from scheduler.stream(request, cancel)
