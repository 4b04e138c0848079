"""The router's catalogue: --models-dir layout, --models-preset INI (keys, [*], precedence,
preset-only keys, dedup), the router's own flags passed on to children, reload."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.errors import RouterError
from engine.router.presets import (
    Catalogue,
    OptionTable,
    explicit_options,
    parse_ini,
    scan_models_dir,
)
from engine.server import flags


def serve_parser() -> argparse.ArgumentParser:
    from engine.commands import serve

    return serve.add_parser(argparse.ArgumentParser(add_help=False).add_subparsers())


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return serve_parser()


@pytest.fixture(scope="module")
def table(parser) -> OptionTable:
    return OptionTable.from_parser(parser, flags.ENV)


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    return path


def test_parse_ini_sections_comments_and_errors():
    text = "version = 1\n; comment\n[*]\nc = 8192 ; trailing\n\n[user/Repo-GGUF:q4_k_m]\n# x\nchat-template = a;b\n"
    assert parse_ini(text) == {
        "default": {"version": "1"},
        "*": {"c": "8192"},
        "user/Repo-GGUF:Q4_K_M": {"chat-template": "a;b"},
    }
    with pytest.raises(RouterError, match="line 2"):
        parse_ini("[ok]\nthis is not a pair\n")


def test_models_dir_files_and_subdirectories(tmp_path):
    touch(tmp_path / "one.gguf")
    touch(tmp_path / "mmproj-x.gguf")  # a companion, not a model
    touch(tmp_path / "vision" / "vision-Q8_0.gguf")
    touch(tmp_path / "vision" / "mmproj-F16.gguf")
    touch(tmp_path / "big" / "big-00002-of-00002.gguf")
    touch(tmp_path / "big" / "big-00001-of-00002.gguf")
    (tmp_path / "notes.txt").write_text("x")
    found = scan_models_dir(tmp_path)
    assert {k: v.name for k, v in found.items()} == {
        "one": "one.gguf",
        "vision": "vision-Q8_0.gguf",
        "big": "big-00001-of-00002.gguf",
    }
    with pytest.raises(RouterError, match="does not exist"):
        scan_models_dir(tmp_path / "missing")


def test_preset_precedence_keys_and_preset_only_options(tmp_path, parser, table):
    touch(tmp_path / "dir" / "m.gguf")
    ini = tmp_path / "p.ini"
    ini.write_text(
        "[*]\nc = 8192\ntemp = 0.5\n\n[m]\nctx-size = 2048\nLLAMA_ARG_N_PARALLEL = 3\nno-jinja = true\n"
        "load-on-startup = true\nstop-timeout = 4\nalias = mm, m2\nport = 1\nbogus-key = 1\n\n"
        f"[custom]\nmodel = {tmp_path / 'dir' / 'm.gguf'}\n"
    )
    args = parser.parse_args(["--temp", "0.1", "--port", "9999", "--models-max", "2"])
    cat = Catalogue(
        table, explicit_options(parser, args, table), models_dir=tmp_path / "dir", preset_file=ini
    )
    specs = cat.build()
    m = specs["m"]
    assert m.source == "preset" and m.path.endswith("m.gguf")
    argv = m.args()
    # the section beats [*]; the router's command line beats both; reserved keys are dropped
    assert argv[argv.index("--ctx-size") + 1] == "2048"
    assert argv[argv.index("--temp") + 1] == "0.1"
    assert argv[argv.index("--parallel") + 1] == "3"
    assert "--no-jinja" in argv and "--port" not in argv and "--models-max" not in argv
    assert m.aliases == ("mm", "m2") and m.load_on_startup and m.stop_timeout == 4
    assert "[m]" in m.preset_ini
    custom = specs["custom"]
    argv = custom.args()
    assert custom.source == "preset" and argv[argv.index("--model") + 1] == str(
        tmp_path / "dir" / "m.gguf"
    )
    assert argv[argv.index("--ctx-size") + 1] == "8192"


def test_an_alias_used_twice_is_refused(tmp_path, table):
    ini = tmp_path / "p.ini"
    ini.write_text("[a]\nmodel = /x.gguf\nalias = same\n[b]\nmodel = /y.gguf\nalias = same\n")
    with pytest.raises(RouterError, match="same"):
        Catalogue(table, preset_file=ini).build()


def test_dedup_hides_the_cache_entry_a_preset_serves(tmp_path, table):
    cache = {"org/model:Q8_0": tmp_path / "a.gguf", "org/other:Q8_0": tmp_path / "b.gguf"}
    ini = tmp_path / "p.ini"
    ini.write_text("[mine]\nhf-repo = org/model:Q8_0\ndedup-cache-models = 1\n")
    specs = Catalogue(table, preset_file=ini, cache=lambda: cache).build()
    assert specs["org/model:Q8_0"].hidden and not specs["org/other:Q8_0"].hidden
    assert specs["mine"].args()[:2] == ["--hf-repo", "org/model:Q8_0"]
    ini.write_text("[*]\ndedup-cache-models = 1\n[mine]\nhf-repo = org/model:Q8_0\n")
    assert Catalogue(table, preset_file=ini, cache=lambda: cache).build()["org/model:Q8_0"].hidden
    ini.write_text("[mine]\nhf-repo = org/model:Q8_0\n")
    assert (
        not Catalogue(table, preset_file=ini, cache=lambda: cache).build()["org/model:Q8_0"].hidden
    )


def test_reload_adds_removes_and_restarts_only_changed_models(tmp_path, table):
    from test_router_sched import FakeRouter

    ini = tmp_path / "p.ini"
    ini.write_text("[a]\nmodel = /a.gguf\n[b]\nmodel = /b.gguf\n")
    cat = Catalogue(table, preset_file=ini)
    r = FakeRouter([], catalogue=cat.build).start()
    try:
        assert sorted(r.children) == ["a", "b"]
        r.load("a")
        r.load("b")
        r.ensure_ready("a")
        r.ensure_ready("b")
        ini.write_text("[b]\nmodel = /b.gguf\nc = 99\n[c]\nmodel = /c.gguf\n")
        r.reload()
        assert sorted(r.children) == ["b", "c"]
        assert not r.get("b").running  # its options changed: stopped, restarts with the new ones
        ini.write_text("[b]\nmodel = /b.gguf\nc = 99\n[c]\nmodel = /c.gguf\n")
        r.ensure_ready("b")
        r.reload()
        assert r.get("b").running  # unchanged: keeps running
        ini.write_text("[broken\n")
        with pytest.raises(RouterError):
            r.reload()
        assert sorted(r.children) == ["b", "c"]
    finally:
        r.stop()


def test_a_key_from_the_environment_may_start_with_a_dash(monkeypatch):
    # the router hands each child its key in LLAMA_API_KEY; "-..." must not read as a flag
    monkeypatch.setenv("LLAMA_API_KEY", "-abc")
    assert serve_parser().parse_args([]).api_key == ["-abc"]
