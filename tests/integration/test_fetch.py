"""hyocr.pipeline.fetch against real sockets on 127.0.0.1 (docs/SECURITY.md, "Network").

Upstreams are raw HTTP servers in threads, so each can misbehave exactly (drip, endless, lying
Content-Length). A canary listener proves refused URLs never open a connection. The resolver is
replaced only where a hostname must point somewhere DNS cannot offer offline.
"""

from __future__ import annotations

import io
import ipaddress
import shutil
import socket
import socketserver
import ssl
import subprocess
import threading
import time
import tracemalloc
from types import SimpleNamespace
from typing import Self
from urllib.parse import quote, unquote

import pytest
from PIL import Image

from hyocr.errors import HyocrError, InvalidRequest, PayloadTooLarge
from hyocr.pipeline import fetch
from hyocr.pipeline.addresses import address_class
from hyocr.pipeline.fetch import FetchPolicy, fetch_image
from hyocr.pipeline.media import MediaLimits, load_image

_buf = io.BytesIO()
Image.new("RGB", (4, 3), (255, 0, 0)).save(_buf, "PNG")
PNG = _buf.getvalue()
OPEN = FetchPolicy(("*",), timeout=3)  # any public host: the production shape
LOOPBACK = FetchPolicy(("127.0.0.1", "localhost"), allow_private=True, timeout=3)


# --------------------------------------------------------------------------- servers


class Canary:
    """Listeners on 127.0.0.1 (and ::1 where possible) on one port that only count connections."""

    def __init__(self) -> None:
        self.v4 = socket.socket()
        self.v4.bind(("127.0.0.1", 0))
        self.port = self.v4.getsockname()[1]
        self.v6: socket.socket | None = None
        try:
            self.v6 = socket.socket(socket.AF_INET6)
            self.v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            self.v6.bind(("::1", self.port))
        except OSError:
            self.v6 = self.v6.close() if self.v6 else None
        self.seen = 0
        for sock in self.sockets:
            sock.listen(16)
            sock.setblocking(False)

    @property
    def sockets(self) -> list[socket.socket]:
        return [s for s in (self.v4, self.v6) if s is not None]

    def connections(self) -> int:
        """Drain the accept queues: a connect that completed (even if closed since) is queued there."""
        for sock in self.sockets:
            for _ in range(64):
                try:
                    conn, _ = sock.accept()
                except BlockingIOError:
                    break
                conn.close()
                self.seen += 1
        return self.seen

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def _send(sock: socket.socket, status: int, headers: dict[str, object], body: bytes = b"") -> None:
    head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall((head + "Connection: close\r\n\r\n").encode() + body)


