"""Access to the app-wide objects that ``build_app`` puts on ``app.state``."""

from __future__ import annotations

from fastapi import Request

from ...config import Settings
from ...errors import UnsupportedMediaType
from ...pipeline.service import OcrService


def service_of(request: Request) -> OcrService:
    return request.app.state.service


def settings_of(request: Request) -> Settings:
    return request.app.state.settings


def caller_of(request: Request) -> str | None:
    """The gateway's principal (an API key's digest, a JWT identity, an allowed address); None without auth."""
    return request.scope.get("state", {}).get("principal")


def media_type(request: Request) -> str:
    """The body's declared type without its parameters, lower case ("" when none is declared)."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def json_body(request: Request) -> None:
    """A JSON body's route refuses any other declared type, or none, with a 415 before reading it: a browser
    may send text/plain or a form cross-site without asking first (CORS "simple" requests), and FastAPI would
    read such a body, or one without a type (curl -d without -H), as bytes and answer a puzzling 400."""
    declared = media_type(request)
    if declared != "application/json" and not declared.endswith("+json"):
        raise UnsupportedMediaType(f"send the body as application/json (Content-Type: application/json), not "
                                   f"{declared[:100] or 'a body without a content type'}", param="content-type")
