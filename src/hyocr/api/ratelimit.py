"""Per-caller rate limits with the ``limits`` library: in memory by default, Redis when
``HYOCR_RATE_LIMIT_STORAGE=redis://...`` so that every replica counts against the same window.

The caller is the identity the auth middleware found (an API key's digest name, a JWT subject), or
the client IP when auth is off: behind ``TRUSTED_PROXIES`` the forwarded client's, not the proxy's
(api/security.py resolves it whether or not auth is on). Over the limit: 429 with Retry-After, before any body is read.
"""

from __future__ import annotations

import logging
import math
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from .limits import send_json_error

log = logging.getLogger("hyocr.ratelimit")


class RateLimiter:
    def __init__(self, spec: str, storage_uri: str = "memory://", setting: str = "rate_limit") -> None:
        from limits import parse_many
        from limits.aio.strategies import MovingWindowRateLimiter
        from limits.errors import ConfigurationError
        from limits.storage import storage_from_string

        from ..config import SettingsError

        def invalid(name: str, exc: Exception) -> SettingsError:
            return SettingsError.of([f"{name} (HYOCR_{name.upper()}): {exc}"])

        try:
            self.items = parse_many(spec)  # "60/minute" or "10/second;1000/hour"
        except ValueError as exc:
            raise invalid(setting, exc) from None
        # The async storages (no blocking Redis round trip on the event loop).
        uri = storage_uri if storage_uri.startswith("async+") else "async+" + storage_uri
        # Redis through redis-py's asyncio client (limits' default async client is coredis).
        options = {"implementation": "redispy"} if "redis" in uri.split("://", 1)[0] else {}
        self._warned = float("-inf")
        try:
            self.limiter = MovingWindowRateLimiter(storage_from_string(uri, **options))
        except (ConfigurationError, ValueError) as exc:
            raise invalid("rate_limit_storage", exc) from None

    async def exceeded(self, caller: str) -> float | None:
        """Like ``hit`` without spending: None while the caller is under every limit."""
        return await self._kept(caller, spend=False)

    async def hit(self, caller: str) -> float | None:
        """None when allowed; else seconds until the caller may try again."""
        return await self._kept(caller, spend=True)

    async def _check(self, caller: str, spend: bool) -> float | None:
        for item in self.items:
            allowed = await (self.limiter.hit if spend else self.limiter.test)(item, "hyocr", caller)
            if not allowed:
                stats = await self.limiter.get_window_stats(item, "hyocr", caller)
                return max(1.0, stats.reset_time - time.time())
        return None

    async def _kept(self, caller: str, spend: bool) -> float | None:
        """The limits fail open: a storage that cannot be reached (Redis down) lets requests through, logged at
        most once a minute, rather than failing every caller's request with a 500. A limit is a protection
        of the service, not a condition of serving it."""
        try:
            return await self._check(caller, spend)
        except Exception as exc:  # redis-py's connection and timeout errors, limits' storage errors
            now = time.monotonic()
            if now - self._warned > 60:
                self._warned = now
                log.error("rate limits are not kept: their storage fails (%s: %s); requests pass unlimited",
                          type(exc).__name__, str(exc)[:200])
            return None


class RateLimitMiddleware:
    def __init__(self, app: ASGIApp, limiter: RateLimiter, public_paths: frozenset[str],
                 free_get_prefixes: tuple[str, ...] = ()) -> None:
        self.app = app
        self.limiter = limiter
        self.public_paths = public_paths
        # The web UI's reads (its page, scripts, styles, config, the event stream of a run, files shown) are
        # ~90 requests a page load: they are not work. What does work there is a POST (an upload, a run).
        self.free_get_prefixes = free_get_prefixes

    def _free(self, scope: Scope) -> bool:
        path = scope["path"]
        return path in self.public_paths or (scope.get("method") in ("GET", "HEAD")
                                             and path.startswith(self.free_get_prefixes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._free(scope):
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        caller = state.get("principal") or f"ip:{state.get('client_ip') or (scope.get('client') or ('-',))[0]}"
        retry_after = await self.limiter.hit(caller)
        if retry_after is None:
            await self.app(scope, receive, send)
            return
        wait = str(math.ceil(retry_after))
        await send_json_error(send, 429, f"rate limit exceeded; retry in {wait}s", "rate_limit_exceeded",
                              type_="rate_limit_error", headers=[(b"retry-after", wait.encode())])
