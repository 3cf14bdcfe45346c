"""Documents behind a URI (``s3://bucket/prefix/``, ``gs://bucket/...``, ``file:///...``): listed and read
through pyarrow.fs, the filesystem layer Ray Data reads with, so the driver and the Ray tasks see the same
objects. Credentials come from the environment, as pyarrow takes them (AWS_*, GOOGLE_APPLICATION_CREDENTIALS).
An object's URI is its scheme and its path in that filesystem (``s3://`` + ``bucket/key``)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class SourceError(Exception):
    """A URI that cannot be listed (the message says why)."""


def is_uri(given: str) -> bool:
    return bool(_SCHEME.match(given))


def _pafs() -> Any:
    try:
        import pyarrow.fs as pafs
    except ImportError:
        raise SourceError('reading URIs needs pyarrow: pip install pyarrow (or "hyocr[ray]")') from None
    return pafs


@functools.lru_cache(maxsize=64)
def _filesystem(scheme: str, bucket: str) -> Any:
    """One filesystem per scheme and bucket: making an S3 one may ask the network for the bucket's region."""
    fs, _ = _pafs().FileSystem.from_uri(f"{scheme}://{bucket}/")
    return fs


def _resolve(uri: str) -> tuple[Any, str, str]:
    """(the filesystem, the object's path in it, its scheme)."""
    scheme, _, path = uri.partition("://")
    bucket = "" if scheme == "file" else path.split("/", 1)[0]
    try:
        return _filesystem(scheme, bucket), path.rstrip("/") or "/", scheme
    except (ValueError, OSError) as exc:  # ArrowInvalid (a ValueError): an unknown scheme; OSError: no store
        raise SourceError(f"{uri}: {exc}") from None


def list_uri(uri: str, wanted: Callable[[str, Callable[[], bytes]], bool]) -> Iterator[tuple[str, str]]:
    """(object URI, its path relative to ``uri``) of the object ``uri`` names, or of each object below it,
    sorted, that ``wanted`` accepts (given its name and a function that reads its first bytes). Hidden
    names (".x") are skipped below a prefix, as in a folder."""
    pafs = _pafs()
    fs, root, scheme = _resolve(uri)
    try:
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.File:
            found = [(info, info.base_name)]
        elif info.type == pafs.FileType.Directory:
            below = fs.get_file_info(pafs.FileSelector(root, recursive=True))
            found = [(e, e.path[len(root):].lstrip("/")) for e in below if e.type == pafs.FileType.File]
            found = [(e, rel) for e, rel in found if not any(p.startswith(".") for p in rel.split("/"))]
        else:
            raise SourceError(f"{uri}: no such object or prefix")
    except OSError as exc:
        raise SourceError(f"{uri}: {exc}") from None
    for entry, rel in sorted(found, key=lambda pair: _walk_order(pair[1])):
        if wanted(entry.base_name, functools.partial(_head, fs, entry.path)):
            yield f"{scheme}://{entry.path}", rel


def _walk_order(rel: str) -> tuple[tuple[str, ...], str]:
    """A folder's order (os.walk, sorted): a prefix's own objects, then each sub-prefix's in turn."""
    *folders, name = rel.split("/")
    return tuple(folders), name


def _head(fs: Any, path: str) -> bytes:
    with fs.open_input_stream(path) as stream:
        return stream.read(16)


def read_source(source: str) -> bytes:
    """A document's bytes from its source (``Document.source``): a URI, or a local path."""
    return read_uri(source) if is_uri(source) else Path(source).read_bytes()


def read_uri(uri: str) -> bytes:
    """The object's bytes. Raises OSError, as reading a local file does, when it cannot be read."""
    try:
        fs, path, _ = _resolve(uri)
    except SourceError as exc:
        raise OSError(str(exc)) from None
    with fs.open_input_stream(path) as stream:
        return stream.readall()
