"""Fetch an image URL without letting a request reach places it must not (docs/SECURITY.md, "Network").

URL inputs are off unless an allowlist is configured. Every hop (the first URL and each redirect) is
parsed strictly by our own parser, so no other parser can read a different host out of it; its host is
matched against the allowlist, resolved once by us, and *every* resolved address is checked. The
connection then goes to the checked IP itself (the Host header and TLS SNI / certificate check keep the
hostname), so a second DNS answer (rebinding) can never redirect it. One deadline covers DNS, connect,
redirects and the body; the body is counted while streaming and reading stops at the byte cap.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ipaddress
import re
import socket
import ssl
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urljoin

import httpx
import idna

from ..errors import InvalidRequest, PayloadTooLarge
from .addresses import IPAddress, address_class

_MAX_URL_CHARS = 4096
_MAX_ADDRESSES = 4  # resolved addresses tried in turn when connecting fails
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_USER_AGENT = "hyocr-fetch/1"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_IPV6_AUTHORITY = re.compile(r"^\[([0-9A-Fa-f:.]+)\](?::([0-9]*))?$")
_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
_NUMERIC_LABEL = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")  # what WHATWG/inet_aton read as an IPv4 part

@dataclass(frozen=True)
class FetchPolicy:
    """Where image URLs may point. An empty allowlist means URL inputs are disabled.

    ``allowed_domains`` entries: an exact host (``img.example.com``, ``203.0.113.7``), a subdomain
    pattern (``*.example.com``: subdomains only, list ``example.com`` too for the apex), or ``*`` for any
    public host. ``ssl_context`` overrides certificate trust (an internal CA); verification stays on.
    """

    allowed_domains: tuple[str, ...] = ()
    allow_private: bool = False
    timeout: float = 10.0
    max_bytes: int = 20 * 1024 * 1024
    max_redirects: int = 3
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_domains", _normalise_allowlist(self.allowed_domains))
        if not self.timeout > 0 or self.max_bytes < 1 or self.max_redirects < 0:
            raise ValueError("FetchPolicy needs timeout > 0, max_bytes >= 1 and max_redirects >= 0")

    @property
    def enabled(self) -> bool:
        return bool(self.allowed_domains)

    @classmethod
    def from_settings(cls, settings: object) -> FetchPolicy:
        raw = getattr(settings, "allowed_media_domains", None)
        entries = raw.split(",") if isinstance(raw, str) else (raw or ())
        return cls(
            allowed_domains=tuple(entries),
            allow_private=bool(getattr(settings, "media_fetch_allow_private", False)),
            timeout=float(getattr(settings, "media_fetch_timeout", 10.0)),
            max_bytes=int(getattr(settings, "max_image_bytes", 20 * 1024 * 1024)),
        )


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str  # lowercase ASCII (IDNA), no trailing dot; IPv6 without brackets
    ip: IPAddress | None  # set when the host is an IP literal
    port: int
    path: str  # path and query, never a fragment

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if isinstance(self.ip, ipaddress.IPv6Address) else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.authority}{self.path}"


# getaddrinfo blocks a thread for as long as the resolver takes (seconds, for a hostile name server). Its
# own small pool, not the event loop's default one that decoding and PDF work share (6 threads on 2 cores):
# slow names then delay only other lookups. Callers bound the wait (fetch and webhook deadlines).
_RESOLVER: concurrent.futures.ThreadPoolExecutor | None = None


def release_resolver() -> None:
    """Let the pool's idle threads end (a server's exit waits for non-daemon threads); the next lookup makes a
    new pool. A lookup still running is left to finish."""
    global _RESOLVER
    pool, _RESOLVER = _RESOLVER, None
    if pool is not None:
        pool.shutdown(wait=False)


async def resolve_host(host: str, port: int) -> list[IPAddress]:
    """All addresses ``host`` resolves to, in the resolver's order. Tests replace this function."""
    global _RESOLVER
    if _RESOLVER is None:
        _RESOLVER = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="hyocr-dns")
    loop = asyncio.get_running_loop()
    infos = await loop.run_in_executor(_RESOLVER, functools.partial(
        socket.getaddrinfo, host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP))
    found: list[IPAddress] = []
    for *_, sockaddr in infos:
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if ip not in found:
            found.append(ip)
    return found


async def fetch_image(url: str, policy: FetchPolicy, *, param: str = "image") -> bytes:
    """The body of an http(s) image URL, or a 400/413 hyocr error whose message is safe to show."""
    if not policy.enabled:
        raise InvalidRequest(
            "image URLs are not enabled on this server; send the image as a data URL",
            param=param,
            code="url_inputs_disabled",
        )
    try:
        async with asyncio.timeout(policy.timeout):
            return await _follow(url, policy, param)
    except (TimeoutError, httpx.TimeoutException):
        raise _failed("the image URL did not answer in time", param) from None


