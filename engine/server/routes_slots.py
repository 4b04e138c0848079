"""Slot actions: POST /slots/{id}?action=save|restore|erase (llama-server's --slot-save-path).

save and restore take {"filename": NAME}, a plain file name inside --slot-save-path (no
separators, no '..'). What touches the cache waits until the slot is idle, then runs on the
scheduler's thread; the file itself is written or read on a worker thread, so other slots
keep streaming meanwhile (engine/slot_files.py). One save or restore per slot at a time, so
at most one copy of a slot's cache is in flight per slot.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from .. import slot_files
from ..errors import APIError, SlotFileError
from .bodies import load_json, read_body
from .errors import api_error, invalid, not_supported
from .routing import server_state

router = APIRouter()

ACTIONS = ("save", "restore", "erase")


@router.post("/slots/{slot_id}")
async def slot_action(request: Request, slot_id: str, action: str = "") -> JSONResponse:
    s = server_state(request)
    save_dir = s.options.slot_save_path
    if not save_dir:
        raise not_supported(
            "This server does not support slots action. Start it with `--slot-save-path`"
        )
    try:
        id_slot = int(slot_id)
    except ValueError:
        raise invalid("Invalid slot ID") from None
    if action not in ACTIONS:
        raise invalid("Invalid action")
    if not 0 <= id_slot < s.n_slots:
        raise invalid("Invalid slot ID")
    scheduler = s.scheduler
    if action == "erase":
        result = await _on_loop(scheduler, id_slot, lambda: slot_files.erase(scheduler, id_slot))
        return JSONResponse({"id_slot": id_slot, **result})
    filename = await _filename(request, s.options.max_body_bytes)
    async with _slot_lock(request, id_slot):
        if action == "save":
            result = await _save(scheduler, id_slot, save_dir, filename)
        else:
            result = await _restore(scheduler, id_slot, os.path.join(save_dir, filename))
    return JSONResponse({"id_slot": id_slot, "filename": filename, **result})


async def _save(scheduler, id_slot: int, save_dir: str, filename: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    snap = await _on_loop(scheduler, id_slot, lambda: slot_files.snapshot(scheduler, id_slot))
    n = await _off_loop(slot_files.write, save_dir, filename, snap)
    return {
        "n_saved": len(snap.tokens),
        "n_written": n,
        "timings": {"save_ms": (time.perf_counter() - t0) * 1e3},
    }


async def _restore(scheduler, id_slot: int, path: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    shape = slot_files.CacheShape.of(scheduler.ctx.kv, scheduler.n_ctx_seq, scheduler.ctx.n_vocab)
    loaded: slot_files.SlotFile | SlotFileError
    try:
        loaded = await asyncio.to_thread(slot_files.load, path, shape)
    except SlotFileError as e:
        loaded = e  # restore() empties the slot and answers with the reason
    n = await _on_loop(scheduler, id_slot, lambda: slot_files.restore(scheduler, id_slot, loaded))
    assert isinstance(loaded, slot_files.SlotFile)
    return {
        "n_restored": n,
        "n_read": loaded.n_read,
        "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3},
    }


def _slot_lock(request: Request, id_slot: int) -> asyncio.Lock:
    locks = getattr(request.app.state, "slot_file_locks", None)
    if locks is None:
        locks = request.app.state.slot_file_locks = {}
    return locks.setdefault(id_slot, asyncio.Lock())


async def _filename(request: Request, limit: int) -> str:
    raw = await read_body(request, limit)
    body = load_json(raw) if raw.strip() else {}
    name = body.get("filename") if isinstance(body, dict) else None
    if not isinstance(name, str):
        raise invalid("'filename' (a string) is required")
    if not slot_files.valid_filename(name):
        raise invalid("Invalid filename")
    return name


async def _on_loop(scheduler, id_slot: int, fn) -> Any:
    try:
        return await asyncio.wrap_future(scheduler.call_soon(fn, id_slot))
    except APIError:
        raise
    except Exception as e:
        raise api_error(e) from None


async def _off_loop(fn, *args) -> Any:
    try:
        return await asyncio.to_thread(fn, *args)
    except APIError:
        raise
    except Exception as e:
        raise api_error(e) from None