class Upstream(socketserver.ThreadingTCPServer):
    """Routes: /img.png, /r/N (N+1 redirects, then the PNG), /to/<quoted URL>, /status/N, /huge-length,
    /endless (chunked), /drip (1 byte/s), /silent (never answers), /gzip."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.tls, self.port = tls, self.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.hits: list[tuple[str, str]] = []  # (path, Host header)
        self.sni: list[str | None] = []
        self.body_sent = 0
        self.client_closed = threading.Event()
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        up: Upstream = self.server  # type: ignore[assignment]
        sock: socket.socket = self.request
        sock.settimeout(5)
        try:
            if up.tls:
                sock = up.tls.wrap_socket(sock, server_side=True)
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                data = sock.recv(4096)
                if not data:
                    return
                head += data
            lines = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
            up.hits.append((path, headers.get("host", "")))
            self.route(up, sock, *path.lstrip("/").partition("/")[::2])
        except TimeoutError:  # the client is still there, just quiet
            return
        except OSError:  # the client hung up (ssl.SSLError is an OSError too)
            up.client_closed.set()
        finally:
            if sock is not self.request:  # the TLS wrapper took over the socket: close it ourselves
                sock.close()

    def route(self, up: Upstream, sock: socket.socket, name: str, arg: str) -> None:
        png = {"Content-Type": "image/png", "Content-Length": len(PNG)}
        if name in ("img.png", "gzip"):
            _send(sock, 200, png | ({"Content-Encoding": "gzip"} if name == "gzip" else {}), PNG)
        elif name in ("r", "to"):
            location = unquote(arg) if name == "to" else f"/r/{int(arg) - 1}" if int(arg) else "/img.png"
            _send(sock, 302, {"Location": location, "Content-Length": 0})
        elif name == "status":
            _send(sock, int(arg), {"Content-Length": 0})
        elif name == "huge-length":  # headers only, then wait to see the client hang up
            _send(sock, 200, {"Content-Type": "image/png", "Content-Length": 10**10})
            sock.settimeout(3)
            if sock.recv(1) == b"":
                up.client_closed.set()
        elif name == "endless":
            _send(sock, 200, {"Content-Type": "image/png", "Transfer-Encoding": "chunked"})
            chunk = b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
            for _ in range(16384):  # 1 GiB at most
                if up.stop.is_set():
                    return
                sock.sendall(chunk)
                up.body_sent += 65536
        elif name == "drip":
            _send(sock, 200, {"Content-Type": "image/png", "Content-Length": 100})
            for _ in range(100):
                sock.sendall(b"x")
                if up.stop.wait(1.0):
                    return
        elif name == "silent":
            sock.settimeout(0.1)
            for _ in range(100):  # 10 s at most
                try:
                    if sock.recv(1) == b"":
                        up.client_closed.set()
                        return
                except TimeoutError:
                    continue


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Whatever the code under test does, no connection leaves this machine: a connect to anything
    but loopback fails the test instead of reaching the network (e.g. 169.254.169.254 if the
    address check were ever broken)."""
    import ipaddress

    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(address) -> None:
        host = address[0] if isinstance(address, tuple) else None
        if host is not None and not ipaddress.ip_address(host).is_loopback:
            raise AssertionError(f"a test tried to connect to {host}")

    def connect(self, address):
        check(address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)


@pytest.fixture
def canary():
    c = Canary()
    yield c
    c.close()


@pytest.fixture
def upstream():
    with Upstream() as up:
        yield up


async def refused(url: str, policy: FetchPolicy, code: str | None = None) -> HyocrError:
    with pytest.raises(HyocrError) as info:
        await fetch_image(url, policy)
    err = info.value
    assert 400 <= err.status < 500 and err.public, (url, err)
    assert code is None or err.code == code, (url, err.code, err.message)
    return err


# --------------------------------------------------------------------------- SSRF


SSRF = [
    "http://127.0.0.1:{port}/", "http://localhost:{port}/", "http://LOCALHOST.:{port}/x.png",
    "http://[::1]:{port}/", "http://0.0.0.0:{port}/", "http://[::]:{port}/", "http://0:{port}/",
    "http://2130706433:{port}/", "http://0177.0.0.1:{port}/", "http://0x7f.1:{port}/",
    "http://0x7f000001:{port}/", "http://127.1:{port}/", "http://%31%32%37.0.0.1:{port}/",
    "http://[::ffff:127.0.0.1]:{port}/", "http://[::ffff:7f00:1]:{port}/",
    "http://\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11:{port}/",  # fullwidth 127.0.0.1
    "file:///etc/passwd", "gopher://127.0.0.1:{port}/", "http://user:pass@127.0.0.1:{port}/",
    "http://example.com:80@127.0.0.1:{port}/", "http://example.com\\@127.0.0.1:{port}/",
    "http://127.0.0.1:{port}#@example.com/", "http://127.0.0.1\t:{port}/", "http:/\\127.0.0.1:{port}/",
]  # fmt: skip


@pytest.mark.parametrize("template", SSRF)
async def test_internal_targets_are_refused_without_a_connection(template: str, canary: Canary) -> None:
    if "[::" in template and canary.v6 is None:
        pytest.skip("no IPv6 loopback here")
    err = await refused(template.format(port=canary.port), OPEN)
    assert err.code in ("invalid_url", "url_not_allowed")
    assert canary.connections() == 0


