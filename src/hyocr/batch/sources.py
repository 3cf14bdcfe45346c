"""Documents behind a URI: objects (``s3://bucket/prefix/``, ``gs://bucket/...``) listed and read through
pipeline/objects.py, the object IO the server's jobs and batches use, so the command line gets its strict URI
parsing (no credentials, ports, queries or ``..`` in a URI), OBJECT_STORE_ENDPOINT (MinIO, R2) and
credentials only from the environment; local files named ``file:///...``. On the command line the
operator's own credentials decide what is reachable (``ObjectPolicy.everything``: no bucket allowlist).

``Sources`` travels to the Ray tasks that read documents (it pickles: a policy and a size cap), so the
driver and the tasks see the same objects. An object's URI is its scheme, bucket and key as the store lists
them; a file's is its ``Path.as_uri()``.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from ..pipeline.objects import ObjectPolicy, ObjectStore, ObjectUri, is_object_uri, parse_object_uri

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
HEAD_BYTES = 16  # what ``looks_like_document`` sniffs of a name without a document extension


class SourceError(Exception):
    """A URI that cannot be listed (the message says why)."""


def is_uri(given: str) -> bool:
    return bool(_SCHEME.match(given))


def redacted(uri: str) -> str:
    """``uri`` for a message: user info (``KEY:SECRET@``) never echoed to a terminal or a log."""
    scheme, sep, rest = uri.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}***@{host.rpartition('@')[2]}{slash}{path}" if "@" in host else uri


@functools.lru_cache(maxsize=8)
def _store(policy: ObjectPolicy) -> ObjectStore:
    """One store per policy in a process (the driver, each Ray task process): its filesystems are reused."""
    return ObjectStore(policy)


@dataclass(frozen=True, slots=True)
class Sources:
    """Where a batch's documents are read from: local paths, ``file://`` URIs, and objects under ``policy``;
    an object larger than ``max_bytes`` (the larger of MAX_IMAGE_BYTES and MAX_PDF_BYTES: the pipeline
    refuses anything larger) is not read into memory."""

    policy: ObjectPolicy = field(default_factory=ObjectPolicy.everything)
    max_bytes: int = 50 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings: Any) -> Sources:
        return cls(ObjectPolicy.everything(settings), max(settings.max_image_bytes, settings.max_pdf_bytes))

    @property
    def store(self) -> ObjectStore:
        return _store(self.policy)

    def list(self, uri: str, wanted: Callable[[str, Callable[[], bytes]], bool]) -> Iterator[tuple[str, str]]:
        """(object URI, its path relative to ``uri``) of the object ``uri`` names, or of each object below it
        in a folder's order, that ``wanted`` accepts (given its name and a function that reads its first
        bytes). Hidden names (".x") are skipped below a prefix, as in a folder. Raises SourceError."""
        if uri[:7].lower() == "file://":
            found = _files(local_path(uri))
        elif is_object_uri(uri):
            found = self._objects(uri)
        else:
            raise SourceError(f"{redacted(uri)}: only s3://, gs:// and file:// URIs are read")
        for entry, rel, head in sorted(found, key=lambda e: _walk_order(e[1])):
            if wanted(rel.rpartition("/")[2], head):
                yield entry, rel

    def _objects(self, given: str) -> list[tuple[str, str, Callable[[], bytes]]]:
        from ..errors import HyocrError

        try:
            prefix = parse_object_uri(given, param="INPUT", prefix=True)
            listed = self.store.list_sync(prefix)
        except HyocrError as exc:
            raise SourceError(f"{redacted(given)}: {exc.message}") from None
        root = prefix.key.rstrip("/")
        found = []
        for uri, _size in listed:
            rel = uri.key.rpartition("/")[2] if uri.key == root else uri.key[len(root):].lstrip("/")
            if not any(part.startswith(".") for part in rel.split("/")):
                found.append((str(uri), rel, functools.partial(self._head, uri)))
        if not found:
            raise SourceError(f"{given}: no such object or prefix")
        return found

    def _head(self, uri: ObjectUri) -> bytes:
        from ..errors import HyocrError

        try:
            return self.store.head_sync(uri, HEAD_BYTES)
        except HyocrError as exc:
            raise OSError(exc.message) from None

    def read(self, source: str) -> bytes:
        """A document's bytes from its source (``Document.source``): an object's URI, a ``file://`` URI or a
        local path. Raises OSError (the message says why) when it cannot be read."""
        if is_object_uri(source):
            return self._read_object(source)
        return (local_path(source) if source[:7].lower() == "file://" else Path(source)).read_bytes()

    def _read_object(self, source: str) -> bytes:
        from ..errors import HyocrError

        scheme, _, rest = source.partition("://")
        bucket, _, key = rest.partition("/")  # as the listing named it (checked when its prefix was parsed)
        try:
            return self.store.read_sync(ObjectUri(scheme.lower(), bucket, key), max_bytes=self.max_bytes)
        except HyocrError as exc:  # missing, too large, the store refused or cannot be reached
            raise OSError(exc.message) from None


def local_path(uri: str) -> Path:
    """``file:///abs/path`` (or ``file://localhost/...``, percent-encoded as ``Path.as_uri`` writes it) ->
    the path. Raises SourceError for another host, a query or a fragment."""
    parts = urlsplit(uri)
    local = parts.netloc in ("", "localhost") and parts.path.startswith("/")
    if not local or parts.query or parts.fragment:
        raise SourceError(f"{redacted(uri)}: a file:// URI names a local path: file:///abs/path")
    return Path(unquote(parts.path))


def _files(root: Path) -> list[tuple[str, str, Callable[[], bytes]]]:
    """The file ``root`` names, or the files below it (hidden ones skipped), as ``_objects`` gives them."""
    if root.is_file():
        return [(root.as_uri(), root.name, functools.partial(_file_head, root))]
    if not root.is_dir():
        raise SourceError(f"{root.as_uri()}: no such object or prefix")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            path = Path(dirpath) / name
            if not name.startswith(".") and path.is_file():
                found.append((path.as_uri(), path.relative_to(root).as_posix(),
                              functools.partial(_file_head, path)))
    return found


def _file_head(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(HEAD_BYTES)


def _walk_order(rel: str) -> tuple[tuple[str, ...], str]:
    """A folder's order (os.walk, sorted): a prefix's own objects, then each sub-prefix's in turn."""
    *folders, name = rel.split("/")
    return tuple(folders), name
