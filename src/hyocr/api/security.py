"""Who is calling: API keys, JWT bearer tokens, IP allowlists. A pure ASGI middleware.

Order per request: public path? -> client IP (proxy headers only from trusted proxies) ->
credential (Bearer token or X-API-Key; HTTP Basic with the key as password for the web UI, whose
browser prompts for it) -> 401 when none is valid -> 403 when the identity's IP is outside the
allowlist. Credentials that fail are counted per client address (AUTH_FAILURE_LIMIT): over the limit the
address gets 429 before its credentials are even checked. The identity goes to ``scope["state"]["principal"]``: it owns jobs and keys rate limits and
logs, so it is the whole identity, never a shortened or case-folded form of it. A key is named by a digest
of its value (never the value); a JWT caller by a digest of its issuer and subject together (a Kubernetes
service account's subject runs past 64 characters, and two issuers may reuse a subject). A token without a
subject is refused: it names nobody, and tokens that all map to one "anonymous" owner would share jobs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from .limits import send_json_error

log = logging.getLogger("hyocr.security")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def key_id(key: str) -> str:
    """A stable, non-reversible name for an API key, safe for logs and metric labels. 48 bits suffice:
    keys are the operator's few configured values, which a caller cannot choose to collide."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def jwt_id(issuer: str | None, subject: str) -> str:
    """A JWT caller's identity: a digest of issuer and subject, whole (any length, any characters), bounded
    for the store and labels. 128 bits: subjects are the issuer's to choose, and a collision would be a
    shared owner. The NUL separator keeps ("a", "b:c") and ("a:b", "c") apart, and a NUL or U+0001 inside
    either is escaped (to U+0001 U+0002, U+0001 U+0001), so no two pairs join alike; ordinary names (neither
    character) keep the digest they always had."""
    def escaped(part: str) -> str:
        return part.replace("\1", "\1\1").replace("\0", "\1\2")

    whole = f"{escaped(issuer or '')}\0{escaped(subject)}".encode("utf-8", "surrogatepass")
    return "jwt-" + hashlib.sha256(whole).hexdigest()[:32]


def parse_networks(spec: str | None) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(s.strip(), strict=False) for s in (spec or "").split(",") if s.strip())


@dataclass(frozen=True)
class AuthPolicy:
    api_key_digests: tuple[bytes, ...] = ()  # sha256 of each key: compared in constant time
    jwt_keys: tuple[tuple[str, object], ...] = ()  # (algorithm family, key) pairs
    jwt_audience: str | None = None
    jwt_issuer: str | None = None
    allowed_ips: tuple[IPNetwork, ...] = ()
    trusted_proxies: tuple[IPNetwork, ...] = ()
    public_paths: frozenset[str] = field(default_factory=lambda: frozenset({"/health"}))
    metrics_key_digests: tuple[bytes, ...] = ()  # when set, /metrics is for these scrapers only

    @property
    def requires_identity(self) -> bool:
        return bool(self.api_key_digests or self.jwt_keys)

    @property
    def enabled(self) -> bool:
        return self.requires_identity or bool(self.allowed_ips) or bool(self.metrics_key_digests)

    @classmethod
    def from_settings(cls, settings) -> AuthPolicy:
        """The policy the settings describe; SettingsError, one line per problem, for settings it cannot use."""
        from ..config import SettingsError

        problems: list[str] = []
        digests = _digests(settings.api_keys, "api_keys", problems)
        metrics_digests = _digests(settings.metrics_api_keys, "metrics_api_keys", problems)
        roots = [name for name in ("jwt_secret", "jwt_public_key", "jwt_jwks_file") if getattr(settings, name)]
        if len(roots) > 1:
            # A token's caller is its issuer and subject; with several trust roots, whoever holds any one of them
            # could sign as another root's issuer and own its callers' jobs. One root (a JWKS may hold many keys).
            problems.append(f"{', '.join(roots)}: set one of them (a JWKS file for several keys of one issuer): "
                            "with several, the holder of any one could sign tokens for another's callers")
        jwt_keys = _jwt_keys(settings, problems)
        networks = {name: _networks(getattr(settings, name), name, problems)
                    for name in ("allowed_ips", "trusted_proxies")}
        if problems:
            raise SettingsError.of(problems)
        if jwt_keys and not settings.jwt_audience:
            log.warning("JWT_AUDIENCE is not set: tokens issued for any audience (other services of the same "
                        "issuer) are accepted")
        if settings.jwt_secret and len(settings.jwt_secret.get_secret_value().encode()) < 32:
            log.warning("JWT_SECRET is shorter than 32 bytes: an HS256 secret that short can be guessed offline "
                        "from one token (RFC 7518 asks for 256 bits)")
        public = {"/health"}
        if settings.public_ready:
            public.add("/ready")
        if settings.public_metrics:
            public.add("/metrics")
        return cls(
            api_key_digests=digests,
            jwt_keys=tuple(jwt_keys),
            jwt_audience=settings.jwt_audience,
            jwt_issuer=settings.jwt_issuer,
            allowed_ips=networks["allowed_ips"],
            trusted_proxies=networks["trusted_proxies"],
            public_paths=frozenset(public),
            metrics_key_digests=() if settings.public_metrics else metrics_digests,
        )