async def test_metadata_address_is_refused_before_any_connect() -> None:
    start = time.monotonic()
    err = await refused("http://169.254.169.254/latest/meta-data/", OPEN, "url_not_allowed")
    assert time.monotonic() - start < 0.5  # no connect attempt (that would wait for the timeout)
    assert "169.254" not in err.message
    # Link-local stays closed even where an operator allows internal hosts.
    await refused("http://169.254.169.254/latest/meta-data/", FetchPolicy(("*",), allow_private=True))


async def test_hostname_resolving_inside_is_refused(canary: Canary, monkeypatch) -> None:
    asked: list[str] = []

    async def resolver(host: str, port: int) -> list:
        asked.append(host)
        inside = ["127.0.0.1"] if host == "evil.example" else ["93.184.215.14", "127.0.0.1"]
        return [ipaddress.ip_address(a) for a in inside]

    monkeypatch.setattr(fetch, "resolve_host", resolver)
    for host in ("evil.example", "mixed.example"):  # one internal answer among public ones is enough
        err = await refused(f"http://{host}:{canary.port}/a.png", OPEN, "url_not_allowed")
        assert "127.0.0.1" not in err.message  # no internal DNS answers leak back
    assert asked == ["evil.example", "mixed.example"] and canary.connections() == 0


async def test_disabled_policy_refuses_every_url(canary: Canary) -> None:
    err = await refused(f"http://127.0.0.1:{canary.port}/", FetchPolicy(()), "url_inputs_disabled")
    assert "not enabled" in err.message and "data URL" in err.message
    assert canary.connections() == 0


async def test_host_outside_the_allowlist_is_refused(canary: Canary) -> None:
    policy = FetchPolicy(("*.example.com", "img.test"), allow_private=True)
    for host in ("example.com", "evilexample.com", "img.test.evil", "127.0.0.1", "localhost"):
        await refused(f"http://{host}:{canary.port}/", policy, "url_not_allowed")
    assert canary.connections() == 0


def test_address_classes() -> None:
    expect = {
        "8.8.8.8": "public", "2001:4860:4860::8888": "public", "::ffff:8.8.8.8": "public",
        "64:ff9b::808:808": "public", "2002:808:808::1": "public",
        "127.0.0.1": "internal", "10.1.2.3": "internal", "172.31.0.1": "internal", "192.168.1.1": "internal",
        "100.64.0.1": "internal", "::1": "internal", "fd00::1": "internal", "::ffff:10.0.0.1": "internal",
        "169.254.169.254": "never", "0.0.0.0": "never", "0.1.2.3": "never", "224.0.0.1": "never",
        "255.255.255.255": "never", "240.0.0.1": "never", "192.0.2.1": "never", "::": "never",
        "fe80::1": "never", "ff02::1": "never", "::7f00:1": "never", "2002:7f00:1::": "never",
        "2001:0:4136:e378:8000:63bf:3fff:fdd2": "never",
        # cloud metadata outside link-local (a hostile round): Oracle's (192.0.0.0/24, which Python 3.11
        # before 3.11.10 calls global), Azure's WireServer, Alibaba's (in CGNAT), AWS's IPv6 IMDS (in ULA)
        "192.0.0.192": "never", "168.63.129.16": "never", "100.100.100.200": "never", "fd00:ec2::254": "never",
        "::ffff:100.100.100.200": "never",
    }  # fmt: skip
    assert {a: address_class(ipaddress.ip_address(a)) for a in expect} == expect


# --------------------------------------------------------------------------- the positive path


async def test_fetches_a_real_png(upstream: Upstream) -> None:
    data = await fetch_image(f"{upstream.url}/img.png", LOOPBACK)
    assert data == PNG
    assert load_image(data, MediaLimits()).image.size == (4, 3)
    assert upstream.hits == [("/img.png", f"127.0.0.1:{upstream.port}")]


async def test_dials_the_checked_address_not_the_name(upstream: Upstream, monkeypatch) -> None:
    """A name only our resolver knows: httpx resolving it again (rebinding window) would fail."""
    answers = iter([["127.0.0.1"], ["10.9.9.9"]])  # a second lookup would rebind elsewhere

    async def resolver(host: str, port: int) -> list:
        assert host == "img.test"
        return [ipaddress.ip_address(a) for a in next(answers)]

    monkeypatch.setattr(fetch, "resolve_host", resolver)
    policy = FetchPolicy(("img.test",), allow_private=True, timeout=3)
    assert await fetch_image(f"http://img.test:{upstream.port}/img.png", policy) == PNG
    assert upstream.hits == [("/img.png", f"img.test:{upstream.port}")]
    assert next(answers) == ["10.9.9.9"]  # resolved exactly once


