"""hyocr.jobs.webhooks.deliver against real HTTP receivers on 127.0.0.1.

Each receiver is a ThreadingHTTPServer that answers from a script and records what it was sent, so a
test can check the signature the way a customer would (the reference library). The resolver is
replaced only where a hostname must point at loopback, as in test_fetch.py.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from standardwebhooks import Webhook

from hyocr.jobs.webhooks import Delivery, Outcome, WebhookSigner, deliver, event_body
from hyocr.pipeline import fetch
from hyocr.pipeline.fetch import FetchPolicy

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SIGNER = WebhookSigner(SECRET)
LOOPBACK = FetchPolicy(allow_private=True)  # loopback is "internal": only reachable with allow_private
BODY = event_body("job.succeeded", {"id": "job_1", "status": "succeeded"}, time.time())


class Receiver:
    """Answers each POST with the next (status, headers) of ``script`` (the last one repeats)."""

    def __init__(self, script: list[tuple[int, dict[str, str]]]) -> None:
        self.seen: list[tuple[str, dict[str, str], bytes]] = []  # (path, headers, body)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                status, headers = script[min(len(receiver.seen), len(script)) - 1]
                self.send_response(status)
                for name, value in {"content-length": "2", **headers}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def verify_request(self, request, client_address) -> bool:  # called for every accepted socket
                receiver.connections += 1
                return True

        self.connections = 0
        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks/ocr?tenant=acme"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def verified(self, i: int) -> dict:
        """The i-th delivery's payload, verified as a receiver would (raises if the signature is bad)."""
        _, headers, body = self.seen[i]
        return Webhook(SIGNER.owner_secret("key-acme")).verify(body, headers)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator:
    made: list[Receiver] = []

    def make(*script: tuple[int, dict[str, str]]) -> Receiver:
        made.append(Receiver(list(script)))
        return made[-1]

    yield make
    for r in made:
        r.close()


async def send(url: str, attempt: int = 1, policy: FetchPolicy = LOOPBACK, **kw) -> Outcome:
    delivery = Delivery(id="msg_job_1_succeeded", url=url, headers=kw.pop("headers", {}), body=BODY,
                        attempt=attempt, owner="key-acme")
    kw = {"timeout": 3.0, "max_attempts": 5, "backoff_base": 0.01, **kw}
    return await deliver(delivery, SIGNER, policy, **kw)


async def test_a_500_is_retried_and_the_retry_lands_with_the_same_id(receiver) -> None:
    r = receiver((500, {}), (200, {}))
    extra = {"X-Tenant": "acme", "Authorization": "Bearer t0k",
             "webhook-id": "forged", "Content-Type": "text/plain", "host": "evil.example"}  # ignored
    first = await send(r.url, 1, headers=extra)
    assert first.delivered is False and first.status == 500 and first.error == "HTTP 500"
    assert first.retry_in is not None and 0 < first.retry_in <= 0.01
    second = await send(r.url, 2, headers=extra)
    assert second == Outcome(delivered=True, status=200, error=None, retry_in=None)

    assert len(r.seen) == 2 == r.connections  # a fresh connection per attempt
    ids = {headers["webhook-id"] for _, headers, _ in r.seen}
    assert ids == {"msg_job_1_succeeded"}  # stable across retries: the receiver can deduplicate
    for i, (path, headers, body) in enumerate(r.seen):
        assert r.verified(i) == json.loads(BODY)
        assert body == BODY and path == "/hooks/ocr?tenant=acme"
        assert headers["content-type"] == "application/json"
        assert headers["user-agent"] == "hyocr-webhooks"
        assert headers["host"] == f"127.0.0.1:{r.port}"
        assert headers["x-tenant"] == "acme" and headers["authorization"] == "Bearer t0k"


async def test_a_redirect_is_not_followed_nor_retried(receiver) -> None:
    target = receiver((200, {}))
    r = receiver((302, {"location": target.url}))
    out = await send(r.url)
    assert (out.delivered, out.status, out.retry_in) == (False, 302, None)
    assert "redirect" in out.error
    assert len(r.seen) == 1 and target.seen == []


async def test_gone_gives_up_and_other_4xx_too(receiver) -> None:
    for status in (410, 400, 401, 404):
        out = await send(receiver((status, {})).url)
        assert (out.delivered, out.status, out.retry_in) == (False, status, None)


async def test_429_honours_retry_after_and_408_503_retry(receiver) -> None:
    out = await send(receiver((429, {"retry-after": "3"})).url)
    assert (out.delivered, out.status, out.retry_in) == (False, 429, 3)
    out = await send(receiver((503, {"retry-after": "999999"})).url)
    assert out.retry_in == 3600  # capped like the backoff
    for status in (408, 502):
        out = await send(receiver((status, {})).url)
        assert out.status == status and out.retry_in is not None and out.retry_in > 0


async def test_no_retry_after_the_last_attempt(receiver) -> None:
    out = await send(receiver((500, {})).url, attempt=5, max_attempts=5)
    assert (out.delivered, out.status, out.retry_in) == (False, 500, None)


async def test_a_closed_port_is_retried() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    out = await send(f"http://127.0.0.1:{port}/hook")
    assert (out.delivered, out.status) == (False, None)
    assert out.retry_in is not None and out.retry_in > 0 and "ConnectError" in out.error


async def test_a_receiver_that_never_answers_times_out_and_is_retried() -> None:
    with socket.socket() as s:  # listening but never accepting: the connect succeeds, no answer comes
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        out = await send(f"http://127.0.0.1:{s.getsockname()[1]}/hook", timeout=0.3)
    assert (out.delivered, out.status) == (False, None)
    assert out.retry_in is not None and "no answer" in out.error


async def test_the_default_policy_refuses_loopback_without_connecting(receiver) -> None:
    r = receiver((200, {}))
    out = await send(r.url, policy=FetchPolicy())
    assert (out.delivered, out.status, out.retry_in) == (False, None, None)
    assert "not allowed" in out.error and "callback URL" in out.error
    assert r.seen == [] and r.connections == 0


async def test_a_name_is_resolved_once_and_the_checked_address_dialled(receiver, monkeypatch) -> None:
    r = receiver((200, {}))
    answers = {"hooks.example.com": ["::1", "127.0.0.1"], "rebind.example.com": ["169.254.169.254"]}
    calls: list[str] = []

    async def resolve(host: str, port: int) -> list:
        calls.append(host)
        return [ipaddress.ip_address(a) for a in answers[host]]

    monkeypatch.setattr(fetch, "resolve_host", resolve)
    out = await send(f"http://hooks.example.com:{r.port}/h")
    assert out.delivered, out  # ::1 refused the connection; the next checked address took it
    assert calls == ["hooks.example.com"]
    assert r.seen[0][1]["host"] == f"hooks.example.com:{r.port}"  # the name travels in Host only
    r.verified(0)
    # A name that now resolves to the metadata address is refused at delivery time, for good.
    out = await send(f"http://rebind.example.com:{r.port}/h")
    assert (out.delivered, out.retry_in) == (False, None) and len(r.seen) == 1
    # One that does not resolve (yet) is worth another try.
    answers["gone.example.com"] = []
    out = await send(f"http://gone.example.com:{r.port}/h")
    assert out.delivered is False and out.retry_in is not None and "resolved" in out.error
