"""`ggstation chat`: an interactive conversation in the terminal, like llama-cli.

Start-up follows the seed: parse flags, initialise the backend, load the model, install the
SIGINT handler, then loop: read a line (prompt_toolkit: line editing and history), render the
conversation with the chat template, generate and stream the reply.

Ctrl+C while a reply streams stops it and returns to the prompt; Ctrl+C or Ctrl+D at an empty
prompt exits. Commands: /exit, /clear, /regen, /save FILE, /load FILE, /image FILE (with
-mm/--mmproj; --image FILE attaches images to the first message). When stdin is not a
terminal, the whole input is one user message and the reply is printed once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import params
from ..errors import EngineError
from ..sampling import SamplingParams, resolve_seed
from ..scheduler import GenerationRequest, Scheduler
from ..seams import ChatTokenizer, DecodeContext, PromptTemplate
from ..sequence import GenerationStep
from .generate import InterruptFlag, load_for_generation, read_images, timings_text

if TYPE_CHECKING:
    from ..vision import Projector

HELP = (
    "commands: /exit, /clear (new conversation), /regen, /save FILE, /load FILE, /image FILE\n"
    "Ctrl+C stops a reply; Ctrl+C or Ctrl+D at an empty prompt exits"
)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "chat",
        help="interactive chat with a model in the terminal",
        description="Chat with a model using its chat template (like llama-cli).",
    )
    params.add_common_args(p, prompt=False)
    params.add_chat_args(p)
    params.add_mem_check_arg(p)
    params.add_int8_arg(p)
    params.add_gpu_args(p)
    p.set_defaults(run=run)
    return p


class ChatSession:
    """A conversation held in the one slot of a scheduler stepped on this thread.

    Each turn re-renders the whole conversation with the chat template; the slot reuses the
    tokens already in its cache up to the first difference, so a turn only evaluates what is
    new. The first reply is sampled with params.seed itself (as `ggstation serve` would for
    the same prompt); later replies and /regen draw their seeds from a generator seeded with
    it, so a session is reproducible and /regen still gives a new reply.
    """

    def __init__(
        self,
        ctx: DecodeContext,
        tokenizer: ChatTokenizer,
        template: PromptTemplate,
        sampling: SamplingParams,
        *,
        system_prompt: str | None = None,
        n_predict: int = -1,
        keep: int = 0,
        context_shift: bool = False,
        projector: Projector | None = None,
    ):
        self.template = template
        self.projector = projector
        self.images: list[bytes] = []  # the conversation's images, in the order of its markers
        self.pending: list[bytes] = []  # attached (--image, /image) for the next message
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.system_prompt = system_prompt
        self.n_predict = n_predict
        self.scheduler = Scheduler(
            ctx, self.tokenizer, n_slots=1, context_shift=context_shift, n_keep=keep
        )
        seed = resolve_seed(sampling.seed)
        self._seeds = np.random.default_rng(seed)
        self._next_seed = seed
        self.messages: list[dict] = []
        self.clear()

    def clear(self) -> None:
        """Start a new conversation (the system prompt stays)."""
        self.messages = (
            [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        )
        self.images = []

    def attach(self, image: bytes) -> None:
        """An image for the next user message (EngineError without a projector)."""
        if self.projector is None:
            raise EngineError("images need a multimodal projector: pass -mm/--mmproj FILE")
        self.pending.append(image)

    def respond(
        self, text: str, on_delta: Callable[[str], None], cancel: threading.Event | None = None
    ) -> GenerationStep | None:
        """Add a user message and generate the assistant's reply (kept even if cancelled).

        Raises:
            EngineError: e.g. the conversation no longer fits in the context; the user
                message is then dropped again.
        """
        from ..vision import MEDIA_MARKER

        images, self.pending = self.pending, []
        # llama-mtmd-cli puts a message's images before its text
        self.messages.append({"role": "user", "content": MEDIA_MARKER * len(images) + text})
        self.images.extend(images)
        try:
            return self._reply(on_delta, cancel)
        except EngineError:
            self.messages.pop()
            if images:
                del self.images[-len(images) :]
            raise

    def regenerate(
        self, on_delta: Callable[[str], None], cancel: threading.Event | None = None
    ) -> GenerationStep | None:
        """Replace the last assistant reply with a new one."""
        if self.messages and self.messages[-1]["role"] == "assistant":
            self.messages.pop()
        if not self.messages or self.messages[-1]["role"] != "user":
            raise EngineError("nothing to regenerate: send a message first")
        return self._reply(on_delta, cancel)

    def save(self, path: str) -> None:
        try:
            Path(path).write_text(
                json.dumps({"messages": self.messages}, indent=2, ensure_ascii=False) + "\n",
                encoding="utf-8",
            )
        except OSError as e:
            raise EngineError(f"cannot save conversation to '{path}': {e}") from None

    def load(self, path: str) -> None:
        from ..vision import MEDIA_MARKER

        messages = load_messages(path)
        if any(MEDIA_MARKER in m["content"] for m in messages):
            raise EngineError(f"'{path}' refers to images, which /save does not keep")
        self.messages, self.images = messages, []

    def prompt_tokens(self) -> tuple[list[int], tuple]:
        """The rendered conversation, tokenized, ready for the assistant's turn, and its
        image spans."""
        from ..tokenizer.chat_template import chat_prompt_tokens

        if not self.images:
            return chat_prompt_tokens(self.template, self.tokenizer, self.messages), ()
        assert self.projector is not None
        text = self.template.render(self.messages, add_generation_prompt=True)
        mp = self.projector.tokenize(self.tokenizer, text, self.images, add_special=True)
        return mp.tokens, mp.media

    def _reply(
        self, on_delta: Callable[[str], None], cancel: threading.Event | None
    ) -> GenerationStep | None:
        seed, self._next_seed = self._next_seed, int(self._seeds.integers(0, 2**32 - 1))
        tokens, media = self.prompt_tokens()
        request = GenerationRequest(
            tokens,
            dataclasses.replace(self.sampling, seed=seed),
            self.n_predict,
            self.template.stop_strings,
            media=media,
        )
        parts: list[str] = []
        last = None
        for last in self.scheduler.stream(request, cancel):
            if last.text_delta:
                parts.append(last.text_delta)
                on_delta(last.text_delta)
        self.messages.append({"role": "assistant", "content": "".join(parts)})
        return last


def load_messages(path: str) -> list[dict]:
    """Messages saved by /save: {"messages": [{"role", "content"}, ...]} or a bare list."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise EngineError(f"cannot read '{path}': {e}") from None
    except json.JSONDecodeError as e:
        raise EngineError(f"'{path}' is not valid JSON: {e}") from None
    messages = data.get("messages") if isinstance(data, dict) else data
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise EngineError(
            f"'{path}' does not hold a conversation (a list of role/content messages)"
        )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def run(args: argparse.Namespace) -> int:
    from ..tokenizer.chat_template import ChatTemplate  # jinja2: not loaded for the other commands

    p = params.common_params(args)
    template_override = params.chat_template_override(p)
    model, ctx, projector = load_for_generation(p)
    template = ChatTemplate.from_gguf(model.gguf, override=template_override)
    chat = ChatSession(
        ctx,
        model.tokenizer,
        template,
        p.sampling,
        system_prompt=p.system_prompt,
        n_predict=p.n_predict,
        keep=p.n_keep,
        context_shift=p.context_shift,
        projector=projector,
    )
    for image in read_images(p.images):  # --image: attached to the first message
        chat.attach(image)
    flag = InterruptFlag().install()
    if not sys.stdin.isatty():
        return _run_once(chat, flag, p.verbose)
    return _run_interactive(chat, flag, p.verbose)


