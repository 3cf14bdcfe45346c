"""Access to the app-wide objects that ``build_app`` puts on ``app.state``."""

from __future__ import annotations

from fastapi import Request

from ...config import Settings
from ...pipeline.service import OcrService


def service_of(request: Request) -> OcrService:
    return request.app.state.service


def settings_of(request: Request) -> Settings:
    return request.app.state.settings


def caller_of(request: Request) -> str | None:
    """The gateway's principal (an API key's digest, a JWT identity, an allowed address); None without auth."""
    return request.scope.get("state", {}).get("principal")
