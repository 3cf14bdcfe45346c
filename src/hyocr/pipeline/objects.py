"""Objects in S3 and GCS (``s3://bucket/key``, ``gs://bucket/key``): read as documents and batch input files,
written as results, for jobs and batches, and by ``hyocr batch`` in-process (batch/sources.py, outputs.py).

Off unless the operator lists what may be reached (OBJECT_STORE_ALLOWED_BUCKETS): the server reads and writes
with its own credentials, so without the list any caller could make it read any bucket those credentials
reach. Credentials come only from the environment, through the SDK's standard chain (AWS_* variables,
~/.aws, the instance or pod role; GOOGLE_APPLICATION_CREDENTIALS), never from a request: a URI carrying
user info or query options (``s3://KEY:SECRET@b/k``, ``?endpoint_override=``, which pyarrow would honour) is
refused here, and the filesystem is built from settings, not from the URI. Presigned ``https://`` URLs are
image URLs (pipeline/fetch.py: ALLOWED_MEDIA_DOMAINS, no private addresses), not objects.

The IO is pyarrow.fs (the filesystem layer Ray Data reads with), imported lazily: its calls block, so the
async functions run them on worker threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import re
import threading
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from pydantic import AfterValidator

from ..errors import InvalidRequest, PayloadTooLarge, ServiceUnavailable
from ..types import MediaInput, OcrCall

SCHEMES = ("s3", "gs")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_MAX_KEY = 1024
_ERROR_CHARS = 300
# Object IO blocks a thread for as long as the store takes: a pool of its own, not the event loop's default
# one that decoding and PDF work share (6 threads on 2 cores), so a batch writing thousands of results or a
# slow store delays only other object IO.
_IO = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="hyocr-objects")

# Fields that would carry credentials or a filesystem's options in a request: refused wherever an object URI
# is taken (credentials come from the server's environment only).
CREDENTIAL_FIELDS = frozenset({
    "aws_access_key_id", "aws_secret_access_key", "aws_session_token", "access_key", "secret_key",
    "session_token", "credentials", "storage_options", "endpoint_url", "endpoint_override",
    "google_application_credentials", "service_account",
})


def is_object_uri(text: object) -> bool:
    return isinstance(text, str) and text[:5].lower() in ("s3://", "gs://")


def refuse_credentials(body: object, where: str = "") -> None:
    """400 when a request names credentials or filesystem options (top-level fields)."""
    if isinstance(body, dict):
        named = sorted(k for k in body if isinstance(k, str) and k.lower() in CREDENTIAL_FIELDS)
        if named:
            raise InvalidRequest(f"{where}{named[0]}: credentials are never taken from a request; the server "
                                 "uses its own (its environment's standard chain)", param=named[0],
                                 code="credentials_not_accepted")


@dataclass(frozen=True, slots=True)
class ObjectUri:
    scheme: str  # s3 | gs
    bucket: str
    key: str  # may be empty (a bucket's root, as a prefix)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}"

    @property
    def path(self) -> str:
        """The object's path in its filesystem (pyarrow: bucket/key)."""
        return f"{self.bucket}/{self.key}"

    def child(self, name: str) -> ObjectUri:
        """``name`` below this URI taken as a prefix (a ``/`` added where missing)."""
        base = self.key if not self.key or self.key.endswith("/") else self.key + "/"
        return ObjectUri(self.scheme, self.bucket, base + name)


def parse_object_uri(text: str, *, param: str = "uri", prefix: bool = False) -> ObjectUri:
    """A strict parse: ``scheme://bucket/key`` with nothing two parsers could read differently. ``prefix``:
    a key may be empty or end in ``/`` (an output location)."""

    def invalid(why: str) -> InvalidRequest:
        return InvalidRequest(f"invalid object URI: {why}", param=param, code="invalid_object_uri")

    if not isinstance(text, str) or len(text) > 2048:
        raise invalid("expected s3://bucket/key or gs://bucket/key, at most 2048 characters")
    if any(c.isspace() or c == "\\" or ord(c) < 32 or ord(c) == 127 for c in text):
        raise invalid("it contains whitespace, control characters or backslashes")
    scheme, sep, rest = text.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in SCHEMES:
        raise invalid("only s3:// and gs:// are object URIs (presigned https:// URLs are image URLs)")
    if "?" in rest or "#" in rest:
        raise invalid("query strings and fragments are not taken: the server's settings configure the store")
    bucket, _, key = rest.partition("/")
    if "@" in bucket or ":" in bucket:
        raise invalid("credentials or ports in object URIs are not accepted; the server uses its own")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise invalid(f"{bucket[:64]!r} is not a bucket name")
    if len(key) > _MAX_KEY:
        raise invalid(f"the key is longer than {_MAX_KEY} characters")
    parts = key.split("/")
    inner = parts[:-1] if prefix else parts  # a prefix may end in "/" (its last part empty), never in "." or ".."
    if key.startswith("/") or any(p in ("", ".", "..") for p in inner) or parts[-1] in (".", ".."):
        raise invalid("empty, '.' or '..' segments are not accepted in the key")
    if not prefix and not key:
        raise invalid("expected an object's key after the bucket")
    return ObjectUri(scheme, bucket, key)


