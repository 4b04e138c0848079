"""What happens when a conversation outgrows the context: the policy, in words and in code.

The chat pane shows CONTEXT_POLICY up front; GenerationWorker applies fit_to_context before
every reply, so the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import AppError

CONTEXT_POLICY = (
    "When the conversation no longer fits, the oldest turns (after the system prompt) are left "
    "out of the prompt, and the reply is cut short if even the last message leaves no room."
)


def fit_to_context(
    count_tokens: Callable[[list[dict]], int], messages: list[dict], n_ctx: int, max_tokens: int
) -> tuple[list[dict], int, int]:
    """Drop the oldest turns until prompt + max_tokens fits. Returns (messages, n_dropped, max_tokens)."""
    head = messages[:1] if messages and messages[0]["role"] == "system" else []
    rest = messages[len(head) :]
    n_prompt = count_tokens(head + rest)
    dropped = 0
    while n_prompt + max_tokens > n_ctx and len(rest) > 1:
        rest = rest[1:]
        dropped += 1
        n_prompt = count_tokens(head + rest)
    if n_prompt >= n_ctx:
        raise AppError(
            f"The message is too long for the context: the prompt needs {n_prompt} tokens "
            f"and the context holds {n_ctx}. Load the model with a larger context size."
        )
    return head + rest, dropped, min(max_tokens, n_ctx - n_prompt)
