"""The gateway over real HTTP: API keys, JWT, IP allowlists, rate limits, admission control and
request deadlines. The fake engine stands in for a model (latency and hangs are scripted)."""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import json
import time

import jwt
import pytest
import requests
from imaging import card

from hyocr.api.security import key_id
from hyocr.engines.fake import FakeEngine, FakeScript

IMAGE = base64.b64encode(card().png()).decode()
SECRET = "s3cret-for-tests-0123456789abcdef"


def _ocr(server, headers=None, question="hi", **body):
    payload = {"image": IMAGE, "task": "vqa", "question": question, **body}
    return requests.post(f"{server.url}/v1/ocr", json=payload, headers=headers or {}, timeout=30)


def _token(**claims) -> str:
    return jwt.encode({"sub": "alice", "exp": int(time.time()) + 60, **claims}, SECRET, algorithm="HS256")


def test_api_keys_guard_every_route_but_health(fake_server_factory):
    server = fake_server_factory(api_keys="k-one,k-two", public_ready=False)
    assert requests.get(f"{server.url}/health", timeout=5).status_code == 200
    for path in ("/ready", "/v1/models", "/docs", "/openapi.json"):
        r = requests.get(server.url + path, timeout=5)
        assert r.status_code == 401, path
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["error"]["type"] == "authentication_error"
    assert _ocr(server).status_code == 401
    assert _ocr(server, {"Authorization": "Bearer wrong"}).json()["error"]["code"] == "invalid_api_key"
    assert _ocr(server, {"Authorization": "Bearer k-two"}).status_code == 200
    assert _ocr(server, {"X-API-Key": "k-one"}).status_code == 200
    assert requests.get(f"{server.url}/v1/models", headers={"Authorization": "Bearer k-one"}, timeout=5).ok
    # two credentials that differ: whose request it is is not guessed (a wrong one beside a right one was
    # ignored, and two right ones acted as X-API-Key's caller)
    assert _ocr(server, {"X-API-Key": "k-one", "Authorization": "Bearer k-one"}).status_code == 200
    for other in ("Bearer wrong", "Bearer k-two", "Basic " + base64.b64encode(b"ui:k-two").decode()):
        r = _ocr(server, {"X-API-Key": "k-one", "Authorization": other})
        assert r.status_code == 401 and r.json()["error"]["code"] == "conflicting_credentials", r.text


def test_a_non_ascii_api_key_sent_as_its_utf8_bytes_is_accepted(fake_server_factory):
    # headers arrive as latin-1: the key's UTF-8 bytes hashed as UTF-8 of that text never matched
    import httpx

    server = fake_server_factory(api_keys="clé-ünïcode-κλειδί,plain")
    for name, prefix in ((b"x-api-key", b""), (b"authorization", b"Bearer ")):
        ok = httpx.get(f"{server.url}/v1/models", headers=[(name, prefix + "clé-ünïcode-κλειδί".encode())], timeout=10)
        assert ok.status_code == 200, ok.text
        wrong = httpx.get(f"{server.url}/v1/models", headers=[(name, prefix + "clé-ünïcode".encode())], timeout=10)
        assert wrong.status_code == 401


def test_jwt_tokens_are_verified(fake_server_factory):
    server = fake_server_factory(jwt_secret=SECRET, jwt_audience="hyocr", jwt_issuer="https://idp.test")
    good = _token(aud="hyocr", iss="https://idp.test")
    assert _ocr(server, {"Authorization": f"Bearer {good}"}).status_code == 200
    bad = {
        "expired": _token(aud="hyocr", iss="https://idp.test", exp=int(time.time()) - 10),
        "wrong audience": _token(aud="other", iss="https://idp.test"),
        "wrong issuer": _token(aud="hyocr", iss="https://evil.test"),
        "no exp": jwt.encode({"sub": "x", "aud": "hyocr", "iss": "https://idp.test"}, SECRET, algorithm="HS256"),
        "wrong key": jwt.encode({"sub": "x", "aud": "hyocr", "iss": "https://idp.test",
                                 "exp": int(time.time()) + 60}, "another-secret-0123456789abcdefgh", algorithm="HS256"),
        "alg none": jwt.encode({"sub": "x", "aud": "hyocr", "iss": "https://idp.test",
                                "exp": int(time.time()) + 60}, None, algorithm="none"),
    }
    for name, token in bad.items():
        assert _ocr(server, {"Authorization": f"Bearer {token}"}).status_code == 401, name


