"""Where a batch writes: a local folder (``--output DIR``) or an object-store prefix (``--output
s3://bucket/prefix/``, ``gs://...``), with each document's JSON result, ``summary.json`` and the ``--table``
file under the same names either way, each written whole (a temp file renamed; an object PUT, atomic by
nature). The batch's state (the state file, the pages of a PDF read so far) needs appends and fsync, so it
is kept in a local folder: DIR itself, or for a prefix ``--state-dir``, by default a folder of its own under
~/.cache/hyocr/batch/ named after the prefix and the endpoint, so a rerun of the same command resumes.

A result the store refuses (AccessDenied, a missing bucket) is that document's failure, and its body is kept
in the state folder (``.hyocr-unsent/``, tagged with the content and options it was read from): the next run
writes it without reading the document again (``kept``), whatever attempts it has left, as attempts count
reads. A summary the store refuses is kept there too (the state folder always has the last one).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from ..jobs.codec import json_text
from ..pipeline.objects import ObjectStore, ObjectUri, ObjectWriteError, is_object_uri, store_endpoint
from .jsontext import utf8
from .plan import PlanError
from .sources import Sources, is_uri, local_path, redacted
from .state import TEMP_PREFIX, write_atomic

SUMMARY = "summary.json"
UNSENT_DIR = ".hyocr-unsent"
READERS = 8  # outputs read back at once from a store (the --table of a prefix)
MAX_OUTPUT_BYTES = 1 << 30  # an output read back: a document's JSON result, large for a long PDF


class OutputError(Exception):
    """An output the store refused: the message names the object and gives the store's reason."""


class Output(Protocol):
    where: str  # the folder or the prefix, as the summary and messages say it
    state_dir: Path  # the local folder of the batch's state
    excluded: tuple[Path | str, ...]  # never read as INPUTs: the output and the state
    folders: tuple[Path, ...]  # the local folders written (where an interrupted run may leave temp files)

    def open(self) -> None: ...
    def present(self, name: str) -> bool: ...
    def write(self, name: str, body: Any) -> None: ...
    def bodies(self, names: Iterable[str]) -> Iterator[Any]: ...
    def write_file(self, name: str, make: Callable[[Path], None], content_type: str) -> str: ...
    def write_summary(self, summary: dict[str, Any]) -> str: ...


def open_output(given: str, state_dir: Path | None, sources: Sources) -> Output:
    """``--output`` (a folder, ``file://``, ``s3://``, ``gs://``), parsed as strictly as an INPUT URI.
    Raises PlanError."""
    from ..errors import HyocrError
    from .sources import SourceError

    if is_object_uri(given):
        try:
            prefix = sources.store.checked(given, param="--output", prefix=True)
        except HyocrError as exc:
            raise PlanError(f"--output {redacted(given)}: {exc.message}") from None
        state_dir = state_dir or default_state_dir(prefix, store_endpoint(prefix.scheme, sources.policy))
        return ObjectOutput(sources.store, prefix, state_dir)
    if given[:7].lower() == "file://":
        try:
            return LocalOutput(local_path(given), state_dir)
        except SourceError as exc:
            raise PlanError(f"--output {exc}") from None
    if is_uri(given):
        raise PlanError(f"--output {redacted(given)}: a folder, or an s3:// or gs:// prefix")
    return LocalOutput(Path(given).expanduser(), state_dir)