async def _follow(url: str, policy: FetchPolicy, param: str) -> bytes:
    """Each hop is re-parsed, re-matched against the allowlist and re-resolved before it is dialled."""
    for _ in range(policy.max_redirects + 1):
        target = _parse(url, param)
        if not _allowlisted(target, policy.allowed_domains):
            raise InvalidRequest(
                "image URLs from this host are not allowed on this server",
                param=param,
                code="url_not_allowed",
            )
        addresses = await _checked_addresses(target, policy, param)
        error: httpx.HTTPError | None = None
        for ip in addresses[:_MAX_ADDRESSES]:
            try:
                location, body = await _get(target, ip, policy, param)
                break
            except httpx.ConnectError as exc:  # this address is down: try the next checked one
                error = exc
        else:
            raise _failed("could not connect to the image URL's host", param) from error
        if location is None:
            return body
        try:
            url = urljoin(target.url, location)  # the result is parsed strictly on the next turn
        except ValueError:
            raise _failed("the image URL redirected to a malformed URL", param) from None
    raise _failed(f"the image URL redirected more than {policy.max_redirects} times", param)


def _parse(url: str, param: str) -> _Target:
    """A strict parser: anything two URL parsers could read differently is refused, not guessed."""

    def invalid(why: str) -> InvalidRequest:
        return InvalidRequest(f"invalid image URL: {why}", param=param, code="invalid_url")

    if not isinstance(url, str) or not url or len(url) > _MAX_URL_CHARS:
        raise invalid(f"expected an http(s) URL of at most {_MAX_URL_CHARS} characters")
    if any(c == "\\" or c.isspace() or unicodedata.category(c)[0] in "CZ" for c in url):
        raise invalid("it contains whitespace, control characters or backslashes")
    match = _SCHEME.match(url)
    scheme = match.group(1).lower() if match else ""
    if scheme not in ("http", "https"):
        raise InvalidRequest("only http and https image URLs are supported", param=param, code="invalid_url")
    rest = url[len(scheme) + 1 :]
    if not rest.startswith("//"):
        raise invalid("expected http(s)://host/path")
    authority, sep, tail = _split(rest[2:])
    if "@" in authority:
        raise invalid("credentials in image URLs are not allowed")
    ip: IPAddress | None = None
    six = _IPV6_AUTHORITY.match(authority)
    if six:
        host, port_text = six.group(1), six.group(2)
        try:
            ip = ipaddress.IPv6Address(host)
        except ValueError:
            raise invalid("malformed IPv6 address") from None
        host = ip.compressed
    else:
        if authority.count(":") > 1 or "[" in authority or "]" in authority:
            raise invalid("malformed host")
        host, colon, port_text = authority.partition(":")
        port_text = port_text if colon else None
        host = _ascii_host(host, invalid)
        if _NUMERIC_LABEL.match(host.rsplit(".", 1)[-1]):
            try:
                ip = ipaddress.IPv4Address(host)  # four decimal parts, no leading zeros
            except ValueError:
                raise invalid("IP addresses must be written as four decimal numbers (a.b.c.d)") from None
    default = 443 if scheme == "https" else 80
    if port_text is None:
        port = default
    elif port_text.isascii() and port_text.isdigit() and len(port_text) <= 5 and 1 <= int(port_text) <= 65535:
        port = int(port_text)
    else:
        raise invalid("the port must be a number from 1 to 65535")
    path = (sep + tail).split("#", 1)[0]
    path = path if path.startswith("/") else "/" + path
    return _Target(scheme, host, ip, port, path)


def _split(text: str) -> tuple[str, str, str]:
    """authority, separator, remainder (split at the first '/', '?' or '#')."""
    for i, c in enumerate(text):
        if c in "/?#":
            return text[:i], c, text[i + 1 :]
    return text, "", ""


def _ascii_host(host: str, invalid) -> str:
    if not host.isascii():
        try:
            host = idna.encode(host, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError, ValueError):
            raise invalid("the host name is not a valid internationalised domain name") from None
    host = host.lower()
    host = host.removesuffix(".")
    if not host or len(host) > 253 or not all(_LABEL.match(label) for label in host.split(".")):
        raise invalid("malformed or empty host")
    return host


def _allowlisted(target: _Target, patterns: Iterable[str]) -> bool:
    for pattern in patterns:
        if pattern == "*" or pattern == target.host:
            return True
        if pattern.startswith("*.") and target.ip is None and target.host.endswith(pattern[1:]):
            return True
    return False


