"""`ggstation generate`: complete one prompt, like llama-cli with conversation mode off.

Only the generated text goes to stdout, exactly (a final newline is added only on a
terminal), so it can be piped; timings go to stderr. The prompt
is tokenized with add_special and parse_special on, as llama-cli does. The helpers at the
bottom (model loading, SIGINT flag, timings) are shared with `ggstation chat`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from .. import params
from ..errors import EngineError
from .common import init_threads, model_and_projector, resume_collector


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "generate",
        help="complete a prompt and print the generated text",
        description="Complete a prompt: the generated text goes to stdout, timings to stderr.",
    )
    params.add_common_args(p)
    params.add_mem_check_arg(p)
    params.add_int8_arg(p)
    params.add_gpu_args(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    p = params.common_params(args)
    prompt = params.read_prompt(p)
    if prompt is None:
        raise EngineError("no prompt given: use -p/--prompt TEXT or -f/--file FNAME")
    model, ctx, projector = load_for_generation(p)
    media: tuple = ()
    if p.images:
        from ..vision import MEDIA_MARKER

        if MEDIA_MARKER not in prompt:  # llama-mtmd-cli: the images go before the text
            prompt = MEDIA_MARKER * len(p.images) + prompt
        mp = media_prompt(projector, model.tokenizer, prompt, p.images)
        tokens, media = mp.tokens, mp.media
    else:
        tokens = model.tokenizer.encode(prompt, add_special=True, parse_special=True)
    tokens = ensure_not_empty(tokens, model.tokenizer)
    flag = InterruptFlag().install()

    from ..generate import generate

    out = sys.stdout
    last = None
    for last in generate(
        ctx,
        model.tokenizer,
        tokens,
        p.sampling,
        n_predict=p.n_predict,
        stop=list(p.antiprompt),
        n_keep=p.n_keep,
        context_shift=p.context_shift,
        cancel=flag.event,
        media=media,
    ):
        if last.text_delta:
            out.write(last.text_delta)
            out.flush()
    if out.isatty():  # keep piped output byte-exact; end the line for a terminal
        out.write("\n")
        out.flush()
    if last is not None:
        print(timings_text(last), file=sys.stderr)
    return 130 if flag.event.is_set() else 0


# -- shared with engine/commands/chat.py ---------------------------------------------------


def read_images(paths) -> list[bytes]:
    """The --image files' bytes (EngineError naming a file that cannot be read)."""
    out = []
    for path in paths:
        try:
            with open(path, "rb") as fh:
                out.append(fh.read())
        except OSError as e:
            raise EngineError(f"cannot read image '{path}': {e.strerror or e}") from None
    return out


def media_prompt(projector, tokenizer, text: str, image_paths, add_special: bool = True):
    """A prompt text with <__media__> markers and its --image files, tokenized by the
    projector (llama-mtmd-cli's mtmd_tokenize); EngineError without a projector."""
    if projector is None:
        raise EngineError("--image needs a multimodal projector: pass -mm/--mmproj FILE")
    return projector.tokenize(
        tokenizer, text, read_images(image_paths), add_special=add_special, parse_special=True
    )


def load_for_generation(p: params.CommonParams):
    """Seed start-up steps 2-3: initialise the backend, load the model (and its projector),
    create the context. Returns (model, ctx, projector or None)."""
    from ..init import init_from_params

    if p.images and not p.mmproj and not (p.hf_repo and p.mmproj_auto):
        raise EngineError("--image needs a multimodal projector: pass -mm/--mmproj FILE")
    try:
        n_threads = init_threads(p.n_threads)
        path, p = model_and_projector(p, p.n_ctx)  # -hf brings the repo's mmproj
        if p.images and not p.mmproj:  # -hf's repository had none
            raise EngineError("--image needs a multimodal projector: pass -mm/--mmproj FILE")
        loaded = init_from_params(path, params.init_params(p, n_threads))
        model, ctx = loaded.model, loaded.ctx
    finally:
        resume_collector()  # paused by engine.cli.main for the process's own generate/chat
    if p.verbose:
        cfg = model.cfg
        print(
            f"loaded {path} ({cfg.arch}, {cfg.n_layer} layers, n_vocab {cfg.n_vocab}); "
            f"n_ctx {ctx.n_ctx} (train {cfg.n_ctx_train}), {n_threads} threads",
            file=sys.stderr,
        )
    return model, ctx, loaded.projector


def ensure_not_empty(tokens: list[int], tokenizer) -> list[int]:
    """llama-cli: an empty prompt becomes [BOS] when the model adds BOS, else an error."""
    if tokens:
        return tokens
    if tokenizer.add_bos and tokenizer.bos_id is not None:
        return [tokenizer.bos_id]
    raise EngineError("the prompt is empty")


def timings_text(step) -> str:
    """Prompt and generation speed from a stream's last GenerationStep."""
    n_eval = step.n_prompt - step.n_cached
    lines = [
        f"prompt eval: {n_eval} tokens ({step.n_cached} cached) in {step.t_prompt_ms:.1f} ms"
        f" = {_per_s(n_eval, step.t_prompt_ms)} tokens/s",
        # the first token comes with the prompt's logits: n_generated - 1 decode steps follow
        f"generation:  {step.n_generated} tokens in {step.t_gen_ms:.1f} ms"
        f" = {_per_s(step.n_generated - 1, step.t_gen_ms)} tokens/s",
    ]
    return "\n".join(lines)


def _per_s(n: int, ms: float) -> str:
    return f"{n / ms * 1e3:.2f}" if n > 0 and ms > 0 else "n/a"


class InterruptFlag:
    """SIGINT handler: the first Ctrl+C sets `event` (stop the current generation), a second
    one before `event` is cleared raises KeyboardInterrupt (exit)."""

    def __init__(self):
        self.event = threading.Event()

    def install(self) -> InterruptFlag:
        signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.event.is_set():
            raise KeyboardInterrupt
        self.event.set()
