"""Fakes for fast tests of the scheduler, the server and the GUI (no model, no numba).

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
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from ..errors import EngineError

N_SPECIAL = 3  # 0 <unk>, 1 <s>, 2 </s>
BOS, EOS = 1, 2
N_VOCAB = 256 + N_SPECIAL
N_EMBD = 8


class FakeTokenizer:
    n_vocab = N_VOCAB
    bos_id, eos_id = BOS, EOS
    eog_ids = (EOS,)
    add_bos = True

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        ids = [b + N_SPECIAL for b in text.encode("utf-8")]
        return [BOS, *ids] if add_special else ids

    def token_to_piece(self, token: int) -> bytes:
        if token < N_SPECIAL:
            return ["<unk>", "<s>", "</s>"][token].encode()
        return bytes([token - N_SPECIAL])

    def decode(self, ids) -> str:
        return b"".join(self.token_to_piece(t) for t in ids if t >= N_SPECIAL).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def token_text(self, token: int) -> str:
        return self.token_to_piece(token).decode("utf-8", "replace")


class FakeDetokenizer:
    """Byte-level streaming detokenizer: holds back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self._buf = b""

    def add(self, token: int) -> str:
        if token < N_SPECIAL:
            return ""
        self._buf += self._tok.token_to_piece(token)
        for cut in range(len(self._buf), max(len(self._buf) - 4, -1), -1):
            try:
                text = self._buf[:cut].decode("utf-8")
            except UnicodeDecodeError:
                continue
            self._buf = self._buf[cut:]
            return text
        return ""

    def flush(self) -> str:
        text, self._buf = self._buf.decode("utf-8", "replace"), b""
        return text


def next_token(token: int) -> int:
    b = token - N_SPECIAL
    if ord("a") <= b <= ord("z"):
        return N_SPECIAL + (ord("a") + (b - ord("a") + 1) % 26)
    if b == ord("."):
        return EOS
    return N_SPECIAL + ord("a")


class FakeKV:
    def __init__(self, n_seq: int, n_ctx_seq: int):
        self.n_ctx_seq = n_ctx_seq
        self.cells: list[list[int]] = [[] for _ in range(n_seq)]  # tokens at positions 0..n-1

    def seq_len(self, seq: int) -> int:
        return len(self.cells[seq])

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> None:
        if p1 not in (-1, None) and p1 < len(self.cells[seq]):
            raise EngineError("FakeKV only removes suffixes")
        del self.cells[seq][max(p0, 0):]

    def seq_clear(self, seq: int) -> None:
        self.cells[seq] = []

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        self.cells[dst] = list(self.cells[src])

    def seq_shift_discard(self, seq: int, p0: int, n: int) -> None:
        del self.cells[seq][p0 : p0 + n]


@dataclass
class FakeContextParams:
    n_ctx: int = 256
    n_batch: int = 64
    n_ubatch: int = 64
    n_seq_max: int = 4
    kv_unified: bool = True
    type_k: str = "f16"
    type_v: str = "f16"


class FakeContext:
    """Context stand-in: decode() checks positions and returns one-hot-ish logits."""

    def __init__(self, params: FakeContextParams | None = None, delay_s: float = 0.0, model=None):
        self.params = params or FakeContextParams()
        self.n_seq_max = self.params.n_seq_max
        self.n_batch = self.params.n_batch
        self.n_ctx = self.params.n_ctx
        self.n_ctx_seq = self.params.n_ctx // self.params.n_seq_max
        self.kv = FakeKV(self.n_seq_max, self.n_ctx_seq)
        self.delay_s = delay_s
        self.model = model
        self.n_decode = 0
        self.batch_sizes: list[int] = []
        self.fail_on_token: int | None = None  # decode raises when a batch contains it
        self._owner: int | None = None

    def decode(self, batch, embeddings: bool = False) -> np.ndarray:
        self._check_thread()
        if self.fail_on_token is not None and self.fail_on_token in batch.tokens:
            raise EngineError("fake decode failure")
        self.n_decode += 1
        self.batch_sizes.append(len(batch))
        for tok, pos, seq in zip(batch.tokens, batch.pos, batch.seq_id):
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
        out = np.full((len(rows), N_VOCAB), -5.0, np.float32)
        for i, r in enumerate(rows):
            out[i, np.arange(N_VOCAB) % 7 == 0] = 0.0
            out[i, next_token(int(batch.tokens[r]))] = 10.0
        return out

    def _check_thread(self) -> None:
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        elif self._owner != me:
            raise AssertionError("FakeContext.decode called from two threads")

    def memory_report(self):
        d = {"weights_bytes": 1000, "kv_bytes": 2000, "compute_bytes": 300, "total_bytes": 3300}
        return SimpleNamespace(as_dict=lambda: dict(d), **d)


class FakeChatTemplate:
    """ChatML, enough for the server tests."""

    source = "{# fake chatml #}"

    def render(self, messages, add_generation_prompt: bool = True, tools=None, **kwargs) -> str:
        out = []
        for m in messages:
            role = m.get("role")
            if role not in ("system", "user", "assistant", "tool"):
                from ..errors import TemplateError

                raise TemplateError(f"the chat template does not accept role {role!r}")
            content = m.get("content") or ""
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
        return "".join(out)


def fake_model(path: str = "/models/fake-model.gguf", n_ctx_train: int = 256):
    cfg = SimpleNamespace(arch="fake", n_ctx_train=n_ctx_train, n_vocab=N_VOCAB, n_embd=N_EMBD,
                          n_layer=2, n_head=2, name="fake")
    return SimpleNamespace(path=path, cfg=cfg, tokenizer=FakeTokenizer(), gguf=None, n_params=1234)


def fake_generator_factory(tokenizer):
    """The real SequenceGenerator with the byte-level fake detokenizer."""

    def make(request, n_predict: int, n_cached: int):
        import dataclasses

        from ..generate import SequenceGenerator
        from ..sampling import SamplingParams

        params = request.params if request.params is not None else SamplingParams(temperature=0.0)
        if request.n_probs and params.n_probs != request.n_probs:
            params = dataclasses.replace(params, n_probs=request.n_probs)
        return SequenceGenerator(tokenizer, params, n_predict, list(request.stop),
                                 prompt_tokens=request.prompt, n_cached=n_cached,
                                 detokenizer=FakeDetokenizer(tokenizer))

    return make


def make_fake_scheduler(n_slots: int = 4, n_ctx: int = 256, n_batch: int = 64,
                        delay_s: float = 0.0, start: bool = True):
    """A Scheduler over FakeContext with the real generator; started on a thread."""
    from ..scheduler import Scheduler

    model = fake_model()
    ctx = FakeContext(FakeContextParams(n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_slots),
                      delay_s=delay_s, model=model)
    sched = Scheduler(ctx, model.tokenizer, model=model,
                      generator_factory=fake_generator_factory(model.tokenizer))
    return sched.start() if start else sched