def test_ip_allowlist_gives_403_to_a_valid_key_from_elsewhere(fake_server_factory):
    outside = fake_server_factory(api_keys="k", allowed_ips="10.0.0.0/8")
    r = _ocr(outside, {"Authorization": "Bearer k"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "ip_not_allowed"
    assert _ocr(outside).status_code == 401  # no identity: 401 first
    inside = fake_server_factory(api_keys="k", allowed_ips="127.0.0.0/8")
    assert _ocr(inside, {"Authorization": "Bearer k"}).status_code == 200


def test_forwarded_for_is_believed_only_from_trusted_proxies(fake_server_factory):
    spoofed = {"X-Forwarded-For": "10.1.2.3"}
    untrusted = fake_server_factory(allowed_ips="10.0.0.0/8")
    assert _ocr(untrusted, spoofed).status_code == 403  # a client can't claim an address
    behind_proxy = fake_server_factory(allowed_ips="10.0.0.0/8", trusted_proxies="127.0.0.1/32")
    assert _ocr(behind_proxy, spoofed).status_code == 200
    assert _ocr(behind_proxy, {"X-Forwarded-For": "192.168.1.1"}).status_code == 403
    # Two header lines are one list (RFC 9110): the client's line and the proxy's appended one, in order.
    assert _ocr_forwarded(behind_proxy, "10.1.2.3", "192.168.1.1") == 403
    assert _ocr_forwarded(behind_proxy, "192.168.1.1", "10.1.2.3") == 200
    # An IPv4 client as a dual-stack proxy writes it (::ffff:a.b.c.d) is that IPv4 address.
    assert _ocr(behind_proxy, {"X-Forwarded-For": "::ffff:10.1.2.3"}).status_code == 200
    assert _ocr(behind_proxy, {"X-Forwarded-For": "::ffff:192.168.1.1"}).status_code == 403
    # ... and one owner with it: a job submitted from one spelling is read from the other (were two owners)
    job = requests.post(f"{behind_proxy.url}/v1/jobs", json={"image": IMAGE, "task": "text"}, timeout=30,
                        headers={"X-Forwarded-For": "::ffff:10.1.2.3"}).json()
    seen = requests.get(f"{behind_proxy.url}/v1/jobs/{job['id']}", headers=spoofed, timeout=10)
    assert seen.status_code == 200 and seen.json()["id"] == job["id"], seen.text


def _ocr_forwarded(server, *lines: str) -> int:
    """/v1/ocr with one X-Forwarded-For header line per argument (requests merges them into one)."""
    body = json.dumps({"image": IMAGE, "task": "vqa", "question": "hi"}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1]), timeout=30)
    try:
        conn.putrequest("POST", "/v1/ocr")
        for line in lines:
            conn.putheader("X-Forwarded-For", line)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        return conn.getresponse().status
    finally:
        conn.close()