def _digests(keys, name: str = "", problems: list[str] | None = None) -> tuple[bytes, ...]:
    """SHA-256 of each comma-separated key of a SecretStr setting. A setting given that holds no key (``" , "``,
    or ``"$K1,$K2"`` with both unset) is a problem, not auth turned off."""
    text = keys.get_secret_value() if keys else ""
    found = tuple(hashlib.sha256(k.strip().encode()).digest() for k in text.split(",") if k.strip())
    if keys is not None and text and not found and problems is not None:
        problems.append(f"{name} (HYOCR_{name.upper()}): set but holds no key (only commas and spaces)")
    return found


def _jwt_keys(settings, problems: list[str]) -> list[tuple[str, object]]:
    """(algorithm family, key) for the configured trust root, each checked as it is read."""
    keys: list[tuple[str, object]] = []
    if settings.jwt_secret:
        keys.append(("HS256", settings.jwt_secret.get_secret_value()))
    if not (settings.jwt_public_key or settings.jwt_jwks_file):
        return keys  # the RSA imports below only where a public key is configured
    try:
        import jwt
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        if settings.jwt_public_key:
            pem = _read_key(settings.jwt_public_key)
            load_pem_public_key(pem.encode())  # a garbage PEM would otherwise make every token a 401
            keys.append(("RS256", pem))
        if settings.jwt_jwks_file:
            jwks = json.loads(Path(settings.jwt_jwks_file).read_text())
            found = jwks.get("keys") if isinstance(jwks, dict) else None
            if not isinstance(found, list) or not found:
                raise ValueError("no \"keys\" list in it")
            keys.extend(("RS256", jwt.PyJWK(jwk).key) for jwk in found)
    except (OSError, ValueError, TypeError, jwt.PyJWTError) as exc:  # JSONDecodeError is a ValueError
        name = "jwt_jwks_file" if settings.jwt_jwks_file else "jwt_public_key"
        problems.append(f"{name} (HYOCR_{name.upper()}): cannot be used: {type(exc).__name__}: {exc}"[:300])
    return keys


def _networks(spec: str | None, name: str, problems: list[str]) -> tuple[IPNetwork, ...]:
    try:
        return parse_networks(spec)
    except ValueError as exc:
        problems.append(f"{name} (HYOCR_{name.upper()}): {exc}")
        return ()


def _read_key(value: str) -> str:
    """A PEM given inline, or a path to one."""
    return value if "-----BEGIN" in value else Path(value).read_text()


class AuthError(Exception):
    def __init__(self, status: int, message: str, code: str) -> None:
        self.status, self.message, self.code = status, message, code


