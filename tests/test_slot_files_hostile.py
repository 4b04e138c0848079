"""Slot files against hostile input: planted links, sparse and odd files, names at the length
limit, deep request bodies. Each must be a clean 4xx, never a 500, a hang, a huge read or a
write outside --slot-save-path."""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
import time
import tracemalloc

import httpx
import pytest

from engine import slot_files
from engine.context import Context, ContextParams
from engine.errors import SlotFileError
from engine.model import load_model
from engine.scheduler import Scheduler
from engine.server import ServerOptions, start_server

PROMPT = [5, 17, 42, 9, 100, 3, 77, 250, 31, 8]
SCHEDULER_THREAD = "slot-files-hostile-scheduler"


@pytest.fixture(scope="module")
def served(tiny_llama_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    save_dir = root / "slots"
    save_dir.mkdir()
    model = load_model(tiny_llama_path)
    sched = Scheduler(
        Context(model, ContextParams(n_ctx=128, n_seq_max=2)), model.tokenizer, model=model
    ).start(SCHEDULER_THREAD)
    handle = start_server(sched, port=0, options=ServerOptions(slot_save_path=str(save_dir)))
    with httpx.Client(base_url=handle.url, timeout=60) as client:
        r = client.post(
            "/completion",
            json={
                "prompt": PROMPT,
                "n_predict": 2,
                "id_slot": 0,
                "cache_prompt": True,
                "temperature": 0,
            },
        )
        assert r.status_code == 200, r.text
        r = client.post("/slots/0?action=save", json={"filename": "good.bin"})
        assert r.status_code == 200, r.text
        yield client, save_dir, sched
    handle.stop()
    sched.stop()


def _parts(data: bytes) -> tuple[bytes, bytes, bytes, bytes]:
    """(12-byte header, token words, KV header before the meta, meta) of a slot file; the
    arrays follow the meta."""
    n_words = struct.unpack_from("<I", data, 8)[0]
    at = 12 + 4 * n_words
    n_meta = struct.unpack_from("<I", data, at + 8)[0]
    return data[:12], data[12:at], data[at : at + 12], data[at + 12 : at + 12 + n_meta]


def _with_meta(data: bytes, meta: bytes) -> bytes:
    head, words, kv_head, old = _parts(data)
    rest = data[len(head) + len(words) + len(kv_head) + len(old) :]
    return head + words + kv_head[:8] + struct.pack("<I", len(meta)) + meta + rest


def _restore(client, name: str, slot: int = 1):
    return client.post(f"/slots/{slot}?action=restore", json={"filename": name})


def _assert_refused(r, status: int = 400):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body["error"]) >= {"code", "message", "type"}
    return body["error"]["message"]


# --- restore: size and memory ------------------------------------------------------------------
def test_slot_restore_refuses_a_huge_sparse_file_by_its_size(served):
    client, save_dir, _ = served
    path = save_dir / "huge.bin"
    path.write_bytes((save_dir / "good.bin").read_bytes())
    with open(path, "r+b") as f:
        f.truncate(4 << 30)  # sparse: no disk, but a whole-file read would take 4 GiB
    t0 = time.perf_counter()
    message = _assert_refused(_restore(client, "huge.bin"))
    assert time.perf_counter() - t0 < 5
    assert message.startswith("Unable to restore slot") and "bytes" in message
    path.unlink()


def test_slot_load_of_a_huge_sparse_file_reads_nothing_big(served, tmp_path):
    _, save_dir, sched = served
    path = tmp_path / "huge.bin"
    path.write_bytes((save_dir / "good.bin").read_bytes())
    with open(path, "r+b") as f:
        f.truncate(4 << 30)
    shape = slot_files.CacheShape.of(sched.ctx.kv, sched.n_ctx_seq, sched.ctx.n_vocab)
    tracemalloc.start()
    try:
        with pytest.raises(SlotFileError, match="bytes"):
            slot_files.load(str(path), shape)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_slot_load_reads_a_big_claim_no_further_than_the_file(served, tmp_path):
    """A header claiming more than the file holds is refused before anything is allocated."""
    _, save_dir, sched = served
    data = (save_dir / "good.bin").read_bytes()
    head, words, kv_head, meta = _parts(data)
    shape = slot_files.CacheShape.of(sched.ctx.kv, sched.n_ctx_seq, sched.ctx.n_vocab)
    cases = {
        "words": struct.pack(
            "<III", slot_files.STATE_SEQ_MAGIC, slot_files.STATE_SEQ_VERSION, 0xFFFFFFFF
        ),
        "meta": head + words + kv_head[:8] + struct.pack("<I", 0xFFFFFFFF),
    }
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(SlotFileError):
            slot_files.load(str(tmp_path / name), shape)


