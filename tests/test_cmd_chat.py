"""`ggstation chat`: the ChatSession on fakes, command-line errors, and a pty session."""

import os
import signal
import sys
import threading
from pathlib import Path

import numpy as np
import pexpect
import pytest

from engine.cli import main
from engine.commands.chat import ChatSession, load_messages
from engine.errors import ContextOverflowError, EngineError
from engine.sampling import SamplingParams

EOG = 0
GREEDY = SamplingParams(temperature=0.0)


class CharTokenizer:
    """One token per ASCII character; token 0 ends generation."""

    n_vocab = 128
    bos_id = None
    add_bos = False
    eog_ids = frozenset({EOG})

    def encode(self, text, add_special=True, parse_special=False):
        return [ord(c) % 128 for c in text]

    def token_to_piece(self, token, special=False):
        return b"" if token == EOG else bytes([token])

    def is_eog(self, token):
        return token == EOG


class Template:
    source = ""
    stop_strings = ()

    def render(self, messages, add_generation_prompt=True, **extra):
        text = "".join(f"{m['role']}:{m['content']}|" for m in messages)
        return text + ("assistant>" if add_generation_prompt else "")


class KV:
    def __init__(self):
        self.tokens = []

    def seq_len(self, seq):
        return len(self.tokens)

    def seq_clear(self, seq):
        self.tokens = []

    def seq_rm(self, seq, p0, p1=-1):
        del self.tokens[p0:]

    def seq_shift_discard(self, seq, p0, n):
        del self.tokens[p0 : p0 + n]


class ChatContext:
    """Replies 'hi' after 'assistant>' and then ends; anything else continues with 'x'."""

    NEXT = {ord(">"): ord("h"), ord("h"): ord("i"), ord("i"): EOG}

    n_seq_max = 1
    n_vocab = 128

    def __init__(self, n_ctx=256):
        self.n_ctx_seq = n_ctx
        self.n_batch = 64
        self.kv = KV()
        self.n_decoded = 0

    def decode(self, batch, embeddings=False):
        self.kv.tokens.extend(int(t) for t in batch.tokens)
        self.n_decoded += len(batch)
        rows = []
        for t, want in zip(batch.tokens, batch.logits, strict=True):
            if want:
                row = np.zeros(128, np.float32)
                row[self.NEXT.get(int(t), ord("x"))] = 10.0
                rows.append(row)
        return np.array(rows, np.float32).reshape(len(rows), 128)


def session(**kw):
    return ChatSession(ChatContext(**kw.pop("ctx", {})), CharTokenizer(), Template(), GREEDY, **kw)


def test_chat_session_reply_and_history():
    chat = session(system_prompt="be nice")
    out = []
    last = chat.respond("hello", out.append)
    assert "".join(out) == "hi" and last.finish_reason == "stop"
    assert chat.messages == [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
    ]


def test_chat_session_second_turn_reuses_the_cache():
    chat = session()
    chat.respond("hello", lambda s: None)
    n_first = chat.scheduler.ctx.n_decoded
    last = chat.respond("again", lambda s: None)
    assert last.n_cached > 0
    assert chat.scheduler.ctx.n_decoded - n_first < len(chat.prompt_tokens()[0])


def test_chat_session_regenerate_replaces_the_reply():
    chat = session()
    with pytest.raises(EngineError, match="nothing to regenerate"):
        chat.regenerate(lambda s: None)
    chat.respond("hello", lambda s: None)
    chat.regenerate(lambda s: None)
    assert [m["role"] for m in chat.messages] == ["user", "assistant"]


def test_chat_session_cancel_keeps_the_partial_reply():
    chat = session()
    cancel = threading.Event()

    def on_delta(text):
        cancel.set()

    last = chat.respond("hello", on_delta, cancel)
    assert last.finish_reason is None
    assert chat.messages[-1] == {"role": "assistant", "content": "h"}


def test_chat_session_overflow_drops_the_message():
    chat = session(ctx={"n_ctx": 20})
    with pytest.raises(ContextOverflowError):
        chat.respond("a message far too long for twenty positions", lambda s: None)
    assert chat.messages == []


def test_chat_session_clear_keeps_system_prompt():
    chat = session(system_prompt="sys")
    chat.respond("hello", lambda s: None)
    chat.clear()
    assert chat.messages == [{"role": "system", "content": "sys"}]


def test_chat_session_save_and_load(tmp_path):
    chat = session()
    chat.respond("hello", lambda s: None)
    path = tmp_path / "conv.json"
    chat.save(str(path))
    other = session()
    other.load(str(path))
    assert other.messages == chat.messages
    assert load_messages(str(path)) == chat.messages


