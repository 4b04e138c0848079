"""Vertex AI prediction mode (AIP_MODE=PREDICTION): /predict with several instances."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