@pytest.mark.parametrize(
    "io, action, name", [("load", "restore", "good.bin"), ("write", "save", "offthread.bin")]
)
def test_slot_file_io_runs_off_the_scheduler_thread(served, monkeypatch, io, action, name):
    client, save_dir, _ = served
    seen: list[str] = []
    real = getattr(slot_files, io)

    def spy(*args, **kwargs):
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(slot_files, io, spy)
    r = client.post(
        f"/slots/{1 if action == 'restore' else 0}?action={action}", json={"filename": name}
    )
    assert r.status_code == 200, r.text
    assert seen and SCHEDULER_THREAD not in seen
    if action == "save":
        assert r.json()["n_written"] == (save_dir / name).stat().st_size


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_slot_restore_of_a_fifo_is_400_not_a_hang(served):
    client, save_dir, _ = served
    os.mkfifo(save_dir / "pipe.bin")
    try:
        message = _assert_refused(_restore(client, "pipe.bin"))
        assert message.startswith("Unable to restore slot")
    finally:
        (save_dir / "pipe.bin").unlink()


# --- restore: odd headers and metadata -----------------------------------------------------------
RAW_META = {  # the whole JSON header
    "a list": b"[1, 2, 3]",
    "a string": b'"n_pos"',
    "a number": b"7",
    "nested deep": b"[" * 3000 + b"]" * 3000,
    "nested deep in a value": b'{"n_pos": ' + b"[" * 3000 + b"]" * 3000 + b"}",
    "not json": b"{nope",
    "not utf-8": b'{"n_pos": "\xff"}',
    "keys missing": b'{"n_pos": 11}',
    "n_pos missing": b'{"n_layer": 2}',
}
CHANGED_META = {  # fields of the good file's header replaced
    "n_pos a list": {"n_pos": [11]},
    "n_pos a string": {"n_pos": "11"},
    "n_pos a float": {"n_pos": 11.0},
    "n_pos a bool": {"n_pos": True},
    "n_pos huge": {"n_pos": 10**30},
    "n_pos negative": {"n_pos": -11},
    "n_pos zero": {"n_pos": 0},
    "n_pos null": {"n_pos": None},
    "shapes numbers": {"k_shape": 3, "v_shape": 4},
    "n_layer a list": {"n_layer": [[1]]},
    "type_k an object": {"type_k": {"f16": 1}},
}


@pytest.mark.parametrize("case", [*RAW_META, *CHANGED_META])
def test_slot_restore_of_odd_metadata_is_400(served, case):
    client, save_dir, _ = served
    data = (save_dir / "good.bin").read_bytes()
    if case in RAW_META:
        meta = RAW_META[case]
    else:
        meta = json.dumps({**json.loads(_parts(data)[3]), **CHANGED_META[case]}).encode()
    (save_dir / "odd.bin").write_bytes(_with_meta(data, meta))
    message = _assert_refused(_restore(client, "odd.bin"))
    assert message.startswith("Unable to restore slot")