class Authenticator:
    def __init__(self, policy: AuthPolicy) -> None:
        self.policy = policy

    def client_ip(self, scope: Scope) -> str:
        """The peer address, or the first untrusted hop of X-Forwarded-For when the peer is a
        trusted proxy (a client can write anything into that header; only proxies we run can't). One
        spelling per address: it names an owner (an allowlist alone) and a rate-limit bucket."""
        peer = _canonical((scope.get("client") or ("0.0.0.0", 0))[0])
        if not self.policy.trusted_proxies or not self._in(peer, self.policy.trusted_proxies):
            return peer
        # Several X-Forwarded-For lines are one list, in order (RFC 9110 5.3): a proxy may add its own line.
        forwarded = ",".join(v.decode("latin-1") for k, v in scope["headers"] if k == b"x-forwarded-for")
        for hop in reversed([h.strip() for h in forwarded.split(",") if h.strip()]):
            if not self._in(hop, self.policy.trusted_proxies):
                return _canonical(hop)
        return peer

    @staticmethod
    def _in(ip: str, networks: tuple[IPNetwork, ...]) -> bool:
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        # ::ffff:a.b.c.d, as a dual-stack socket or proxy writes an IPv4 client, is that IPv4 address
        mapped = getattr(address, "ipv4_mapped", None)
        return any(address in net or (mapped is not None and mapped in net) for net in networks)

    def check_key(self, presented: str, digests: tuple[bytes, ...] | None = None) -> bool:
        # Keys are configured as UTF-8; a header's bytes arrive decoded as latin-1 (HTTP's), so a non-ASCII key
        # sent as its UTF-8 bytes is recovered by encoding them back (HTTP Basic is decoded as UTF-8 already).
        forms = {presented.encode("utf-8", "surrogatepass")}
        if not presented.isascii() and all(ord(c) < 256 for c in presented):
            forms.add(presented.encode("latin-1"))
        # Compare against every key, so the time taken says nothing about which one (or whether) matched.
        matched = False
        for form in forms:
            digest = hashlib.sha256(form).digest()
            for expected in self.policy.api_key_digests if digests is None else digests:
                matched |= hmac.compare_digest(digest, expected)
        return matched

    def scraper(self, scope: Scope) -> str:
        """The metrics scraper's identity, or AuthError: 401 without a key, 403 with a key that is not a
        scraper's (a tenant's: /metrics would show it every tenant's volumes)."""
        auth = _one_credential(scope, b"authorization")
        scheme, _, value = auth.partition(" ")
        presented = _one_credential(scope, b"x-api-key") or (value.strip() if scheme.lower() == "bearer" else "")
        if not presented:
            raise AuthError(401, "missing credentials: send Authorization: Bearer <metrics key>", "missing_api_key")
        if not self.check_key(presented, self.policy.metrics_key_digests):
            raise AuthError(403, "/metrics answers the metrics scrapers' keys only (METRICS_API_KEYS)",
                            "metrics_forbidden")
        return "metrics-scraper"

    def check_jwt(self, token: str) -> str | None:
        """The caller's identity (``jwt_id``) when the token verifies with one of our keys; None otherwise.
        AuthError(401) for a verified token that names no subject."""
        import jwt

        options = {"require": ["exp"], "verify_aud": self.policy.jwt_audience is not None}
        for family, key in self.policy.jwt_keys:
            algorithms = ["HS256", "HS384", "HS512"] if family == "HS256" else ["RS256", "RS384", "RS512"]
            try:
                claims = jwt.decode(token, key, algorithms=algorithms, audience=self.policy.jwt_audience,
                                    issuer=self.policy.jwt_issuer, options=options)
            except jwt.PyJWTError:  # PyJWT also refuses a "sub" that is not a string
                continue
            subject, issuer = claims.get("sub"), claims.get("iss")
            if not subject:
                raise AuthError(401, "the token names no subject (sub claim): hyocr needs one to know whose jobs "
                                "are whose", "token_without_subject")
            if not isinstance(issuer, str | None):  # 5 and "5" would print alike: one owner (RFC 7519: a string)
                raise AuthError(401, "the token's iss claim must be a string", "invalid_token_claims")
            times = [name for name in ("exp", "nbf", "iat") if name in claims and (
                isinstance(claims[name], bool) or not isinstance(claims[name], int | float))]
            if times:  # PyJWT reads "9999999999" as a number; RFC 7519's NumericDate is a JSON number
                raise AuthError(401, f"the token's {times[0]} claim must be a number (seconds since the epoch)",
                                "invalid_token_claims")
            return jwt_id(issuer, subject)
        return None

    def identify(self, scope: Scope) -> str:
        """The caller's identity, or AuthError(401)."""
        auth, header_key = (_one_credential(scope, name) for name in (b"authorization", b"x-api-key"))
        scheme, _, value = auth.partition(" ")
        from_auth = ""
        if scheme.lower() == "bearer":
            from_auth = value.strip()
        elif scheme.lower() == "basic":  # the web UI: the browser's login prompt, key as password
            try:
                from_auth = base64.b64decode(value).decode().partition(":")[2]
            except ValueError:
                from_auth = ""
        if header_key and from_auth and header_key != from_auth:  # whose request is it? neither is guessed
            raise AuthError(401, "two different credentials (X-API-Key and Authorization): send one",
                            "conflicting_credentials")
        presented = header_key or from_auth
        if not presented:
            raise AuthError(401, "missing credentials: send Authorization: Bearer <key or token>", "missing_api_key")
        if self.policy.api_key_digests and self.check_key(presented):
            return key_id(presented)
        if self.policy.jwt_keys and presented.count(".") == 2:
            subject = self.check_jwt(presented)
            if subject:
                return subject
        raise AuthError(401, "invalid API key or token", "invalid_api_key")