@dataclass(frozen=True)
class ObjectPolicy:
    """What may be reached, and how. ``allowed`` entries: ``s3://bucket`` (the whole bucket),
    ``s3://bucket/prefix/`` (below that prefix), or ``*`` (anything the server's credentials reach)."""

    allowed: tuple[str, ...] = ()
    endpoint: str | None = None  # S3-compatible endpoint (MinIO, R2, a test's moto): http(s)://host:port

    def __post_init__(self) -> None:
        entries = []
        for raw in self.allowed:
            entry = str(raw).strip()
            if not entry:
                continue
            if entry != "*":
                uri = parse_object_uri(entry if "://" in entry[:6] else f"s3://{entry}", prefix=True)
                entry = str(uri) if str(uri).endswith("/") else f"{uri}/"  # s3://b/team-a: not s3://b/team-ab
            entries.append(entry)
        object.__setattr__(self, "allowed", tuple(entries))
        if self.endpoint is not None and not re.match(r"^https?://[^/?#@\s]+/?$", self.endpoint):
            raise ValueError(f"object_store_endpoint {self.endpoint!r}: expected http(s)://host[:port]")

    @property
    def enabled(self) -> bool:
        return bool(self.allowed)

    @classmethod
    def from_settings(cls, settings: object) -> ObjectPolicy:
        raw = getattr(settings, "object_store_allowed_buckets", None) or ""
        return cls(tuple(raw.split(",")), getattr(settings, "object_store_endpoint", None))

    @classmethod
    def everything(cls, settings: object | None = None) -> ObjectPolicy:
        """The operator's own reach (``hyocr batch`` on the command line): what the credentials reach."""
        policy = cls.from_settings(settings) if settings is not None else cls()
        return replace(policy, allowed=("*",))

    def check(self, uri: ObjectUri, *, param: str) -> None:
        if not self.enabled:
            raise InvalidRequest("object storage URIs are not enabled on this server "
                                 "(OBJECT_STORE_ALLOWED_BUCKETS)", param=param, code="object_store_disabled")
        text = str(uri)
        for entry in self.allowed:  # a bucket's entry is s3://bucket/ once parsed: a prefix like the others
            if entry == "*" or text.startswith(entry):
                return
        raise InvalidRequest(f"{uri.scheme}://{uri.bucket}/...: this bucket or prefix is not allowed on this "
                             "server", param=param, code="object_not_allowed")


def _allowlist(value: str | None) -> str | None:
    if value is not None:
        try:
            ObjectPolicy(tuple(value.split(",")))
        except InvalidRequest as exc:
            raise ValueError(exc.message) from None
    return value


def _endpoint(value: str | None) -> str | None:
    if value is not None:
        ObjectPolicy(endpoint=value)
    return value


# The settings' types (config.py): a malformed entry stops the server at start, naming the setting.
BucketList = Annotated[str | None, AfterValidator(_allowlist)]
StoreEndpoint = Annotated[str | None, AfterValidator(_endpoint)]


class ObjectWriteError(Exception):
    """An object could not be written; the message (the store's own, one line) says why."""


