"""`ggstation serve` flags: llama-server names, defaults, LLAMA_ARG_* variables, ignored and
refused flags (parsing only; test_server_process.py runs the command)."""

from __future__ import annotations

import pytest

from engine.cli import build_parser


def parse(argv, monkeypatch=None, env=None):
    if monkeypatch is not None:
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
    return build_parser().parse_args(["serve", *argv])


def test_serve_cli_llama_server_defaults():
    a = parse(["-m", "x.gguf"])
    assert (a.host, a.port, a.parallel, a.slots, a.cache_prompt) == (
        "127.0.0.1",
        8080,
        -1,
        True,
        True,
    )
    assert a.api_key == [] and a.metrics is False and a.embedding is False and a.ignored == []


def test_serve_cli_accepts_unimplemented_flags_as_ignored():
    argv = [
        "-m",
        "x.gguf",
        "-fa",
        "on",
        "--mlock",
        "--no-mmap",
        "--lora",
        "a.gguf",
        "-ts",
        "3,1",
        "-cb",
        "--numa",
        "distribute",
        "--control-vector-layer-range",
        "1",
        "4",
        "--flash-attn",
        "--jinja",
        "--threads-http",
        "4",
        "--no-webui",
        "-ctxcp",
        "8",
    ]
    a = parse(argv)
    assert {
        "-fa",
        "--mlock",
        "--no-mmap",
        "--lora",
        "-ts",
        "-cb",
        "--numa",
        "--control-vector-layer-range",
        "--flash-attn",
        "--no-webui",
    } <= set(a.ignored)


def test_serve_cli_downloads_are_refused():
    assert parse(["--model-url", "http://x"]).refused == ["--model-url"]
    assert parse(["-dr", "ai/smollm2"]).refused == ["-dr"]
    a = parse(["-hf", "org/model:Q8_0", "-hff", "m.gguf", "-hft", "hf_x"])  # the Hub's flags work
    assert (a.hf_repo, a.hf_file, a.hf_token, a.refused) == ("org/model:Q8_0", "m.gguf", "hf_x", [])


def test_serve_cli_hf_env_vars(monkeypatch):
    a = parse(
        [],
        monkeypatch,
        {
            "LLAMA_ARG_HF_REPO": "org/model",
            "LLAMA_ARG_HF_FILE": "m.gguf",
            "LLAMA_ARG_MODEL_URL": "http://x/m.gguf",
        },
    )
    assert (a.hf_repo, a.hf_file) == ("org/model", "m.gguf") and a.refused == ["--model-url"]


def test_serve_cli_env_vars_are_defaults(monkeypatch):
    env = {
        "LLAMA_ARG_PORT": "9999",
        "LLAMA_ARG_N_PARALLEL": "2",
        "LLAMA_ARG_ENDPOINT_METRICS": "1",
        "LLAMA_API_KEY": "a,b",
        "LLAMA_ARG_ENDPOINT_SLOTS": "false",
        "LLAMA_ARG_CTX_SIZE": "2048",
        "LLAMA_ARG_MODEL": "m.gguf",
    }
    a = parse([], monkeypatch, env)
    assert (a.port, a.parallel, a.metrics, a.slots, a.ctx_size, a.model) == (
        9999,
        2,
        True,
        False,
        2048,
        "m.gguf",
    )
    assert a.api_key == ["a", "b"]
    assert parse(["--port", "1234"]).port == 1234  # the command line wins


def test_serve_cli_bad_env_var_reported_at_run(monkeypatch):
    a = parse([], monkeypatch, {"LLAMA_ARG_PORT": "not-a-port"})
    assert a.env_error and "invalid LLAMA_ARG_" in a.env_error


def test_serve_cli_run_rejects_bad_input(monkeypatch):
    from engine.errors import EngineError

    a = parse(["-mu", "http://x/m.gguf"])
    with pytest.raises(EngineError, match="not supported"):
        a.run(a)
    a = parse(["--models-dir", "/nonexistent-dir"])
    with pytest.raises(EngineError, match="does not exist"):
        a.run(a)


@pytest.mark.parametrize("kwargs", ['{"messages": []}', '{"add_generation_prompt": "x"}'])
def test_serve_cli_reserved_chat_template_kwargs_fail_at_start(kwargs):
    from engine.errors import EngineError
    from engine.server.startup import server_options

    with pytest.raises(EngineError, match="may not set"):
        server_options(parse(["-m", "m.gguf", "--chat-template-kwargs", kwargs]))
    assert server_options(
        parse(["--chat-template-kwargs", '{"enable_thinking": false}'])
    ).chat_template_kwargs == {"enable_thinking": False}


def test_serve_cli_unknown_flags_are_kept_not_fatal():
    from engine.cli import parse_args

    a = parse_args(
        build_parser(), ["serve", "-m", "x.gguf", "--some-future-flag", "7", "--port", "9000"]
    )
    assert a.unknown_flags == ["--some-future-flag", "7"] and a.port == 9000


def test_other_commands_still_refuse_unknown_flags():
    from engine.cli import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(build_parser(), ["bench", "--some-future-flag"])
    assert e.value.code not in (0, None)
