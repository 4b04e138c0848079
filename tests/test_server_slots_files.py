"""Slot files: POST /slots/{id}?action=save|restore|erase over a tiny real model."""

from __future__ import annotations

import struct

import httpx
import numpy as np
import pytest

from engine.context import Context, ContextParams
from engine.errors import SlotFileError
from engine.model import load_model
from engine.scheduler import Scheduler
from engine.server import ServerOptions, start_server
from engine.slot_files import pack_tokens, unpack_tokens, valid_filename

PROMPT = [5, 17, 42, 9, 100, 3, 77, 250, 31, 8]


@pytest.mark.parametrize("name", ["slot1.bin", "a b.bin", "état.bin", "x" * 255])
def test_slot_filename_accepted(name):
    assert valid_filename(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "../x.bin",
        "a/b.bin",
        "a\\b",
        "..",
        ".",
        "x..y",
        "a:b",
        "a*b",
        " x",
        "x ",
        "x.",
        "\x01x",
        "x" * 256,
        "a\u2215b",
        "a\ufffdb",
    ],
)
def test_slot_filename_refused(name):
    assert not valid_filename(name)


def test_slot_tokens_packed_and_plain_lists_unpack():
    assert unpack_tokens(pack_tokens([4, 5, 6])) == [4, 5, 6]
    assert unpack_tokens(np.array([4, 5, 6], np.int32)) == [4, 5, 6]  # an older server's file
    assert unpack_tokens(pack_tokens([])) == []
    with pytest.raises(SlotFileError, match="version"):
        unpack_tokens(np.array([-1, 9, 0, 0], np.int32))
    with pytest.raises(SlotFileError, match="mmproj"):
        unpack_tokens(np.array([-1, 1, 1, 7, 1, 0], np.int32))


@pytest.fixture(scope="module")
def served(tiny_llama_path, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("slots")
    model = load_model(tiny_llama_path)
    sched = Scheduler(
        Context(model, ContextParams(n_ctx=128, n_seq_max=2)), model.tokenizer, model=model
    ).start()
    handle = start_server(sched, port=0, options=ServerOptions(slot_save_path=str(save_dir)))
    with httpx.Client(base_url=handle.url, timeout=60) as client:
        yield client, save_dir, sched
    handle.stop()
    sched.stop()


def _complete(client, slot: int, prompt=PROMPT, n_predict: int = 3) -> dict:
    r = client.post(
        "/completion",
        json={
            "prompt": prompt,
            "n_predict": n_predict,
            "id_slot": slot,
            "cache_prompt": True,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_slot_save_restore_reuses_the_cache_in_another_slot(served):
    client, save_dir, _ = served
    first = _complete(client, 0)
    r = client.post("/slots/0?action=save", json={"filename": "s0.bin"})
    assert r.status_code == 200, r.text
    saved = r.json()
    assert saved["id_slot"] == 0 and saved["filename"] == "s0.bin"
    assert saved["n_saved"] == len(PROMPT) + 2  # the last sampled token is never fed
    assert saved["n_written"] == (save_dir / "s0.bin").stat().st_size
    client.post("/slots/1?action=erase")
    r = client.post("/slots/1?action=restore", json={"filename": "s0.bin"})
    assert r.status_code == 200, r.text
    assert r.json()["n_restored"] == saved["n_saved"] and r.json()["n_read"] == saved["n_written"]
    again = _complete(client, 1)
    assert again["timings"]["cache_n"] == len(PROMPT) - 1 and again["timings"]["prompt_n"] == 1
    assert again["content"] == first["content"]  # the restored keys and values are the real ones


def test_slot_restore_reads_a_plain_token_list(served):
    client, save_dir, _ = served
    _complete(client, 0)
    assert client.post("/slots/0?action=save", json={"filename": "legacy.bin"}).status_code == 200
    data = bytearray((save_dir / "legacy.bin").read_bytes())
    n_words = struct.unpack_from("<I", data, 8)[0]
    n = struct.unpack_from("<I", data, 20)[0]
    data = data[:12] + data[24 : 24 + 4 * n] + data[12 + 4 * n_words :]
    struct.pack_into("<I", data, 8, n)
    (save_dir / "legacy.bin").write_bytes(bytes(data))
    r = client.post("/slots/1?action=restore", json={"filename": "legacy.bin"})
    assert r.status_code == 200, r.text
    assert r.json()["n_restored"] == n
    assert _complete(client, 1)["timings"]["prompt_n"] == 1


def test_slot_erase_forgets_the_cache(served):
    client, _, _ = served
    _complete(client, 1)
    r = client.post("/slots/1?action=erase")
    assert r.status_code == 200 and r.json()["n_erased"] == len(PROMPT) + 2
    assert _complete(client, 1)["timings"]["prompt_n"] == len(PROMPT)


@pytest.mark.parametrize(
    "url,body,message",
    [
        ("/slots/0?action=save", {"filename": "../evil.bin"}, "Invalid filename"),
        ("/slots/0?action=save", {"filename": "sub/evil.bin"}, "Invalid filename"),
        ("/slots/0?action=save", {}, "filename"),
        ("/slots/0?action=save", {"filename": 3}, "filename"),
        ("/slots/0?action=fly", {"filename": "a.bin"}, "Invalid action"),
        ("/slots/zero?action=save", {"filename": "a.bin"}, "Invalid slot ID"),
        ("/slots/7?action=save", {"filename": "a.bin"}, "Invalid slot ID"),
        ("/slots/-1?action=erase", None, "Invalid slot ID"),
    ],
)
def test_slot_action_bad_requests_are_400(served, url, body, message):
    client, save_dir, _ = served
    r = client.post(url, json=body) if body is not None else client.post(url)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"]
    assert not (save_dir.parent / "evil.bin").exists()


def test_slot_restore_of_a_bad_file_is_400_and_empties_the_slot(served):
    client, save_dir, sched = served
    _complete(client, 0)
    (save_dir / "junk.bin").write_bytes(b"not a slot file at all")
    for name in ("junk.bin", "missing.bin"):
        r = client.post("/slots/0?action=restore", json={"filename": name})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"].startswith("Unable to restore slot")
    assert sched.slots[0].cache_tokens == []
    assert _complete(client, 0)["timings"]["prompt_n"] == len(PROMPT)


def test_slot_actions_need_slot_save_path(tiny_llama_path):
    model = load_model(tiny_llama_path)
    sched = Scheduler(Context(model, ContextParams(n_ctx=32)), model.tokenizer, model=model).start()
    handle = start_server(sched, port=0)
    try:
        r = httpx.post(handle.url + "/slots/0?action=save", json={"filename": "a.bin"})
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
    finally:
        handle.stop()
        sched.stop()
