"""Liveness and readiness. /health: the process answers. /ready: the engine is loaded and answering."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ...engines.base import SharedEngine
from ...errors import ServiceUnavailable
from ..bodies import replicas_body
from .deps import service_of

router = APIRouter(tags=["health"])


# HEAD too: uptime monitors probe with it
@router.api_route("/health", methods=["GET", "HEAD"], summary="The process is alive")
async def health() -> dict:
    return {"status": "ok"}


@router.api_route("/ready", methods=["GET", "HEAD"],
                  summary="The engine is loaded and answering (503 otherwise)")
async def ready(request: Request) -> JSONResponse:
    engine = service_of(request).engine
    supervisor = request.app.state.supervisor
    healthy = bool(getattr(request.app.state, "engine_started", False)) and await supervisor.healthy()
    ok = healthy and (not isinstance(engine, SharedEngine) or engine.peers_ready())
    body = {"status": "ready" if ok else "unavailable", "engine": engine.info.name, "model": engine.info.model,
            "restarts": supervisor.restarts}
    body.update(replicas_body(engine))
    if healthy and not ok:
        body["reason"] = "waiting for the server's other API processes"
    elif not ok and supervisor.last_failure:
        body["reason"] = "restarting" if supervisor.restarting else "engine unhealthy"
    if ok:
        return JSONResponse(body)
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(ServiceUnavailable.retry_after)})


@router.get("/metrics", summary="Prometheus metrics (HYOCR_PUBLIC_METRICS=true to scrape without a key)")
async def metrics(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    body = generate_latest(request.app.state.metrics.scrape_registry())  # vLLM's vllm:* families included
    return Response(body, media_type=CONTENT_TYPE_LATEST)