def default_state_dir(prefix: ObjectUri, endpoint: str | None) -> Path:
    """The same folder for the same prefix on the same store (endpoint): a rerun finds its state there."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(utf8(f"{endpoint or ''}\n{prefix}")).hexdigest()[:16]
    return cache / "hyocr" / "batch" / f"{prefix.bucket}-{digest}"


class LocalOutput:
    """``DIR``: outputs written as files through a temp file and a rename; the state in DIR unless
    ``--state-dir`` names another folder."""

    def __init__(self, folder: Path, state_dir: Path | None = None) -> None:
        self.folder = folder
        self.state_dir = state_dir or folder
        self.where = str(folder)
        self.excluded = self.folders = tuple(dict.fromkeys((folder, self.state_dir)))

    def open(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)

    def present(self, name: str) -> bool:
        return (self.folder / name).is_file()

    def write(self, name: str, body: Any) -> None:
        write_atomic(self.folder / name, body)

    def bodies(self, names: Iterable[str]) -> Iterator[Any]:
        for name in names:
            yield json.loads((self.folder / name).read_text(encoding="utf-8"))

    def write_file(self, name: str, make: Callable[[Path], None], content_type: str) -> str:
        path = self.folder / name
        temp = path.with_name(f"{TEMP_PREFIX}{name}.{os.getpid()}")
        make(temp)
        os.replace(temp, path)
        return str(path)

    def write_summary(self, summary: dict[str, Any]) -> str:
        self.write(SUMMARY, summary)
        return str(self.folder / SUMMARY)


class ObjectOutput:
    """``s3://bucket/prefix/``: outputs written as objects below the prefix; the state in ``state_dir``. Which
    outputs exist is listed once, when the run opens (a rerun reads again a document whose output is gone)."""

    def __init__(self, store: ObjectStore, prefix: ObjectUri, state_dir: Path) -> None:
        self.store, self.prefix, self.state_dir = store, prefix, state_dir
        self.where = str(prefix)
        self.excluded, self.folders = (str(prefix), state_dir), (state_dir,)
        self._names: set[str] | None = set()

    def open(self) -> None:
        from ..errors import HyocrError

        self.state_dir.mkdir(parents=True, exist_ok=True)
        try:
            listed = self.store.list_sync(self.prefix, recursive=False)
        except HyocrError as exc:  # a store that cannot be listed now: the state file's word is taken
            print(f"hyocr: {exc.message}; the documents the state file records as done are taken as written",
                  file=sys.stderr)
            self._names = None
            return
        self._names = {uri.key.rpartition("/")[2] for uri, _size in listed}

    def present(self, name: str) -> bool:
        return self._names is None or name in self._names

    def write(self, name: str, body: Any) -> None:
        self._put(name, json_text(body, indent=1).encode(), "application/json")

    def _put(self, name: str, data: bytes, content_type: str) -> None:
        try:
            self.store.write_sync(self.prefix.child(name), data, content_type)
        except ObjectWriteError as exc:  # "<uri> could not be written: <the store's reason>"
            raise OutputError(str(exc)) from None
        if self._names is not None:
            self._names.add(name)

    def bodies(self, names: Iterable[str]) -> Iterator[Any]:
        """The outputs' bodies in order, READERS read at once, a window of them held at a time."""
        with ThreadPoolExecutor(READERS, thread_name_prefix="hyocr-outputs") as pool:
            window: list[str] = []
            for name in names:
                window.append(name)
                if len(window) == 8 * READERS:
                    yield from pool.map(self._body, window)
                    window = []
            yield from pool.map(self._body, window)

    def _body(self, name: str) -> Any:
        from ..errors import HyocrError

        try:
            return json.loads(self.store.read_sync(self.prefix.child(name), max_bytes=MAX_OUTPUT_BYTES))
        except HyocrError as exc:
            raise OutputError(exc.message) from None

    def write_file(self, name: str, make: Callable[[Path], None], content_type: str) -> str:
        """Made in the state folder, then written as one object (whole: a single PUT of its bytes); kept there
        when the store refuses it."""
        temp = self.state_dir / f"{TEMP_PREFIX}{name}.{os.getpid()}"
        try:
            make(temp)
            try:
                self._put(name, temp.read_bytes(), content_type)
            except OutputError as exc:
                os.replace(temp, self.state_dir / name)
                raise OutputError(f"{exc}; it is kept in {self.state_dir / name}") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
        return str(self.prefix.child(name))

    def write_summary(self, summary: dict[str, Any]) -> str:
        write_atomic(self.state_dir / SUMMARY, summary)  # the last run's, whatever the store does
        try:
            self.write(SUMMARY, summary)
        except OutputError as exc:
            raise OutputError(f"{exc}; the summary is kept in {self.state_dir / SUMMARY}") from None
        return str(self.prefix.child(SUMMARY))


# ---------------------------------------------------------------------- results the store refused


def unsent_path(state_dir: Path, name: str) -> Path:
    return state_dir / UNSENT_DIR / name


def keep(state_dir: Path, name: str, tag: dict[str, str], body: Any) -> Path:
    """A result the store refused, kept whole with the content and options it was read from."""
    path = unsent_path(state_dir, name)
    path.parent.mkdir(exist_ok=True)
    write_atomic(path, {**tag, "body": body})
    return path


def kept(state_dir: Path, name: str, tag: dict[str, str]) -> Any | None:
    """The body an earlier run kept for this content and options; one kept for others is dropped."""
    path = unsent_path(state_dir, name)
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError:  # never torn (written whole), but not trusted blindly either
        entry = None
    if isinstance(entry, dict) and {k: entry.get(k) for k in tag} == tag and "body" in entry:
        return entry["body"]
    forget(state_dir, name)
    return None


def forget(state_dir: Path, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        unsent_path(state_dir, name).unlink()