@pytest.mark.parametrize("content", ["not json", '{"messages": [{"role": 1}]}', "[1, 2]"])
def test_load_messages_rejects_bad_files(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(EngineError):
        load_messages(str(path))
    with pytest.raises(EngineError, match="cannot read"):
        load_messages(str(tmp_path / "missing.json"))


# -- command line: bad input is one clear line and exit status 1 ---------------------------


@pytest.mark.parametrize("command", ["chat", "generate"])
def test_bad_model_paths_exit_1(tmp_path, capsys, command):
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("hello", encoding="utf-8")
    extra = ["-p", "hi"] if command == "generate" else []
    for model in (tmp_path / "missing.gguf", tmp_path, not_gguf):
        assert main([command, "-m", str(model), *extra]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error:") and "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["chat", "--no-such-flag"],
        ["generate", "-c", "-1"],
        ["chat", "--temp", "x"],
        ["generate", "-ctk", "q4_0"],
    ],
)
def test_usage_errors_exit_1(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 1
    assert "usage:" in capsys.readouterr().err


def test_generate_without_prompt_is_an_error(capsys):
    assert main(["generate", "-m", "x.gguf"]) == 1
    assert "-p/--prompt" in capsys.readouterr().err


# -- a session in a pseudo-terminal ---------------------------------------------------------

# prompt_toolkit draws "> " as ">" plus a cursor move (or a space on simple terminals)
PROMPT = r">(?:\x08|\x1b\[\d*C| )"


def test_chat_pty_interrupt_returns_to_prompt(tmp_path):
    from ggufgen import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny.gguf")
    env = dict(os.environ, PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm")
    child = pexpect.spawn(
        sys.executable,
        # the bias makes the reply "aaaa..." (token 100 is the byte 'a' in the tiny BPE vocab);
        # with --ignore-eos and --context-shift it never ends by itself
        [
            "-m",
            "engine",
            "chat",
            "-m",
            str(model),
            "-c",
            "256",
            "--ignore-eos",
            "--context-shift",
            "--verbose",
            "-l",
            "100+100",
        ],
        cwd=str(Path(__file__).resolve().parents[1]),
        env=env,
        encoding="utf-8",
        timeout=120,
        dimensions=(40, 200),
    )
    try:
        child.expect(PROMPT)
        for message in ("tell me a long story", "and another one"):
            child.sendline(message)
            child.expect_exact(message)
            child.expect_exact("aaaaaaaa")  # the reply streams ...
            child.kill(signal.SIGINT)  # ... then Ctrl+C stops it
            child.expect(r"generation: +\d+ tokens")  # --verbose timings: the reply ended
            child.expect(PROMPT)  # and the prompt is back
        child.sendeof()  # Ctrl+D at an empty prompt exits
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_chat_pty_commands(tmp_path):
    from ggufgen import write_tiny_model

    model = write_tiny_model(tmp_path / "tiny.gguf")
    saved = tmp_path / "conv.json"
    env = dict(os.environ, PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm")
    child = pexpect.spawn(
        sys.executable,
        [
            "-m",
            "engine",
            "chat",
            "-m",
            str(model),
            "-c",
            "256",
            "-n",
            "5",
            "-sys",
            "sys!",
            "-l",
            "100+100",
        ],
        cwd=str(Path(__file__).resolve().parents[1]),
        env=env,
        encoding="utf-8",
        timeout=60,
        dimensions=(40, 200),
    )
    steps = [
        ("hello", "aaaaa"),
        ("/regen", "aaaaa"),
        (f"/save {saved}", r"\(saved 3 messages"),
        ("/clear", r"\(new conversation\)"),
        (f"/load {saved}", r"\(loaded 3 messages"),
        ("/load /no/such/file.json", r"error: cannot read"),
        ("/bogus", r"unknown command /bogus"),
    ]
    try:
        for line, reply in steps:
            child.expect(PROMPT)
            child.sendline(line)
            child.expect(reply)
        child.expect(PROMPT)
        child.send("abc")
        child.sendintr()  # Ctrl+C on a non-empty line clears it ...
        child.sendline("/bogus")
        child.expect("unknown command /bogus")  # (not a message "abc/bogus")
        child.expect(PROMPT)
        child.sendintr()  # ... and on the empty line exits
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert [m["role"] for m in load_messages(str(saved))] == ["system", "user", "assistant"]