def _run_once(chat: ChatSession, flag: InterruptFlag, verbose: bool) -> int:
    text = sys.stdin.read().strip()
    if not text:
        raise EngineError("no input: stdin is empty")
    last = chat.respond(text, _write, flag.event)
    _end_reply(last, verbose)
    return 130 if flag.event.is_set() else 0


def _run_interactive(chat: ChatSession, flag: InterruptFlag, verbose: bool) -> int:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import InMemoryHistory

    session: PromptSession[str] = PromptSession(
        history=InMemoryHistory(), key_bindings=_key_bindings()
    )
    print(HELP, file=sys.stderr)
    while True:
        try:
            line = session.prompt("> ")
        except (EOFError, KeyboardInterrupt):
            return 0
        line = line.strip()
        if not line:
            continue
        flag.event.clear()
        try:
            if line.startswith("/"):
                if _command(chat, line, flag, verbose):
                    return 0
            else:
                _end_reply(chat.respond(line, _write, flag.event), verbose)
        except EngineError as e:
            print(f"error: {e}", file=sys.stderr)
        flag.event.clear()


def _command(chat: ChatSession, line: str, flag: InterruptFlag, verbose: bool) -> bool:
    """Run one /command; returns True to exit."""
    name, _, arg = line.partition(" ")
    arg = arg.strip()
    if name in ("/exit", "/quit"):
        return True
    if name == "/clear":
        chat.clear()
        print("(new conversation)", file=sys.stderr)
    elif name == "/regen":
        _end_reply(chat.regenerate(_write, flag.event), verbose)
    elif name in ("/save", "/load") and not arg:
        print(f"usage: {name} FILE", file=sys.stderr)
    elif name == "/save":
        chat.save(arg)
        print(f"(saved {len(chat.messages)} messages to {arg})", file=sys.stderr)
    elif name == "/load":
        chat.load(arg)
        print(f"(loaded {len(chat.messages)} messages from {arg})", file=sys.stderr)
    elif name == "/image" and not arg:
        print("usage: /image FILE", file=sys.stderr)
    elif name == "/image":
        chat.attach(read_images([arg])[0])
        print(f"({arg} attached to your next message)", file=sys.stderr)
    else:
        print(f"unknown command {name}\n{HELP}", file=sys.stderr)
    return False


def _key_bindings():
    """Ctrl+C clears a non-empty line and exits on an empty one."""
    from prompt_toolkit.key_binding import KeyBindings

    kb = KeyBindings()

    @kb.add("c-c")
    @kb.add("<sigint>")
    def _(event):
        buf = event.app.current_buffer
        if buf.text:
            buf.reset()
        else:
            event.app.exit(exception=KeyboardInterrupt, style="class:aborting")

    return kb


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _end_reply(last: GenerationStep | None, verbose: bool) -> None:
    _write("\n")
    if verbose and last is not None:
        print(timings_text(last), file=sys.stderr)
