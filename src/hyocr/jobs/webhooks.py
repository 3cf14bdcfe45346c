"""Webhook delivery for finished jobs: Standard Webhooks signatures, SSRF-safe POSTs, retry advice.

A callback URL obeys the same outbound rules as an image URL (hyocr.pipeline.fetch): our strict parser,
the media allowlist when one is configured, every resolved address checked, and the connection made to
the checked IP (Host header and SNI keep the name), so DNS rebinding cannot redirect a delivery. Unlike
image URLs, webhooks are not off when the allowlist is empty: then any public host may receive them.
``deliver`` makes one attempt and says whether and when to try again; the caller (the job runner) keeps
the schedule in its store, so retries survive restarts.

Each caller's webhooks are signed with that caller's own secret (``WebhookSigner.owner_secret``: an HMAC of
the caller's identity under the server's secret, which never leaves the server), read at
GET /v1/webhooks/secret. With one secret for all, any caller could have the server sign an event for a
receiver of another caller (its callback_url, with the headers that receiver expects), and it would verify.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import random
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
from standardwebhooks import Webhook

from ..errors import InvalidRequest
from ..pipeline.fetch import (
    _MAX_ADDRESSES,
    FetchPolicy,
    IPAddress,
    _allowlisted,
    _checked_addresses,
    _default_ssl_context,
    _parse,
    _Target,
)

log = logging.getLogger("hyocr.jobs")

EVENT_TYPES = frozenset({"job.succeeded", "job.failed", "job.cancelled"})
BACKOFF_BASE = 2.0  # seconds before the second attempt; doubles each time
BACKOFF_CAP = 3600.0
USER_AGENT = "hyocr-webhooks"
RESOLVE_TIMEOUT = 5.0  # seconds a submit waits for the callback host's addresses
SECRET_FILE = "webhook-secret"
_PARAM = "callback_url"
# Headers a caller's callback_headers may not set: the signature, the body's framing, the pinned Host.
_RESERVED = frozenset(
    {"content-type", "content-length", "transfer-encoding", "host", "connection", "user-agent"}
)


def _webhook(secret: str) -> Webhook:
    if not isinstance(secret, str) or not secret.startswith("whsec_"):
        raise ValueError("the webhook secret must look like whsec_<base64>")
    try:
        return Webhook(secret)
    except Exception as exc:  # binascii.Error, EmptyWebhookSecretError: the library has no common base
        raise ValueError(f"the webhook secret is not valid whsec_<base64>: {exc}") from None


class WebhookSigner:
    """Signs deliveries the Standard Webhooks way, with the reference library, each owner's with its own
    secret derived from the server's."""

    _DERIVE = b"hyocr webhook secret\0"  # keeps these HMACs apart from any other use of the server's secret

    def __init__(self, secret: str) -> None:
        _webhook(secret)  # checks the form
        self._key = base64.b64decode(secret.removeprefix("whsec_"))
        self._owners: dict[str, Webhook] = {}

    def __repr__(self) -> str:  # never the secret, even in a traceback's locals
        return "WebhookSigner(<secret>)"

    def owner_secret(self, owner: str) -> str:
        """The secret ``owner``'s receivers verify with (32 bytes, whsec_ form): the same on every replica
        that shares the server's secret, and no owner's tells anything of another's or of the server's."""
        digest = hmac.new(self._key, self._DERIVE + owner.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return "whsec_" + base64.b64encode(digest.digest()).decode("ascii")

    def headers(self, msg_id: str, body: bytes, now: float, owner: str) -> dict[str, str]:
        webhook = self._owners.get(owner)
        if webhook is None:
            if len(self._owners) >= 4096:  # a cache, not a registry: owners are unbounded over time
                self._owners.clear()
            webhook = self._owners[owner] = Webhook(self.owner_secret(owner))
        ts = int(now)  # the signature covers whole seconds; the header must carry the same ones
        signature = webhook.sign(msg_id, datetime.fromtimestamp(ts, UTC), body.decode("utf-8"))
        return {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": signature}


def load_secret(configured: str | None, data_dir: Path) -> str:
    """The configured secret, else the one kept in ``data_dir``, else a new one kept there (mode 0600)."""
    if configured:
        _webhook(configured)
        return configured
    path = Path(data_dir) / SECRET_FILE
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # as the jobs database's (store.py)
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")
        tmp = path.with_name(f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secret + "\n")
                f.flush()
                os.fsync(f.fileno())
            # link, not rename: a replica that raced us keeps its secret and we read that one below,
            # and a reader never sees a half-written file.
            os.link(tmp, path)
            log.info("generated a webhook signing secret in %s", path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    secret = path.read_text(encoding="ascii").strip()
    try:
        _webhook(secret)
    except ValueError as exc:  # regenerating would silently break every receiver: let a person decide
        raise ValueError(f"{path}: {exc}") from None
    return secret


def backoff(attempt: int, base: float = BACKOFF_BASE) -> float:
    """Seconds to wait after failed ``attempt`` (1-based): base * 2**(attempt-1), capped, then jittered
    into its upper half so that receivers that failed together are not retried in lockstep."""
    delay = min(BACKOFF_CAP, base * 2.0 ** min(max(attempt, 1) - 1, 64))
    return delay * (0.5 + random.random() / 2)


def event_body(event_type: str, data: dict, now: float) -> bytes:
    """A Standard Webhooks payload: ``{"type", "timestamp", "data"}``, compact JSON."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown webhook event type {event_type!r}")
    stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    payload = {"type": event_type, "timestamp": stamp, "data": data}
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _reworded(exc: InvalidRequest) -> InvalidRequest:
    # fetch.py's messages speak of image URLs; the client sent a callback URL.
    message = exc.message.replace("image URL", "callback URL")
    return InvalidRequest(message, param=_PARAM, code=exc.code)


async def _checked(url: str, policy: FetchPolicy) -> tuple[_Target, list[IPAddress]]:
    """The parsed target and the addresses allowed to be dialled (those deliver connects to)."""
    try:
        target = _parse(url, _PARAM)
        if policy.allowed_domains and not _allowlisted(target, policy.allowed_domains):
            raise InvalidRequest("callback URLs to this host are not allowed", code="url_not_allowed")
        return target, await _checked_addresses(target, policy, _PARAM)
    except InvalidRequest as exc:
        raise _reworded(exc) from None


async def check_callback_url(url: str, policy: FetchPolicy, *, timeout: float = RESOLVE_TIMEOUT) -> None:
    """Raise InvalidRequest (param callback_url) unless ``url`` may receive webhooks. Resolves the host,
    within ``timeout`` seconds: a submit waits for no name server longer than that."""
    try:
        async with asyncio.timeout(timeout):
            await _checked(url, policy)
    except TimeoutError:
        raise InvalidRequest(f"the callback URL's host did not resolve within {timeout:g} s", param=_PARAM,
                             code="fetch_failed") from None


@dataclass(frozen=True)
class Delivery:
    id: str  # the webhook-id: the same on every attempt, so receivers can drop duplicates
    url: str
    headers: dict[str, str]  # the job's callback_headers
    body: bytes  # JSON, from event_body
    attempt: int  # 1-based
    owner: str  # the job's: whose secret signs it


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    status: int | None
    error: str | None
    retry_in: float | None  # seconds until the next attempt; None: done or given up


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "").strip()
    try:
        seconds = float(value)  # the HTTP-date form is rare from webhook receivers: backoff instead
    except ValueError:
        return None
    return min(BACKOFF_CAP, seconds) if seconds >= 0 else None


async def deliver(
    delivery: Delivery,
    signer: WebhookSigner,
    policy: FetchPolicy,
    *,
    timeout: float,
    max_attempts: int,
    backoff_base: float = BACKOFF_BASE,
    now: float | None = None,
) -> Outcome:
    """One POST of ``delivery``; never raises for network trouble. ``now`` defaults to the clock."""

    def failed(error: str, status: int | None = None, retry: bool = True, after: float | None = None):
        again = retry and delivery.attempt < max_attempts
        wait = (after if after is not None else backoff(delivery.attempt, backoff_base)) if again else None
        return Outcome(False, status, error, wait)

    clock = datetime.now(UTC).timestamp() if now is None else now
    headers = {k: v for k, v in delivery.headers.items() if not reserved_header(k)}
    headers |= signer.headers(delivery.id, delivery.body, clock, delivery.owner)
    headers.update({"Content-Type": "application/json", "User-Agent": USER_AGENT})  # over any caller's
    try:
        async with asyncio.timeout(timeout):  # one deadline over DNS and every address tried
            try:
                target, addresses = await _checked(delivery.url, policy)
            except InvalidRequest as exc:  # an unresolvable host may come back; a forbidden one will not
                return failed(exc.message, retry=exc.code == "fetch_failed")
            headers["Host"] = target.authority
            response = await _post(target, addresses, delivery.body, headers, policy, timeout)
    except (TimeoutError, httpx.TimeoutException):
        return failed(f"no answer within {timeout:g} s")
    except (httpx.LocalProtocolError, ValueError) as exc:  # e.g. a header value no HTTP can carry
        return failed(f"the request could not be sent: {exc}", retry=False)
    except (httpx.HTTPError, OSError) as exc:
        return failed(f"delivery failed: {type(exc).__name__}: {exc}".rstrip(": "))
    status = response.status_code
    if 200 <= status < 300:
        return Outcome(True, status, None, None)
    if 300 <= status < 400:  # following it would leave the checked address: the receiver must fix its URL
        return failed(f"HTTP {status}: redirects are not followed", status, retry=False)
    if status in (408, 429) or status >= 500:
        return failed(f"HTTP {status}", status, after=_retry_after(response))
    return failed(f"HTTP {status}", status, retry=False)  # 410 Gone and other 4xx: asking again won't help


def reserved_header(name: str) -> bool:
    """A header hyocr sets on every delivery (or HTTP itself does): a caller's is refused at submit."""
    return name.strip().lower() in _RESERVED or name.strip().lower().startswith("webhook-")


async def _post(target: _Target, addresses: list[IPAddress], body: bytes, headers: dict[str, str],
                policy: FetchPolicy, timeout: float) -> httpx.Response:
    """POST to each checked address in turn until one connects; the body of the answer is never read."""
    extensions = {"sni_hostname": target.host} if target.scheme == "https" and target.ip is None else {}
    error: httpx.ConnectError | None = None
    # A fresh client: no cookies, no env proxies, no connection reused under another name.
    async with httpx.AsyncClient(
        verify=policy.ssl_context or _default_ssl_context(),
        trust_env=False,
        follow_redirects=False,
        timeout=timeout,
    ) as client:
        for ip in addresses[:_MAX_ADDRESSES]:
            host = f"[{ip.compressed}]" if isinstance(ip, ipaddress.IPv6Address) else str(ip)
            url = f"{target.scheme}://{host}:{target.port}{target.path}"
            try:
                request = client.build_request("POST", url, content=body, headers=headers)
                request.extensions.update(extensions)
                response = await client.send(request, stream=True)
                await response.aclose()  # closed unread: a receiver cannot make us download anything
                return response
            except httpx.ConnectError as exc:  # this address is down: try the next checked one
                error = exc
    assert error is not None
    raise error


