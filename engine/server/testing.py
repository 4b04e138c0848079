"""Fakes for fast tests of the scheduler, the server and the GUI (no model, no numba).

Each fake implements the seam (engine/seams.py) its real counterpart implements, which mypy
checks at the bottom of this file.

FakeTokenizer: one token per byte (id = byte + 3), BOS 1, EOS 2.
FakeContext: a deterministic "model" whose greedy continuation is the alphabet: after a
lowercase letter comes the next one (z -> a), after "." comes EOS, after anything else
"a". Its KV bookkeeping checks that every sequence is fed contiguous positions, so a
scheduler bug in prompt caching shows up as an exception. `delay_s` makes every decode
cost the same time whatever the batch size, as on real hardware for small batches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..batch import Batch
from ..errors import EngineError, TemplateError
from ..scheduler import Scheduler
from ..sequence import GenerationStep

if TYPE_CHECKING:
    from ..seams import DecodeContext, PromptTemplate, ServedModel

N_SPECIAL = 3  # 0 <unk>, 1 <s>, 2 </s>
BOS, EOS = 1, 2
N_VOCAB = 256 + N_SPECIAL
N_EMBD = 8


class FakeTokenizer:
    """Implements engine.seams.ServerTokenizer."""

    n_vocab = N_VOCAB
    bos_id: int | None = BOS
    eos_id: int | None = EOS
    eog_ids = frozenset({EOS})
    add_bos = True
    add_eos = False
    vocab_type = 2  # llama.cpp's LLAMA_VOCAB_TYPE_BPE
    max_token_bytes = 4  # "<unk>" is 5 bytes, but never a piece of text: one byte a token

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        ids = [b + N_SPECIAL for b in text.encode("utf-8")]
        return [BOS, *ids] if add_special else ids

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        if token_id < N_SPECIAL:
            return ["<unk>", "<s>", "</s>"][token_id].encode() if special else b""
        return bytes([token_id - N_SPECIAL])

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self.token_to_piece(t) for t in ids if t >= N_SPECIAL).decode(
            "utf-8", "replace"
        )

    def is_eog(self, token_id: int) -> bool:
        return token_id == EOS


def next_token(token: int) -> int:
    b = token - N_SPECIAL
    if ord("a") <= b <= ord("z"):
        return N_SPECIAL + (ord("a") + (b - ord("a") + 1) % 26)
    if b == ord("."):
        return EOS
    return N_SPECIAL + ord("a")


class FakeKV:
    """Implements engine.seams.SequenceCache over plain token lists."""

    def __init__(self, n_seq: int, n_ctx_seq: int):
        self.n_ctx_seq = n_ctx_seq
        self.cells: list[list[int]] = [[] for _ in range(n_seq)]  # tokens at positions 0..n-1

    def seq_len(self, seq: int) -> int:
        return len(self.cells[seq])

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> None:
        if p1 != -1 and p1 < len(self.cells[seq]):
            raise EngineError("FakeKV only removes suffixes")
        del self.cells[seq][max(p0, 0) :]

    def seq_clear(self, seq: int) -> None:
        self.cells[seq] = []

    def seq_shift_discard(self, seq: int, p0: int, n: int) -> None:
        del self.cells[seq][p0 : p0 + n]


class FakeContext:
    """Implements engine.seams.DecodeContext: decode() checks positions and returns
    one-hot-ish logits; like the real context it is driven by one thread only."""

    def __init__(
        self, n_ctx: int = 256, n_batch: int = 64, n_seq_max: int = 4, delay_s: float = 0.0
    ):
        self.n_seq_max = n_seq_max
        self.n_batch = n_batch
        self.n_ctx = n_ctx
        self.n_ctx_seq = n_ctx // n_seq_max
        self.n_vocab = N_VOCAB
        self.kv = FakeKV(n_seq_max, self.n_ctx_seq)
        self.delay_s = delay_s
        self.n_decode = 0
        self.batch_sizes: list[int] = []
        self.fail_on_token: int | None = None  # decode raises when a batch contains it
        self._owner: int | None = None

    def decode(self, batch: Batch, embeddings: bool = False) -> np.ndarray:
        self._check_thread()
        if self.fail_on_token is not None and self.fail_on_token in batch.tokens:
            raise EngineError("fake decode failure")
        self.n_decode += 1
        self.batch_sizes.append(len(batch))
        for tok, pos, seq in zip(batch.tokens, batch.pos, batch.seq_id, strict=True):
            cells = self.kv.cells[seq]
            if pos != len(cells):
                raise EngineError(f"seq {seq}: position {pos} fed but cache holds {len(cells)}")
            if pos >= self.n_ctx_seq:
                raise EngineError(f"seq {seq}: position {pos} beyond n_ctx_seq {self.n_ctx_seq}")
            cells.append(int(tok))
        if self.delay_s:
            time.sleep(self.delay_s)
        rows = np.flatnonzero(batch.logits)
        if embeddings:
            out = np.zeros((len(rows), N_EMBD), np.float32)
            for i, r in enumerate(rows):
                out[i] = np.sin(np.arange(N_EMBD) + batch.tokens[r]) + 0.01 * batch.pos[r]
            return out
        logits = np.full((len(rows), N_VOCAB), -5.0, np.float32)
        for i, r in enumerate(rows):
            logits[i, np.arange(N_VOCAB) % 7 == 0] = 0.0
            logits[i, next_token(int(batch.tokens[r]))] = 10.0
        return logits

    def _check_thread(self) -> None:
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        elif self._owner != me:
            raise AssertionError("FakeContext.decode called from two threads")


class FakeChatTemplate:
    """ChatML, enough for the server tests; implements engine.seams.PromptTemplate."""

    source = "{# fake chatml #}"
    stop_strings: tuple[str, ...] = ()

    def render(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list | None = None,
        **extra: Any,
    ) -> str:
        out = []
        for m in messages:
            role = m.get("role")
            if role not in ("system", "user", "assistant", "tool"):
                raise TemplateError(f"the chat template does not accept role {role!r}")
            content = m.get("content") or ""
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
        return "".join(out)


@dataclass(frozen=True)
class FakeConfig:
    """Implements engine.seams.ModelFacts."""

    arch: str = "fake"
    n_vocab: int = N_VOCAB
    n_ctx_train: int = 256
    n_embd: int = N_EMBD


@dataclass
class FakeModel:
    """Implements engine.seams.ServedModel; its metadata is a plain dict."""

    path: str = "/models/fake-model.gguf"
    cfg: FakeConfig = field(default_factory=FakeConfig)
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    gguf: dict[str, Any] = field(default_factory=dict)
    n_params: int = 1234


def make_fake_scheduler(
    n_slots: int = 4, n_ctx: int = 256, n_batch: int = 64, delay_s: float = 0.0, start: bool = True
) -> Scheduler:
    """A Scheduler over FakeContext with the real SequenceGenerator; started on a thread."""
    model = FakeModel()
    ctx = FakeContext(n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_slots, delay_s=delay_s)
    sched = Scheduler(ctx, model.tokenizer, model=model)
    return sched.start() if start else sched


if TYPE_CHECKING:  # mypy: each fake implements the seam its real counterpart implements
    _ctx: DecodeContext = FakeContext()
    _model: ServedModel = FakeModel()
    _template: PromptTemplate = FakeChatTemplate()


class ScriptedHandle:
    """A RequestHandle whose reply is the given text, one step per piece (`fail`: the last
    piece raises instead), for tests of how routes read and shape replies."""

    def __init__(self, request: Any, pieces: list[str], finish: str = "stop", fail: bool = False):
        self.request, self.pieces, self.finish, self.fail = request, pieces, finish, fail
        self.slot_id, self.done = 0, False

    async def astream(self):
        for i, text in enumerate(self.pieces):
            if self.fail and i == len(self.pieces) - 1:
                raise RuntimeError("decode failed")
            last = i == len(self.pieces) - 1
            yield GenerationStep(
                token=100 + i,
                text_delta=text,
                logprob=0.0,
                top_logprobs=(),
                finish_reason=self.finish if last else None,
                n_prompt=len(self.request.prompt),
                n_generated=i + 1,
                n_cached=0,
                t_prompt_ms=1.0,
                t_gen_ms=1.0,
            )
        self.done = True

    async def abatches(self):
        async for step in self.astream():  # one token per wake-up, the slowest case
            yield [step]

    def cancel(self) -> None:
        self.done = True
