"""Slot actions: POST /slots/{id}?action=save|restore|erase (llama-server's --slot-save-path).

save and restore take {"filename": NAME}, a plain file name inside --slot-save-path (no
separators, no '..'). The action waits until the slot is idle, then runs on the scheduler's
thread (engine/slot_files.py).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from .. import slot_files
from ..errors import APIError
from .errors import api_error, invalid, not_supported
from .routing import server_state

router = APIRouter()

ACTIONS = ("save", "restore", "erase")


@router.post("/slots/{slot_id}")
async def slot_action(request: Request, slot_id: str, action: str = "") -> JSONResponse:
    s = server_state(request)
    save_dir = s.options.slot_save_path
    if not save_dir:
        raise not_supported("This server does not support slots action. Start it with `--slot-save-path`")
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
    filename = await _filename(request)
    path = os.path.join(save_dir, filename)
    if action == "save":
        result = await _on_loop(scheduler, id_slot, lambda: slot_files.save(scheduler, id_slot, path))
    else:
        result = await _on_loop(scheduler, id_slot, lambda: slot_files.restore(scheduler, id_slot, path))
    return JSONResponse({"id_slot": id_slot, "filename": filename, **result})


async def _filename(request: Request) -> str:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise invalid("the request body is not valid JSON") from None
    name = body.get("filename") if isinstance(body, dict) else None
    if not isinstance(name, str):
        raise invalid("'filename' (a string) is required")
    if not slot_files.valid_filename(name):
        raise invalid("Invalid filename")
    return name


async def _on_loop(scheduler, id_slot: int, fn) -> dict[str, Any]:
    try:
        return await asyncio.wrap_future(scheduler.call_soon(fn, id_slot))
    except APIError:
        raise
    except Exception as e:
        raise api_error(e) from None