def test_rate_limit_per_key_with_retry_after(fake_server_factory):
    server = fake_server_factory(api_keys="a,b", rate_limit="3/minute")
    codes = [_ocr(server, {"Authorization": "Bearer a"}).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    limited = _ocr(server, {"Authorization": "Bearer a"})
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert limited.json()["error"]["type"] == "rate_limit_error"
    assert _ocr(server, {"Authorization": "Bearer b"}).status_code == 200  # another key has its own budget
    assert requests.get(f"{server.url}/health", timeout=5).status_code == 200  # never limited


def test_failed_credentials_are_counted_per_address_and_then_refused_unchecked(fake_server_factory):
    server = fake_server_factory(api_keys="right", auth_failure_limit="3/minute")
    for _ in range(5):  # no credentials at all is no guess (a browser's first request to the UI): not counted
        assert _ocr(server).status_code == 401
    wrong = [_ocr(server, {"Authorization": f"Bearer guess-{i}"}) for i in range(3)]
    assert [r.json()["error"]["code"] for r in wrong] == ["invalid_api_key"] * 3
    for credentials in ("Bearer guess-4", "Bearer right"):  # refused before checking: a guess tells nothing
        r = _ocr(server, {"Authorization": credentials})
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_auth_failures", r.text
        assert r.json()["error"]["type"] == "rate_limit_error" and int(r.headers["retry-after"]) >= 1
    assert requests.get(f"{server.url}/health", timeout=5).status_code == 200  # public paths stay open
    # another address (a trusted proxy's client) has its own count; the right key works from there
    proxied = fake_server_factory(api_keys="right", auth_failure_limit="2/minute", trusted_proxies="127.0.0.1/32")
    for _ in range(2):
        assert _ocr(proxied, {"Authorization": "Bearer nope", "X-Forwarded-For": "10.0.0.1"}).status_code == 401
    assert _ocr(proxied, {"Authorization": "Bearer right", "X-Forwarded-For": "10.0.0.1"}).status_code == 429
    assert _ocr(proxied, {"Authorization": "Bearer right", "X-Forwarded-For": "10.0.0.2"}).status_code == 200
    off = fake_server_factory(api_keys="right", auth_failure_limit="off")
    assert [_ocr(off, {"Authorization": "Bearer x"}).status_code for _ in range(4)] == [401] * 4


def test_admission_sheds_excess_at_once_and_recovers(fake_server_factory):
    engine = FakeEngine(FakeScript(latency=1.0))
    server = fake_server_factory(engine, max_concurrency=2, max_queue=2)
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        started = time.monotonic()
        futures = [pool.submit(_ocr, server) for _ in range(12)]
        results = [(f.result().status_code, f.result().headers.get("retry-after")) for f in futures]
    codes = sorted(code for code, _ in results)
    assert codes.count(200) == 4 and codes.count(503) == 8  # 2 running + 2 queued; the rest shed
    assert all(ra == "1" for code, ra in results if code == 503)
    assert len(engine.requests) == 4  # shed requests never reached the engine (nor the decoder)
    assert time.monotonic() - started < 4
    assert _ocr(server).status_code == 200  # capacity is back


def test_deadline_is_a_504_and_aborts_the_engine(fake_server_factory):
    engine = FakeEngine()
    server = fake_server_factory(engine, request_timeout=1.0)
    started = time.monotonic()
    r = _ocr(server, question="[[fake:hang]]")
    assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
    assert time.monotonic() - started < 4
    assert engine.aborted and not engine.active
    stream = requests.post(f"{server.url}/v1/chat/completions", timeout=30, json={"stream": True, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + IMAGE}},
                                     {"type": "text", "text": "[[fake:hang]]"}]}]})
    if stream.headers["content-type"].startswith("text/event-stream"):  # the deadline came mid-stream: an event
        events = [line for line in stream.text.splitlines() if line]
        assert "timeout_error" in events[-2] and events[-1] == "data: [DONE]"
    else:  # it came while the image was still being prepared (a loaded machine): no stream yet, a plain 504
        assert stream.status_code == 504 and stream.json()["error"]["type"] == "timeout_error"
    assert _ocr(server).status_code == 200


@pytest.mark.parametrize("header", ["Authorization", "X-API-Key"])
def test_keys_never_appear_in_responses(fake_server_factory, header):
    server = fake_server_factory(api_keys="super-secret-key")
    value = "Bearer super-secret-key" if header == "Authorization" else "super-secret-key"
    r = _ocr(server, {header: value})
    assert r.status_code == 200 and "super-secret-key" not in r.text
    assert key_id("super-secret-key").startswith("key-") and "super" not in key_id("super-secret-key")