@dataclass
class ObjectStore:
    """Reads and writes objects under ``policy``. One filesystem per scheme, made on first use."""

    policy: ObjectPolicy
    _filesystems: dict[str, Any] = field(default_factory=dict, repr=False)
    _regions: dict[str, str] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_settings(cls, settings: object) -> ObjectStore:
        return cls(ObjectPolicy.from_settings(settings))

    def checked(self, text: str, *, param: str, prefix: bool = False) -> ObjectUri:
        """``text`` parsed and allowed. A prefix is made to end in ``/``: what is written lies below it."""
        uri = parse_object_uri(text, param=param, prefix=prefix)
        if prefix and uri.key and not uri.key.endswith("/"):
            uri = ObjectUri(uri.scheme, uri.bucket, uri.key + "/")
        self.policy.check(uri, param=param)
        return uri

    # ------------------------------------------------------------------ blocking calls (worker threads, CLI)

    def read_sync(self, uri: ObjectUri, *, max_bytes: int, param: str = "uri") -> bytes:
        """The object's bytes: 400 when it is missing, 413 past ``max_bytes`` (from its listed size, before
        reading), 503 when the store cannot be reached or refuses (a retry may succeed)."""
        pafs = _pafs()
        fs = self._filesystem(uri)
        try:
            info = fs.get_file_info(uri.path)
            if info.type != pafs.FileType.File:
                raise InvalidRequest(f"{uri}: no such object", param=param, code="object_not_found")
            if info.size is not None and info.size > max_bytes:
                raise PayloadTooLarge(f"{uri} is larger than the {max_bytes} byte limit", param=param)
            with fs.open_input_stream(uri.path) as stream:
                data = stream.read(max_bytes + 1)
        except FileNotFoundError:
            raise InvalidRequest(f"{uri}: no such object", param=param, code="object_not_found") from None
        except OSError as exc:
            raise ServiceUnavailable(f"{uri} could not be read: {store_message(exc)}", param=param,
                                     code="object_store_unavailable") from None
        if len(data) > max_bytes:
            raise PayloadTooLarge(f"{uri} is larger than the {max_bytes} byte limit", param=param)
        return data

    def head_sync(self, uri: ObjectUri, size: int, *, param: str = "uri") -> bytes:
        """The object's first ``size`` bytes (``hyocr batch`` sniffs a name without an extension)."""
        fs = self._filesystem(uri)
        try:
            with fs.open_input_stream(uri.path) as stream:
                return stream.read(size)
        except FileNotFoundError:
            raise InvalidRequest(f"{uri}: no such object", param=param, code="object_not_found") from None
        except OSError as exc:
            raise ServiceUnavailable(f"{uri} could not be read: {store_message(exc)}", param=param,
                                     code="object_store_unavailable") from None

    def write_sync(self, uri: ObjectUri, data: bytes, content_type: str = "application/json") -> None:
        try:
            fs = self._filesystem(uri)
            with fs.open_output_stream(uri.path, metadata={"Content-Type": content_type}) as stream:
                stream.write(data)
        except (OSError, ValueError, ServiceUnavailable) as exc:
            raise ObjectWriteError(f"{uri} could not be written: {store_message(exc)}") from None

    def list_sync(self, prefix: ObjectUri, *, recursive: bool = True) -> list[tuple[ObjectUri, int]]:
        """The objects below ``prefix`` (or the one it names), sorted by key, with their sizes; not
        ``recursive``: only those directly below it."""
        pafs = _pafs()
        fs = self._filesystem(prefix)
        root = prefix.path.rstrip("/")
        try:
            info = fs.get_file_info(root)
            if info.type == pafs.FileType.File:
                return [(prefix, info.size or 0)]
            entries = fs.get_file_info(pafs.FileSelector(root, recursive=recursive, allow_not_found=True))
        except OSError as exc:
            raise ServiceUnavailable(f"{prefix} could not be listed: {store_message(exc)}",
                                     code="object_store_unavailable") from None
        found = [(ObjectUri(prefix.scheme, prefix.bucket, e.path.split("/", 1)[1]), e.size or 0)
                 for e in entries if e.type == pafs.FileType.File]
        return sorted(found, key=lambda pair: pair[0].key)

    def _filesystem(self, uri: ObjectUri) -> Any:
        """The filesystem for ``uri``'s store: one for GCS, one per region for S3 (a bucket's region asked of
        AWS once, unless an endpoint or AWS_REGION / AWS_DEFAULT_REGION says it)."""
        region = None
        if uri.scheme == "s3" and not self.policy.endpoint and not _env_region():
            region = self._regions.get(uri.bucket)
            if region is None:
                region = self._regions[uri.bucket] = _bucket_region(uri.bucket)
        key = f"{uri.scheme}:{region or ''}"
        with self._lock:
            if key not in self._filesystems:
                self._filesystems[key] = _make_filesystem(uri.scheme, self.policy, region)
            return self._filesystems[key]

    # ------------------------------------------------------------------ async, for the server

    async def read(self, text: str, *, max_bytes: int, param: str = "uri") -> bytes:
        uri = self.checked(text, param=param)
        return await _off_loop(functools.partial(self.read_sync, uri, max_bytes=max_bytes, param=param))

    async def write(self, uri: ObjectUri, data: bytes, content_type: str = "application/json") -> None:
        await _off_loop(functools.partial(self.write_sync, uri, data, content_type))

    async def fetch_media(self, call: OcrCall, *, max_bytes: int) -> OcrCall:
        """``call`` with each object URI among its media replaced by the object's bytes (the other media as
        they are): what a job stores and a batch line reads."""
        wanted = [m for m in call.media if is_object_uri(m.data)]
        if not wanted:
            return call
        for m in wanted:  # every URI checked before any is read
            self.checked(m.data, param=m.param)
        read = await asyncio.gather(*(self.read(m.data, max_bytes=max_bytes, param=m.param) for m in wanted))
        by_id = {id(m): data for m, data in zip(wanted, read, strict=True)}
        return replace(call, media=tuple(MediaInput(by_id[id(m)], m.param) if id(m) in by_id else m
                                         for m in call.media))