@pytest.mark.parametrize(
    "case",
    [
        "truncated arrays",
        "truncated tokens",
        "words huge",
        "meta huge",
        "kv magic",
        "kv version",
        "empty",
        "header only",
    ],
)
def test_slot_restore_of_a_bad_layout_is_400(served, case):
    client, save_dir, _ = served
    data = (save_dir / "good.bin").read_bytes()
    head, words, kv_head, meta = _parts(data)
    blob = {
        "truncated arrays": data[:-7],
        "truncated tokens": head + words[:5],
        "words huge": head[:8] + struct.pack("<I", 0xFFFFFFFF) + words,
        "meta huge": head + words + kv_head[:8] + struct.pack("<I", 0xFFFFFFF0) + meta,
        "kv magic": head + words + b"XXXX" + kv_head[4:] + data[len(head) + len(words) + 12 :],
        "kv version": head
        + words
        + kv_head[:4]
        + struct.pack("<I", 99)
        + data[len(head) + len(words) + 8 :],
        "empty": b"",
        "header only": head,
    }[case]
    (save_dir / "bad.bin").write_bytes(blob)
    message = _assert_refused(_restore(client, "bad.bin"))
    assert message.startswith("Unable to restore slot")


def test_slot_restore_still_reads_the_good_file(served):
    client, _, sched = served
    r = _restore(client, "good.bin")
    assert r.status_code == 200, r.text
    assert r.json()["n_restored"] == len(PROMPT) + 1 == len(sched.slots[1].cache_tokens)


# --- save: links, names, directories -----------------------------------------------------------
@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_slot_save_never_writes_through_a_planted_tmp_link(served):
    client, save_dir, _ = served
    outside = save_dir.parent / "outside-tmp.txt"
    outside.write_text("precious")
    os.symlink(outside, save_dir / "planted.bin.tmp")
    r = client.post("/slots/0?action=save", json={"filename": "planted.bin"})
    assert r.status_code == 200, r.text
    assert outside.read_text() == "precious"
    assert (save_dir / "planted.bin").is_file() and not (save_dir / "planted.bin").is_symlink()


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_slot_save_replaces_a_planted_final_link_not_its_target(served):
    client, save_dir, _ = served
    outside = save_dir.parent / "outside-final.txt"
    outside.write_text("precious")
    os.symlink(outside, save_dir / "linked.bin")
    r = client.post("/slots/0?action=save", json={"filename": "linked.bin"})
    assert r.status_code == 200, r.text
    assert outside.read_text() == "precious"
    assert not (save_dir / "linked.bin").is_symlink()


@pytest.mark.parametrize(
    "name", ["x" * 255, "é" * 127 + "x", "y" * 250 + ".bin"], ids=["ascii", "utf-8", "dotted"]
)
def test_slot_save_and_restore_of_a_name_at_the_length_limit(served, name):
    client, save_dir, _ = served
    assert len(name.encode()) <= 255
    r = client.post("/slots/0?action=save", json={"filename": name})
    assert r.status_code == 200, r.text
    assert _restore(client, name).status_code == 200
    assert [
        p.name for p in save_dir.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()
    ] == []
    (save_dir / name).unlink()


def test_slot_save_onto_a_directory_is_400_and_leaves_nothing(served):
    client, save_dir, _ = served
    (save_dir / "adir").mkdir()
    before = sorted(p.name for p in save_dir.iterdir())
    message = _assert_refused(client.post("/slots/0?action=save", json={"filename": "adir"}))
    assert message.startswith("Unable to save slot")
    assert sorted(p.name for p in save_dir.iterdir()) == before
    assert (save_dir / "adir").is_dir() and list((save_dir / "adir").iterdir()) == []


def test_slot_restore_of_a_directory_is_400(served):
    client, save_dir, _ = served
    (save_dir / "rdir").mkdir()
    assert _restore(client, "rdir").status_code == 400


# --- bodies ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"filename": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"filename": "\\ud800"}',
        b'{"filename": 1e999}',
        b"\xff\xfe",
        b"[]",
        b'"good.bin"',
    ],
    ids=[
        "deep array",
        "deep filename",
        "lone surrogate",
        "1e999",
        "not utf-8",
        "a list",
        "a string",
    ],
)
def test_slot_action_odd_bodies_are_400(served, body):
    client, _, _ = served
    r = client.post(
        "/slots/0?action=restore", content=body, headers={"content-type": "application/json"}
    )
    _assert_refused(r)