def test_one_access_log_line_per_request_without_secrets_or_content(fake_server_factory, caplog):
    import logging

    server = fake_server_factory(api_keys="log-secret-key")
    with caplog.at_level(logging.INFO, logger="hyocr.access"):
        r = _ocr(server, {"Authorization": "Bearer log-secret-key", "X-Request-ID": "trace-42"},
                 question="what is the CONFIDENTIAL total?")
        assert r.status_code == 200
        assert _ocr(server, {"Authorization": "Bearer nope"}).status_code == 401
        deadline = time.monotonic() + 5
        while len([rec for rec in caplog.records if rec.name == "hyocr.access"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    lines = [rec.fields for rec in caplog.records if rec.name == "hyocr.access"]
    ok = next(line for line in lines if line["request_id"] == "trace-42")
    assert ok["principal"] == key_id("log-secret-key") and ok["status"] == 200 and ok["route"] == "/v1/ocr"
    assert ok["image_bytes"] > 0 and ok["image_pixels"] == 1024 * 640 and ok["output_tokens"] > 0
    assert {"decode_ms", "engine_ms", "duration_ms"} <= set(ok)
    assert any(line["status"] == 401 and line["principal"] is None for line in lines)
    text = caplog.text + " ".join(str(line) for line in lines)
    assert "log-secret-key" not in text and "CONFIDENTIAL" not in text


def test_sustained_load_has_no_5xx_and_nothing_is_lost(fake_server_factory):
    """A bounded loopback load: 8 clients for 3 s. Every request the clients saw succeed is one the
    engine completed, and nothing else (no 5xx, no silently dropped work)."""
    engine = FakeEngine(FakeScript(latency=0.01))
    server = fake_server_factory(engine, max_concurrency=4, max_queue=64)
    stop_at = time.monotonic() + 3.0
    statuses: list[int] = []

    def client() -> None:
        with requests.Session() as session:
            while time.monotonic() < stop_at:
                r = session.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "text"}, timeout=30)
                statuses.append(r.status_code)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(client) for _ in range(8)]:
            future.result()
    assert len(statuses) > 40
    assert all(code == 200 for code in statuses), sorted(set(statuses))
    assert len(engine.completed) == len(statuses) and not engine.aborted
    # ... and the server's own counter agrees with the clients, exactly
    metrics = requests.get(f"{server.url}/metrics", timeout=5).text
    assert f'hyocr_requests_total{{route="/v1/ocr",status="200"}} {float(len(statuses))}' in metrics


def test_rate_limits_are_shared_by_replicas_through_redis(fake_server_factory, tmp_path):
    """Two hyocr replicas with one Redis: a key's budget is spent across both."""
    import shutil
    import socket
    import subprocess

    assert shutil.which("redis-server"), "redis-server is not installed (.ci/run installs it)"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "redis did not start"
                time.sleep(0.05)
        storage = f"redis://127.0.0.1:{port}"
        a = fake_server_factory(api_keys="shared", rate_limit="3/minute", rate_limit_storage=storage)
        b = fake_server_factory(api_keys="shared", rate_limit="3/minute", rate_limit_storage=storage)
        auth = {"Authorization": "Bearer shared"}
        codes = [_ocr(server, auth).status_code for server in (a, b, a, b)]
        assert codes == [200, 200, 200, 429]
        # Redis gone: the limits are not kept, the service is (was a 500 without a request id for every caller,
        # the auth-failure counter's before any key was checked, while /ready said 200)
        redis.terminate()
        redis.wait(timeout=10)
        c = fake_server_factory(api_keys="other", rate_limit="3/minute", rate_limit_storage=storage)
        for server, key in ((a, "shared"), (c, "other"), (c, "wrong")):
            r = _ocr(server, {"Authorization": f"Bearer {key}"})
            assert r.status_code == (401 if key == "wrong" else 200), r.text
            assert r.headers["x-request-id"]
    finally:
        redis.terminate()
        redis.wait(timeout=10)


@pytest.mark.parametrize("text", [
    "null\x00bytes\x00inside", "\u202eRTL override\u202c and \ud83d\ude00 emoji", "\ufeff" + "零宽\u200b" * 1000,
    "x" * 500_000,
])
def test_odd_text_fields_are_answered_never_with_a_500(fake_server_factory, text):
    server = fake_server_factory()
    for body in ({"image": IMAGE, "task": "vqa", "question": text},
                 {"image": IMAGE, "task": "extract", "fields": [text[:50]]},
                 {"image": IMAGE, "task": text[:100]}):
        r = requests.post(f"{server.url}/v1/ocr", json=body, timeout=30)
        assert r.status_code in (200, 400), (r.status_code, r.text[:200])
        assert "error" in r.json() if r.status_code == 400 else r.json()["pages"]
    chat = requests.post(f"{server.url}/v1/chat/completions", timeout=30, json={"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + IMAGE}}, {"type": "text", "text": text}]}]})
    assert chat.status_code in (200, 400)