async def _checked_addresses(target: _Target, policy: FetchPolicy, param: str) -> list[IPAddress]:
    """The addresses to dial: all of them must pass, so one private answer sinks the whole name."""
    if target.ip is not None:
        addresses = [target.ip]
    else:
        try:
            addresses = [ipaddress.ip_address(str(a)) for a in await resolve_host(target.host, target.port)]
        except (OSError, UnicodeError, ValueError):
            raise _failed("the image URL's host could not be resolved", param) from None
        if not addresses:
            raise _failed("the image URL's host could not be resolved", param)
    allowed = {"public", "internal"} if policy.allow_private else {"public"}
    if any(address_class(ip) not in allowed for ip in addresses):
        raise InvalidRequest(
            "the image URL points to an address that is not allowed", param=param, code="url_not_allowed"
        )
    return addresses


async def _get(target: _Target, ip: IPAddress, policy: FetchPolicy, param: str) -> tuple[str | None, bytes]:
    """One GET to the pinned ``ip``: (redirect location, b"") or (None, body)."""
    host = f"[{ip.compressed}]" if isinstance(ip, ipaddress.IPv6Address) else str(ip)
    headers = {
        "Host": target.authority,
        "Accept": "image/*",
        "Accept-Encoding": "identity",  # no gzip/brotli bombs: the cap counts the bytes we keep
        "User-Agent": _USER_AGENT,
    }
    extensions = {"sni_hostname": target.host} if target.scheme == "https" and target.ip is None else {}
    # A fresh client per hop: no cookies, no connection reused under another hostname, no env proxies.
    async with httpx.AsyncClient(
        verify=policy.ssl_context or _default_ssl_context(),
        trust_env=False,
        follow_redirects=False,
        timeout=policy.timeout,
    ) as client:
        url = f"{target.scheme}://{host}:{target.port}{target.path}"
        try:
            async with client.stream("GET", url, headers=headers, extensions=extensions) as response:
                return await _read(response, policy, param)
        except (httpx.ConnectError, httpx.TimeoutException):
            raise
        except httpx.HTTPError as exc:
            raise _failed("the image URL sent a malformed HTTP response", param) from exc


async def _read(response: httpx.Response, policy: FetchPolicy, param: str) -> tuple[str | None, bytes]:
    status = response.status_code
    if status in _REDIRECTS:
        location = response.headers.get("location")
        if not location:
            raise _failed(f"the image URL answered HTTP {status} without a Location", param)
        return location, b""
    if not 200 <= status < 300:
        raise _failed(f"the image URL answered HTTP {status}", param)
    if response.headers.get("content-encoding", "identity").strip().lower() != "identity":
        raise _failed("the image URL answered with a compressed encoding; serve the image as is", param)
    too_large = PayloadTooLarge(f"image is larger than the {policy.max_bytes} byte limit", param=param)
    length = response.headers.get("content-length", "")
    if length.isascii() and length.isdigit() and int(length) > policy.max_bytes:
        raise too_large  # before reading a byte of the body
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.aiter_raw():
        total += len(chunk)
        if total > policy.max_bytes:
            raise too_large  # stop at the cap: closing the stream drops the connection
        chunks.append(chunk)
    if total == 0:
        raise _failed("the image URL returned an empty body", param)
    return None, b"".join(chunks)


def _failed(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="fetch_failed")


_SSL_CONTEXT: ssl.SSLContext | None = None


def _default_ssl_context() -> ssl.SSLContext:
    """httpx's default trust (certifi), built once: loading the CA bundle per request costs ~10 ms."""
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        _SSL_CONTEXT = httpx.create_ssl_context()
    return _SSL_CONTEXT


def _normalise_allowlist(entries: Iterable[str]) -> tuple[str, ...]:
    """Lowercase, IDNA-encoded, canonical-IP entries; a malformed entry is a start-up error."""
    out: list[str] = []
    for raw in entries:
        entry = str(raw).strip().lower()
        if not entry:
            continue
        if entry != "*":
            wildcard = entry.startswith("*.")
            name = entry[2:] if wildcard else entry
            try:
                entry = ipaddress.ip_address(name.strip("[]")).compressed
                if wildcard:
                    raise ValueError
            except ValueError:
                try:
                    name = _ascii_host(name, ValueError)
                    if _NUMERIC_LABEL.match(name.rsplit(".", 1)[-1]):
                        raise ValueError from None
                except ValueError:
                    raise ValueError(f"invalid allowed media domain {raw!r}") from None
                entry = f"*.{name}" if wildcard else name
        if entry not in out:
            out.append(entry)
    return tuple(out)