def _canonical(ip: str) -> str:
    """An address in one spelling: ``::ffff:10.1.1.1`` (a dual-stack socket's IPv4 peer) is ``10.1.1.1``, IPv6
    compressed and lowercase; text that is no address (a junk forwarded hop) is kept as it is."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def _one_credential(scope: Scope, name: bytes) -> str:
    """The header's value; AuthError when it comes more than once with different values (whichever a
    server kept, last or first, would be a guess about whose request it is)."""
    values = {v.decode("latin-1").strip() for k, v in scope["headers"] if k == name}
    if len(values) > 1:
        raise AuthError(401, f"{name.decode()} sent more than once, with different values: send one",
                        "conflicting_credentials")
    return values.pop() if values else ""


class AuthMiddleware:
    def __init__(self, app: ASGIApp, policy: AuthPolicy, failures=None) -> None:
        self.app = app
        self.auth = Authenticator(policy)
        # A RateLimiter (api/ratelimit.py) of credentials that failed, per client address: over it, the address
        # gets 429 before its credentials are checked, so guessing keys or tokens runs at that pace at most.
        self.failures = failures

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        policy = self.auth.policy
        if scope["type"] == "http" and policy.trusted_proxies:  # the real client, auth or not: rate limits
            scope.setdefault("state", {})["client_ip"] = self.auth.client_ip(scope)  # key on it (ratelimit.py)
        if scope["type"] == "websocket" and policy.enabled:  # no route takes one; refused before any would
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http" or not policy.enabled or scope["path"] in policy.public_paths:
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        ip = state.get("client_ip") or self.auth.client_ip(scope)
        state["client_ip"] = ip
        if self.failures is not None and policy.requires_identity and (
                wait := await self.failures.exceeded(f"auth-failures:{ip}")):
            await _too_many_failures(send, wait)
            return
        try:
            if policy.metrics_key_digests and scope["path"] == "/metrics":  # the operator's scrapers only
                principal: str | None = self.auth.scraper(scope)
            elif policy.requires_identity:
                principal = self.auth.identify(scope)
            else:  # an allowlist alone: each address its own caller; metrics keys alone: everyone as before
                principal = f"ip:{ip}" if policy.allowed_ips else None
            if policy.allowed_ips and not self.auth._in(ip, policy.allowed_ips):
                raise AuthError(403, "this address is not allowed", "ip_not_allowed")
        except AuthError as exc:
            if self.failures is not None and exc.status == 401 and exc.code != "missing_api_key":
                await self.failures.hit(f"auth-failures:{ip}")  # sent and failed (none sent is no guess)
            await _deny(send, exc, ui=scope["path"].startswith("/ui"))
            return
        if principal is not None:
            state["principal"] = principal
        await self.app(scope, receive, send)


async def _deny(send: Send, exc: AuthError, *, ui: bool) -> None:
    kind = "authentication_error" if exc.status == 401 else "permission_error"
    headers = []
    if exc.status == 401:
        headers.append((b"www-authenticate", b'Basic realm="hyocr"' if ui else b'Bearer realm="hyocr"'))
    await send_json_error(send, exc.status, exc.message, exc.code, type_=kind, headers=headers)


async def _too_many_failures(send: Send, wait: float) -> None:
    seconds = str(math.ceil(wait))
    await send_json_error(send, 429, f"too many failed credentials from this address; retry in {seconds}s",
                          "too_many_auth_failures", type_="rate_limit_error",
                          headers=[(b"retry-after", seconds.encode())])