@pytest.fixture
def certificate(tmp_path) -> tuple[str, str]:
    """A self-signed certificate for the name img.test only (no IP address in it)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not available to make a test certificate")
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=img.test",
         "-addext", "subjectAltName=DNS:img.test"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


async def test_https_pins_the_ip_and_verifies_the_hostname(certificate, monkeypatch) -> None:
    cert, key = certificate
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=cert)

    async def resolver(host: str, port: int) -> list:
        return [ipaddress.ip_address("127.0.0.1")]

    monkeypatch.setattr(fetch, "resolve_host", resolver)
    policy = FetchPolicy(("img.test", "other.test"), allow_private=True, timeout=3, ssl_context=client_ctx)
    with Upstream(tls=server_ctx) as up:
        server_ctx.sni_callback = lambda _sock, name, _ctx: up.sni.append(name)
        assert await fetch_image(f"https://img.test:{up.port}/img.png", policy) == PNG
        assert up.sni == ["img.test"] and up.hits == [("/img.png", f"img.test:{up.port}")]
        # Same IP, a name the certificate does not cover: verification is against the name.
        await refused(f"https://other.test:{up.port}/img.png", policy, "fetch_failed")
        assert up.sni[-1] == "other.test" and len(up.hits) == 1


async def test_redirects_within_the_allowlist_are_followed(upstream: Upstream) -> None:
    via_name = quote(f"http://localhost:{upstream.port}/r/1", safe="")
    assert await fetch_image(f"{upstream.url}/to/{via_name}", LOOPBACK) == PNG
    assert [p for p, _ in upstream.hits] == [f"/to/{via_name}", "/r/1", "/r/0", "/img.png"]
    assert upstream.hits[1][1] == f"localhost:{upstream.port}"


async def test_redirect_to_a_disallowed_host_is_refused(upstream: Upstream, canary: Canary) -> None:
    only_name = FetchPolicy(("localhost",), allow_private=True, timeout=3)
    base = f"http://localhost:{upstream.port}/to/"
    await refused(base + quote(f"http://127.0.0.1:{canary.port}/", safe=""), only_name, "url_not_allowed")
    # Every hop's address is re-checked too, even with "*" and internal hosts allowed.
    anywhere = FetchPolicy(("*",), allow_private=True, timeout=3)
    for target in (f"http://0.0.0.0:{canary.port}/", "http://169.254.169.254/latest/meta-data/"):
        await refused(base + quote(target, safe=""), anywhere, "url_not_allowed")
    await refused(base + quote("file:///etc/passwd", safe=""), anywhere, "invalid_url")
    await refused(base + quote("http://[oops/", safe=""), anywhere, "fetch_failed")
    assert canary.connections() == 0 and len(upstream.hits) == 5


async def test_redirect_limit(upstream: Upstream) -> None:
    assert await fetch_image(f"{upstream.url}/r/2", LOOPBACK) == PNG  # exactly max_redirects (3)
    upstream.hits.clear()
    err = await refused(f"{upstream.url}/r/3", LOOPBACK, "fetch_failed")
    assert "redirected more than 3 times" in err.message
    assert [p for p, _ in upstream.hits] == ["/r/3", "/r/2", "/r/1", "/r/0"]  # the 4th never followed


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("status/404", "HTTP 404"),
        ("status/500", "HTTP 500"),
        ("status/302", "without a Location"),
        ("gzip", "compressed"),
    ],
)
async def test_upstream_answers_that_are_not_an_image(upstream: Upstream, path: str, words: str) -> None:
    err = await refused(f"{upstream.url}/{path}", LOOPBACK, "fetch_failed")
    assert words in err.message


async def test_unreachable_host_is_a_client_error(canary: Canary) -> None:
    port = canary.port
    canary.close()  # nothing listens there now
    await refused(f"http://127.0.0.1:{port}/", LOOPBACK, "fetch_failed")


# --------------------------------------------------------------------------- limits


async def test_content_length_over_the_cap_is_refused_before_the_body(upstream: Upstream) -> None:
    policy = FetchPolicy(("127.0.0.1",), allow_private=True, timeout=5, max_bytes=1 << 20)
    start = time.monotonic()
    with pytest.raises(PayloadTooLarge) as info:
        await fetch_image(f"{upstream.url}/huge-length", policy)
    assert info.value.status == 413 and time.monotonic() - start < 1.0
    assert upstream.client_closed.wait(2.0)  # the client hung up instead of reading


async def test_endless_body_stops_at_the_cap(upstream: Upstream) -> None:
    cap = 4 << 20
    policy = FetchPolicy(("127.0.0.1",), allow_private=True, timeout=10, max_bytes=cap)
    assert await fetch_image(f"{upstream.url}/img.png", policy) == PNG  # lazy imports stay unmeasured
    tracemalloc.start()
    try:
        start = time.monotonic()
        with pytest.raises(PayloadTooLarge):
            await fetch_image(f"{upstream.url}/endless", policy)
        elapsed = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 5.0 and peak < cap + (1 << 20)  # kept at most the cap plus a read chunk
    assert upstream.client_closed.wait(3.0)  # the server's next write failed: the client left
    assert upstream.body_sent < 1 << 30


async def test_drip_feed_hits_the_total_timeout(upstream: Upstream) -> None:
    policy = FetchPolicy(("127.0.0.1",), allow_private=True, timeout=1.5)
    start = time.monotonic()
    err = await refused(f"{upstream.url}/drip", policy, "fetch_failed")
    elapsed = time.monotonic() - start
    assert "did not answer in time" in err.message and 1.4 < elapsed < 2.5


async def test_silent_upstream_times_out(upstream: Upstream) -> None:
    policy = FetchPolicy(("127.0.0.1",), allow_private=True, timeout=1.0)
    start = time.monotonic()
    err = await refused(f"{upstream.url}/silent", policy, "fetch_failed")
    assert "did not answer in time" in err.message and 0.9 < time.monotonic() - start < 2.0
    assert upstream.client_closed.wait(2.0)  # the connection was dropped, not left hanging


# --------------------------------------------------------------------------- policy


def test_policy_from_settings() -> None:
    settings = SimpleNamespace(
        allowed_media_domains=" Img.Example.com, *.CDN.example.com.,bücher.de ,",
        media_fetch_allow_private=True, media_fetch_timeout=4, max_image_bytes=1234,
    )  # fmt: skip
    policy = FetchPolicy.from_settings(settings)
    assert policy.allowed_domains == ("img.example.com", "*.cdn.example.com", "xn--bcher-kva.de")
    assert (policy.allow_private, policy.timeout, policy.max_bytes, policy.enabled) == (True, 4.0, 1234, True)
    assert not FetchPolicy.from_settings(SimpleNamespace()).enabled  # off unless configured
    assert not FetchPolicy.from_settings(SimpleNamespace(allowed_media_domains=None)).enabled


@pytest.mark.parametrize("entry", ["*.", "*x.com", "*.*.com", "http://x", "a b", "127.1", "*.10.0.0.1"])
def test_malformed_allowlist_entries_fail_at_start_up(entry: str) -> None:
    with pytest.raises(ValueError, match="invalid allowed media domain"):
        FetchPolicy((entry,))


async def test_invalid_url_messages_are_safe() -> None:
    for url in ("", "x" * 5000, "http://", "http://h:0/", "http://h:65536/", "http://[fe80::1%25eth0]/",
                "http://a..b/", "http://\u0000h/", "javascript:alert(1)",
                # digits that str.isdigit() knows and int() does not (superscripts), or that other parsers refuse
                "http://h:\u00b2/", "http://h:\u00b9\u00b2/", "http://h:\uff11\uff18/", "http://h:\u0668\u0660/"):  # fmt: skip
        err = await refused(url, OPEN, "invalid_url")
        assert isinstance(err, InvalidRequest) and len(err.message) < 200
