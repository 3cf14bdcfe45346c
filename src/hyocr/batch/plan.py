"""What a batch reads: INPUTs (files, folders, globs, ``.jsonl`` manifests, object-store URIs) expanded to
documents, each with a stable key and output name, and the options it is read with. No I/O beyond listing
and sniffing."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .jsontext import utf8
from .sources import Sources, is_uri

# Read from folders (and from globs that match folders): these extensions, or these first bytes.
DOCUMENT_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".webp", ".gif", ".tif", ".tiff", ".bmp", ".jp2",
                                 ".j2k", ".pdf"})
_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"II*\x00", b"MM\x00*", b"%PDF-")
# A manifest line's keys beside "path": options for that document only.
OPTION_KEYS = ("task", "fields", "language", "question", "pages", "prefer_text_layer")
# Kept in output names: letters and digits of any script (发票.pdf stays 发票.pdf), '.', '-', '_'.
_NAME_CHARS = re.compile(r"[^\w.-]+")
NAME_BYTES = 120  # of a name's stem in UTF-8: with its hash, well within a file system's 255 bytes
SHOWN_CHARS = 200  # of a value quoted in an error message (a manifest's path may be megabytes long)


class PlanError(Exception):
    """An INPUT that cannot be expanded (missing, a bad manifest line): the batch does not start."""


def shown(value: object) -> str:
    """``value`` for an error message: at most SHOWN_CHARS of it, on one line."""
    text = value if isinstance(value, str) else repr(value)
    short = text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in short)  # a NUL, a newline: escaped


@dataclass(frozen=True, slots=True)
class Document:
    path: Path  # absolute; for a URI, the object's path in its filesystem (bucket/key)
    rel: str  # the path relative to its INPUT's root (a folder, a glob's fixed part, a manifest's folder)
    overrides: Mapping[str, Any] = field(default_factory=dict)  # a manifest line's options
    uri: str | None = None  # s3://, gs://, file://: listed and read by sources.py

    @property
    def source(self) -> str:
        """Where it is read from: its absolute path, or its URI."""
        return self.uri or str(self.path)

    @property
    def key(self) -> str:
        """Names the document in the state file: its source, and its own options if it has any (so a
        manifest may list one file twice with different tasks)."""
        if not self.overrides:
            return self.source
        return f"{self.source}?{json.dumps(dict(self.overrides), sort_keys=True, ensure_ascii=False)}"

    def read(self, sources: Sources | None = None) -> bytes:
        """Its bytes (an object's through ``sources``). Raises OSError when it cannot be read."""
        return (sources or Sources()).read(self.source)

    @property
    def name(self) -> str:
        """Its output file: the relative path made safe, and a short hash of the key (unique, stable)."""
        rel = unicodedata.normalize("NFC", self.rel)  # macOS spells accents apart
        stem = _NAME_CHARS.sub("_", rel.replace(os.sep, "__").replace("/", "__")).strip("._") or "doc"
        stem = stem.encode("utf-8", "replace")[:NAME_BYTES].decode("utf-8", "ignore")  # whole characters
        return f"{stem}-{hashlib.sha256(utf8(self.key)).hexdigest()[:10]}.json"

    def options(self, defaults: Mapping[str, Any]) -> dict[str, Any]:
        return {**defaults, **self.overrides}

    def below(self, where: Path | str) -> bool:
        """In the (resolved) folder ``where``, or below the URI prefix ``where``."""
        if isinstance(where, str):
            return self.source.startswith(where)
        return self.path.is_absolute() and self.path.is_relative_to(where)  # an object's path is bucket/key


def options_fingerprint(options: Mapping[str, Any]) -> str:
    """A short hash of the options a document is read with: a rerun with other options reads it again."""
    canonical = json.dumps({k: v for k, v in options.items() if v not in (None, False, ())}, sort_keys=True,
                           default=list)
    return hashlib.sha256(utf8(canonical)).hexdigest()[:16]


def is_document(path: Path) -> bool:
    """An image or a PDF, by its extension or else its first bytes."""
    return looks_like_document(path.name, lambda: _head(path))


def _head(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(16)


def looks_like_document(name: str, head: Callable[[], bytes]) -> bool:
    """``is_document`` for a file or an object: ``head`` reads its first bytes (only without an extension)."""
    if Path(name).suffix.lower() in DOCUMENT_EXTENSIONS:
        return True
    try:
        first = head()
    except OSError:
        return False
    return first.startswith(_MAGIC) or (first[:4] == b"RIFF" and first[8:12] == b"WEBP")


def expand(inputs: Iterable[str | Path], *, exclude: Path | str | Iterable[Path | str] = (),
           sources: Sources | None = None) -> list[Document]:
    """Documents in INPUT order (a folder's and a glob's sorted), each once (the first mention wins).
    ``exclude``: folders and URI prefixes never read (the output, the batch's state); ``sources``: how
    URIs are listed (pipeline/objects.py's policy and endpoint)."""
    found: dict[str, Document] = {}
    skip = [e.resolve() if isinstance(e, Path) else e
            for e in ((exclude,) if isinstance(exclude, Path | str) else exclude)]
    sources = sources or Sources()
    for given in inputs:
        for doc in _expand_one(str(given), {}, sources):
            if not any(map(doc.below, skip)):
                found.setdefault(doc.key, doc)
    return list(found.values())


def _expand_one(given: str, overrides: Mapping[str, Any], sources: Sources) -> Iterable[Document]:
    if is_uri(given):
        yield from _objects(given, overrides, sources)
        return
    path = Path(given).expanduser()
    if path.is_file() and path.suffix.lower() == ".jsonl" and not overrides:
        yield from _manifest(path, sources)
    elif path.is_dir():
        yield from _folder(path, overrides)
    elif path.is_file():
        yield Document(path.resolve(), path.name, overrides)
    elif glob.has_magic(given):
        root = _glob_root(given)
        matches = sorted(glob.glob(os.path.expanduser(given), recursive=True))
        if not matches:
            raise PlanError(f"{shown(given)}: no file matches")
        for match in map(Path, matches):
            if match.is_dir():
                yield from _folder(match, overrides, root)
            elif match.is_file():
                yield Document(match.resolve(), _rel(match, root), overrides)
    elif os.path.lexists(path):
        raise PlanError(f"{shown(given)}: {_not_a_file(path)}")
    else:
        raise PlanError(f"{shown(given)}: no such file or folder")


def _not_a_file(path: Path) -> str:
    """Why a name that exists is not read: a link to nothing, or not a regular file (a FIFO, a socket)."""
    return "a link to a missing file" if path.is_symlink() and not path.exists() else "not a regular file"


def _folder(folder: Path, overrides: Mapping[str, Any], root: Path | None = None) -> Iterable[Document]:
    """The documents below ``folder``. Names that look like documents but cannot be read as files (a dangling
    link, a FIFO) are said on stderr, not dropped in silence; other files that are not documents are skipped."""
    root = root or folder
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.startswith("."):
                continue
            if path.is_file():
                if is_document(path):
                    yield Document(path.resolve(), _rel(path, root), overrides)
            elif Path(name).suffix.lower() in DOCUMENT_EXTENSIONS:  # a FIFO's first bytes are not read
                print(f"hyocr batch: skipped {shown(os.fsdecode(path))}: {_not_a_file(path)}", file=sys.stderr)


def _objects(uri: str, overrides: Mapping[str, Any], sources: Sources) -> Iterable[Document]:
    """The object a URI names, or the documents below it as a folder's (no globs: list a prefix)."""
    from .sources import SourceError, local_path

    try:
        found = list(sources.list(uri, looks_like_document))
    except SourceError as exc:
        raise PlanError(str(exc)) from None
    for object_uri, rel in found:
        local = object_uri.startswith("file://")
        path = local_path(object_uri) if local else Path(object_uri.partition("://")[2])
        yield Document(path, rel, overrides, uri=object_uri)


def _glob_root(pattern: str) -> Path:
    """The folder above a glob's first wildcard: names are relative to it."""
    parts = Path(os.path.expanduser(pattern)).parts
    fixed = list(_takewhile_fixed(parts))
    return Path(*fixed) if fixed else Path(".")


def _takewhile_fixed(parts: tuple[str, ...]) -> Iterable[str]:
    for part in parts[:-1]:
        if glob.has_magic(part):
            return
        yield part


def _rel(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.name


def _manifest(manifest: Path, sources: Sources, within: tuple[Path, ...] = ()) -> Iterable[Document]:
    """One JSON object a line: ``{"path": ..., "task": ..., "pages": ...}``; paths relative to the manifest's
    folder; blank lines and lines starting with # are skipped. Any line that is not so (not UTF-8, not JSON,
    an option of the wrong type, a path that cannot be) stops the plan with ``FILE:LINE: why``. A line may
    name another manifest (``within``: those being read, so that none includes itself)."""
    base, within = manifest.parent, (*within, manifest.resolve())
    with manifest.open("rb") as f:
        for number, raw in enumerate(f, 1):
            where = f"{shown(str(manifest))}:{number}"
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise PlanError(f"{where}: not UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})") from None
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                entry = json.loads(line)
            except ValueError as exc:
                raise PlanError(f"{where}: not JSON ({shown(str(exc))})") from None
            except RecursionError:
                raise PlanError(f"{where}: not JSON (nested too deeply)") from None
            if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or not entry["path"]:
                raise PlanError(f'{where}: expected an object with "path" (a file, folder, glob or URI)')
            if unknown := set(entry) - {"path", *OPTION_KEYS}:
                raise PlanError(f"{where}: unknown key(s) {shown(', '.join(sorted(unknown)))}")
            overrides = _line_options(entry, where)
            try:
                yield from _line_documents(entry["path"], overrides, base, where, sources, within)
            except (OSError, ValueError) as exc:  # a name too long, a NUL byte, a lone surrogate
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise PlanError(f"{where}: {shown(entry['path'])}: {shown(why)}") from None


def _line_documents(given: str, overrides: Mapping[str, Any], base: Path, where: str, sources: Sources,
                    within: tuple[Path, ...]) -> Iterable[Document]:
    if is_uri(given):
        yield from _expand_one(given, overrides, sources)
        return
    target = Path(given).expanduser()
    target = target if target.is_absolute() else base / target
    if not target.exists() and not glob.has_magic(str(target)):
        raise PlanError(f"{where}: {shown(given)}: no such file or folder")
    if target.is_file() and target.suffix.lower() == ".jsonl" and not overrides:
        if target.resolve() in within:
            raise PlanError(f"{where}: {shown(given)}: a manifest that includes itself")
        yield from _manifest(target, sources, within)
        return
    for doc in _expand_one(str(target), overrides, sources):
        yield Document(doc.path, _rel(doc.path, base) if doc.path.is_relative_to(base.resolve())
                       else doc.rel, doc.overrides)


_TEXT_OPTIONS = ("task", "language", "question")


def _line_options(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A line's options, checked as the command line's are (a task this build knows, a page selection);
    ``pages`` may be a number."""
    from ..errors import HyocrError
    from ..hunyuan.prompts import parse_task
    from .pages import check as check_pages

    options = {k: v for k, v in entry.items() if k != "path" and v is not None}
    for key, value in options.items():
        if key in _TEXT_OPTIONS and not isinstance(value, str):
            raise PlanError(f"{where}: {key} must be a string, not {shown(value)}")
        if key == "fields" and not (isinstance(value, str) or (
                isinstance(value, list) and all(isinstance(f, str) for f in value))):
            raise PlanError(f"{where}: fields must be a string or a list of strings, not {shown(value)}")
        if key == "prefer_text_layer" and not isinstance(value, bool):
            raise PlanError(f"{where}: prefer_text_layer must be true or false, not {shown(value)}")
        if key == "pages" and (isinstance(value, bool) or not isinstance(value, str | int)):
            raise PlanError(f"{where}: pages must be a string such as \"1-3,8\" or a page number, not "
                            f"{shown(value)}")
    if isinstance(options.get("pages"), int):
        options["pages"] = str(options["pages"])
    try:
        if "task" in options:
            parse_task(options["task"])
        check_pages(options.get("pages"))
    except HyocrError as exc:
        raise PlanError(f"{where}: {shown(exc.message)}") from None
    return options
