"""``--engine openai``: forward to an OpenAI-compatible server (e.g. a fleet of ``vllm serve``).

hyocr keeps the API, validation, prompts and post-processing; the upstream only generates. Requests
go out with the official HunyuanOCR chat shape and images already sized to the model's pixel bounds.

Resilience: pooled keep-alive connections; connect/read timeouts; bounded retries only where
nothing was generated yet (connection refused, 429/502/503/504 before the stream starts, honouring a
short Retry-After); a circuit breaker that fails fast while the upstream is down. Closing the stream
(client gone) closes the upstream connection, which makes vLLM abort the request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx

from ..config import SettingsError
from ..errors import (
    EngineError,
    GatewayTimeout,
    HyocrError,
    InvalidRequest,
    ServiceUnavailable,
    exception_chain,
    root_cause_type,
)
from ..hunyuan.chat import chat_messages, data_url, sampling_kwargs
from ..hunyuan.geometry import PixelBounds, fit_image
from ..types import EngineChunk, EngineRequest, FinishReason, StructuredOutput
from .base import Engine, EngineInfo
from .circuit import CircuitBreaker, Verdict
from .registry import ALL_TASKS

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)
_RETRY_STATUS = {429, 502, 503, 504}
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def normalize_base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise SettingsError(f"upstream URL must start with http:// or https://, got {url!r}")
    return url if url.endswith("/v1") else url + "/v1"


def _constraint_body(constraint: StructuredOutput | None) -> dict:
    """The output constraint in OpenAI's words (vLLM's server reads them too); a choice in vLLM's, which
    OpenAI has none for. Compact whitespace is the upstream's setting (vLLM: --structured-outputs-config
    '{"backend": "xgrammar", "disable_any_whitespace": true}')."""
    if constraint is None:
        return {}
    if constraint.json_schema is not None:
        schema = json.loads(constraint.json_schema)
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "hyocr_schema", "schema": schema, "strict": True}}}
    if constraint.json_object:
        return {"response_format": {"type": "json_object"}}
    return {"structured_outputs": {"choice": list(constraint.choice)}}


class OpenAIUpstreamEngine(Engine):
    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        served_model_name: str | None = None,
        timeout: float = 120.0,
        connect_timeout: float = 5.0,
        retries: int = 2,
        max_connections: int = 256,
        max_images: int = 8,
        bounds: PixelBounds = PixelBounds(),
    ) -> None:
        self.base_url = normalize_base_url(url)
        self.api_key = api_key
        self.upstream_model = model
        self.retries = retries
        self.bounds = bounds
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client: httpx.AsyncClient | None = None
        self.breaker = CircuitBreaker(f"upstream {self.base_url}")
        self._served_name = served_model_name
        self._max_images = max_images
        self._ready_at = 0.0
        self.info = self._make_info()

    def _make_info(self) -> EngineInfo:
        return EngineInfo(
            name="openai",
            model=self._served_name or self.upstream_model or "upstream",
            tasks=ALL_TASKS,
            follows_prompts=True,
            max_images=self._max_images,
            structured=True,  # forwarded (response_format): the upstream keeps it or answers 400
            details={"upstream": self.base_url, "upstream_model": self.upstream_model or "?"},
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> OpenAIUpstreamEngine:
        if not settings.upstream_url:
            raise SettingsError("--engine openai needs --upstream URL (HYOCR_UPSTREAM_URL)")
        return cls(
            settings.upstream_url,
            api_key=settings.upstream_key.get_secret_value() if settings.upstream_key else None,
            model=settings.model,
            served_model_name=settings.served_model_name,
            timeout=settings.upstream_timeout,
            retries=settings.upstream_retries,
            max_images=settings.max_images_per_request,
            bounds=PixelBounds(settings.min_pixels, settings.max_pixels),
        )

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=self._timeout, limits=self._limits
        )
        try:
            await self._discover()
        except (httpx.HTTPError, ValueError) as exc:
            # Not fatal: the upstream may come up later; readiness says so until it does.
            log.warning("upstream %s not reachable at start: %s", self.base_url, type(exc).__name__)

    async def _discover(self) -> None:
        assert self._client is not None
        r = await self._client.get("/models", timeout=5.0)
        r.raise_for_status()
        ids = [m["id"] for m in r.json().get("data", [])]
        if self.upstream_model is None and ids:
            self.upstream_model = ids[0]
            self.info = self._make_info()
        self._ready_at = time.monotonic()

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def ready(self) -> bool:
        """A real probe (GET /models), at most once a second."""
        if self._client is None or self.breaker.state == "open":
            return False
        if time.monotonic() - self._ready_at < 1.0:
            return True
        try:
            await self._discover()
            return True
        except (httpx.HTTPError, ValueError):
            return False

    def _body(self, request: EngineRequest, urls: list[str]) -> dict:
        return {
            "model": self.upstream_model or "default",
            "messages": chat_messages(request.system, request.prompt, urls),
            "stream": True,
            "stream_options": {"include_usage": True},
            **sampling_kwargs(request.sampling),
            **_constraint_body(request.sampling.structured),
        }

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        if self._client is None:
            raise ServiceUnavailable("the upstream engine is not started")
        if self.breaker.state == "open":  # fail fast, before the images are converted
            self.breaker.before_call()
        urls = await asyncio.to_thread(
            lambda: [data_url(fit_image(p, self.bounds)) for p in request.images]
        )
        body = self._body(request, urls)
        probe = self.breaker.before_call()
        verdict = Verdict(self.breaker)
        try:
            async for chunk in self._attempts(body, verdict):
                yield chunk
        except (asyncio.CancelledError, GeneratorExit):
            if probe and not verdict.given:  # the caller left first: the next call probes
                self.breaker.release()
            raise
        except BaseException:
            verdict.failure()  # unless recorded: e.g. an event that is not JSON, the upstream failed
            raise

    async def _attempts(self, body: dict, verdict: Verdict) -> AsyncIterator[EngineChunk]:
        """The request, retried on connection errors and 429/503 within ``retries``; each ending recorded in
        the breaker (``generate`` records what ends otherwise)."""
        for attempt in range(self.retries + 1):
            try:
                async with self._client.stream("POST", "/chat/completions", json=body) as resp:
                    if resp.status_code in _RETRY_STATUS and attempt < self.retries:
                        await resp.aread()
                        if _deadline_passed(resp):
                            raise self._http_error(resp, verdict)
                        await asyncio.sleep(_backoff(attempt, resp.headers.get("retry-after")))
                        continue
                    if resp.status_code >= 400:
                        await resp.aread()
                        raise self._http_error(resp, verdict)
                    async for chunk in self._read_stream(resp):
                        yield chunk
                verdict.success()
                return
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt < self.retries:
                    await asyncio.sleep(_backoff(attempt, None))
                    continue
                verdict.failure()
                raise ServiceUnavailable("the upstream server is unreachable", code="upstream_unreachable") from exc
            except httpx.TimeoutException as exc:
                verdict.failure()
                raise EngineError(f"upstream timed out: {exception_chain(exc)}",
                                  cause_type=root_cause_type(exc)) from exc
            except httpx.HTTPError as exc:  # connection lost mid-stream, protocol errors
                verdict.failure()
                raise EngineError(f"upstream connection failed: {exception_chain(exc)}",
                                  cause_type=root_cause_type(exc)) from exc
        raise ServiceUnavailable("the upstream server is overloaded", code="upstream_overloaded")

    def _http_error(self, resp: httpx.Response, verdict: Verdict) -> HyocrError:
        message = _error_message(resp)
        if resp.status_code in (400, 404, 413, 422):
            # The upstream refused this input (e.g. prompt longer than its context): the client's problem.
            verdict.success()
            return InvalidRequest(f"the model server refused the request: {message}"[:400])
        verdict.failure()
        if _deadline_passed(resp):
            return GatewayTimeout(f"the upstream's request deadline passed: {message}"[:400])
        if resp.status_code in _RETRY_STATUS:  # its own Retry-After goes on to the client (else the default)
            wait = _retry_after(resp.headers.get("retry-after"))
            return ServiceUnavailable("the upstream server is overloaded", code="upstream_overloaded",
                                      headers={"Retry-After": wait} if wait else None)
        return EngineError(f"upstream answered {resp.status_code}: {message}")

    async def _read_stream(self, resp: httpx.Response) -> AsyncIterator[EngineChunk]:
        prompt_tokens = completion_tokens = 0
        finish: FinishReason | None = None
        done = False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            try:
                event = json.loads(data)
            except (ValueError, RecursionError):
                raise EngineError("the upstream sent an event that is not JSON") from None
            if not isinstance(event, dict):
                raise EngineError("the upstream sent an event that is not a JSON object")
            if "error" in event:
                raise EngineError(f"upstream error mid-stream: {_error_message_obj(event)}")
            usage = event.get("usage")
            if usage:
                prompt_tokens = usage.get("prompt_tokens", prompt_tokens)
                completion_tokens = usage.get("completion_tokens", completion_tokens)
            for choice in event.get("choices") or ():
                text = (choice.get("delta") or {}).get("content") or ""
                if text:
                    completion_tokens += 1 if not usage else 0
                    yield EngineChunk(text=text, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
                if choice.get("finish_reason"):
                    finish = _FINISH.get(choice["finish_reason"], FinishReason.STOP)
        if not done:
            raise httpx.RemoteProtocolError("stream ended before [DONE]")
        yield EngineChunk(
            finish_reason=finish or FinishReason.STOP,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )


def _backoff(attempt: int, retry_after: str | None) -> float:
    """Exponential backoff (0.2 s, 0.4 s, ...), or the server's Retry-After when it is short."""
    if retry_after and retry_after.strip().isascii() and retry_after.strip().isdigit():
        return min(float(retry_after), 5.0)
    return 0.2 * (2**attempt)


def _retry_after(value: str | None) -> str | None:
    """An upstream's Retry-After in whole seconds (1 to an hour), or None when absent or unusable (an
    HTTP date, garbage): the client then gets hyocr's default."""
    try:
        seconds = float((value or "").strip())
    except ValueError:
        return None
    return str(math.ceil(min(seconds, 3600))) if seconds > 0 else None  # nan > 0 is False


def _deadline_passed(resp: httpx.Response) -> bool:
    """A 504 from an upstream hyocr whose own deadline passed (a stream answers it before its first token): the
    request already had its time there, so it is not retried and is no 'overloaded'. A proxy's bare 504 is."""
    if resp.status_code != 504:
        return False
    try:
        error = resp.json().get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(error, dict) and error.get("code") == "request_timeout"


def _error_message(resp: httpx.Response) -> str:
    try:
        return _error_message_obj(resp.json())
    except ValueError:
        return resp.text[:200]


def _error_message_obj(body: object) -> str:
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message", ""))[:300]
        return str(err)[:300]
    return str(body)[:300]