async def _off_loop(work):
    return await asyncio.get_running_loop().run_in_executor(_IO, work)


def store_message(exc: BaseException) -> str:
    """The store's error as one bounded line (it names the operation, bucket and key, never credentials)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:_ERROR_CHARS]


def _pafs() -> Any:
    try:
        import pyarrow.fs as pafs
    except ImportError as exc:  # absent, or present and refusing to load (pyarrow 26 with numpy 1.x)
        raise ServiceUnavailable('object storage needs pyarrow on the server: pip install "hyocr[objects]" '
                                 f"({store_message(exc)})", code="object_store_unavailable") from None
    return pafs


def _env_region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")


def _bucket_region(bucket: str) -> str:
    try:
        return _pafs().resolve_s3_region(bucket)
    except (OSError, ValueError) as exc:  # no such bucket, no network: the read or write says so next
        raise ServiceUnavailable(f"s3://{bucket}: its region could not be found: {store_message(exc)}",
                                 code="object_store_unavailable") from None


# How long GCS calls retry before the error is the document's (google-cloud-cpp's own default is 15 minutes of
# retries: a store that is down would hold a job's range, or a batch, for that long).
GCS_RETRY_SECONDS = 30
# Google's client libraries' variable for a GCS emulator (host:port or http(s)://host:port); where set, GCS is
# reached there without credentials, as those libraries do. S3-compatible stores use OBJECT_STORE_ENDPOINT.
GCS_EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


def store_endpoint(scheme: str, policy: ObjectPolicy) -> str | None:
    """Where a scheme's objects are reached when not at the cloud's own service: OBJECT_STORE_ENDPOINT for s3://,
    the emulator for gs:// (one bucket name on two stores is two buckets)."""
    if scheme == "gs":
        return os.environ.get(GCS_EMULATOR_ENV, "").strip() or None
    return policy.endpoint


def _gcs_options(emulator: str | None) -> dict[str, Any]:
    import datetime

    options: dict[str, Any] = {"retry_time_limit": datetime.timedelta(seconds=GCS_RETRY_SECONDS)}
    if emulator:
        how, _, where = emulator.rstrip("/").rpartition("://")
        options.update(anonymous=True, endpoint_override=where, scheme=how or "http")
    return options


def _make_filesystem(scheme: str, policy: ObjectPolicy, region: str | None = None) -> Any:
    pafs = _pafs()
    try:
        if scheme == "gs":
            return pafs.GcsFileSystem(**_gcs_options(store_endpoint(scheme, policy)))
        # the region, like the credentials, from the environment (AWS_REGION, AWS_DEFAULT_REGION, ~/.aws), or
        # the bucket's own as AWS answers it
        options: dict[str, Any] = {"allow_bucket_creation": False, "allow_bucket_deletion": False}
        if region:
            options["region"] = region
        if policy.endpoint:
            how, _, where = policy.endpoint.rstrip("/").partition("://")
            options.update(endpoint_override=where, scheme=how)
        return pafs.S3FileSystem(**options)
    except (OSError, ValueError, ImportError, AttributeError) as exc:  # pyarrow built without S3 or GCS
        raise ServiceUnavailable(f"the {scheme}:// store could not be opened: {store_message(exc)}",
                                 code="object_store_unavailable") from None
