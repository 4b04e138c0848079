"""OpenAI Responses API: /v1/responses, plain and streaming."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
