"""build_app: the one factory that wires settings, engine, service, routes and middleware.

Tests build the same app the CLI serves. The engine is started in the lifespan and stopped at shutdown:
uvicorn listens once it has started (a load balancer or Kubernetes startup probe sees connections refused
while a large model loads, then /ready 200), and a start that fails ends the server with exit status 3.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware import Middleware

from .. import __version__
from ..config import Settings
from ..engines.base import Engine
from ..engines.registry import create_engine
from ..observability.logs import AccessLogMiddleware
from ..observability.metrics import Metrics
from ..pipeline.service import OcrService
from ..pipeline.supervisor import EngineSupervisor
from .batch_lines import LineAnswerer
from .bodies import job_body, ocr_body
from .errors import UnexpectedErrorMiddleware, install_error_handlers
from .limits import BodyLimitMiddleware, RequestIdMiddleware
from .ratelimit import RateLimiter, RateLimitMiddleware
from .routes import batches, files, health, ocr, openai
from .routes import jobs as jobs_routes
from .security import AuthMiddleware, AuthPolicy
from .serving import Drain, DrainMiddleware

log = logging.getLogger("hyocr")


def build_app(settings: Settings, engine: Engine | None = None) -> FastAPI:
    engine = engine or create_engine(settings)
    service = OcrService.from_settings(engine, settings)
    supervisor = EngineSupervisor(engine, service, stall_timeout=settings.stall_timeout)
    metrics = Metrics(service)
    metrics.track(metrics.restarts, lambda: supervisor.restarts)
    jobs = None
    if settings.jobs:
        from ..jobs.service import Jobs  # SQLAlchemy and the store, only when the jobs API is on

        jobs = Jobs.from_settings(service, settings, describe=job_body, metrics=metrics, result_body=ocr_body,
                                  answer=LineAnswerer(service, settings))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if jobs is not None:
            await jobs.open()
        started = time.perf_counter()
        await engine.start()
        app.state.engine_started = True
        log.info(
            "engine %s ready in %.1fs: model %s, tasks %s %s",
            engine.info.name,
            time.perf_counter() - started,
            engine.info.model,
            ",".join(sorted(t.value for t in engine.info.tasks)),
            engine.info.details or "",
        )
        supervisor.start()
        if jobs is not None:
            jobs.start()  # stored jobs resume here
        refresher = asyncio.get_running_loop().create_task(metrics.refresh_forever()) if metrics.shared else None
        if settings.metrics_port:
            from prometheus_client import start_http_server

            addr = settings.metrics_host or settings.host  # METRICS_HOST: another interface than the API's
            metrics_server, _ = start_http_server(settings.metrics_port, addr=addr, registry=metrics.scrape_registry())
            log.info("metrics on http://%s:%d/metrics", addr, settings.metrics_port)
        try:
            yield
        finally:
            if settings.metrics_port:
                metrics_server.shutdown()
            if refresher is not None:
                refresher.cancel()
            app.state.engine_started = False
            if jobs is not None:
                await jobs.stop()  # ranges in progress are given back, not lost
            await supervisor.stop()
            await engine.stop()
            service.close()  # the PDF render workers go with the server

    # Outermost first: every response gets a request id; then who is calling (401/403), how often
    # (429), and how much they send (413) are settled before any route reads the body.
    policy = AuthPolicy.from_settings(settings)
    drain = Drain(settings.drain_timeout)  # the server starts it on SIGTERM (api/serving.py)
    middleware = [
        Middleware(RequestIdMiddleware),
        Middleware(AccessLogMiddleware, metrics=metrics),
        Middleware(DrainMiddleware, drain=drain),  # at DRAIN_TIMEOUT: a JSON 503, logged and counted
        Middleware(AuthMiddleware, policy=policy, failures=_auth_failures(settings, policy)),
    ]
    if settings.rate_limit:
        limiter = RateLimiter(settings.rate_limit, settings.rate_limit_storage)
        # Probes and scrapes are cheap and periodic: they never spend a caller's budget.
        exempt = policy.public_paths | {"/health", "/ready", "/metrics"}
        middleware.append(Middleware(RateLimitMiddleware, limiter=limiter, public_paths=exempt,
                                     free_get_prefixes=("/ui",) if settings.ui else ()))  # ui.app.PATH
    # A batch input file may be larger than any request: its own cap (with room for the multipart framing).
    files_cap = {"/v1/files": max(settings.max_body_bytes, settings.file_max_bytes + 2**20)}
    middleware.append(Middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes,
                                 timeout=settings.body_timeout, path_caps=files_cap))
    middleware.append(Middleware(UnexpectedErrorMiddleware))  # innermost: see api/errors.py
    app = FastAPI(
        title="hyocr",
        version=__version__,
        summary="OCR service for HunyuanOCR: OpenAI-compatible and OCR-native APIs",
        lifespan=lifespan,
        middleware=middleware,
    )
    app.state.settings = settings
    app.state.service = service
    app.state.supervisor = supervisor
    app.state.metrics = metrics
    app.state.drain = drain
    app.state.jobs = jobs
    app.state.engine_started = False
    app.state.started_at = int(time.time())
    install_error_handlers(app)
    for router in (health.router, ocr.router, openai.router, jobs_routes.router, files.router,
                   batches.router):
        app.include_router(router)
    if settings.ui:
        from ..ui.app import mount_ui  # imports Gradio, only when the UI is on

        mount_ui(app, service, settings)
    return app


def check_gateway_settings(settings: Settings) -> None:
    """Auth and rate-limit settings read as build_app will read them, before any process or engine starts:
    SettingsError (one line per problem) instead of a traceback from a worker."""
    policy = AuthPolicy.from_settings(settings)
    if settings.rate_limit:
        RateLimiter(settings.rate_limit, settings.rate_limit_storage)
    _auth_failures(settings, policy)


def _auth_failures(settings: Settings, policy: AuthPolicy) -> RateLimiter | None:
    """The counter of failed credentials per address (api/security.py), where callers have credentials."""
    spec = (settings.auth_failure_limit or "").strip()
    if not policy.requires_identity or spec.lower() in ("", "off", "none", "0"):
        return None
    return RateLimiter(spec, settings.rate_limit_storage, setting="auth_failure_limit")
