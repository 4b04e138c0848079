"""Slot actions: POST /slots/{id}?action=save|restore|erase (llama-server's --slot-save-path)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from .errors import not_supported

router = APIRouter()


@router.post("/slots/{slot_id}")
async def slot_action(request: Request, slot_id: int, action: str = ""):
    raise not_supported(f"slot action '{action}' is not supported by this server")
