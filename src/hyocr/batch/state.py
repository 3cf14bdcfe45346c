"""A batch's memory: ``.hyocr-batch.jsonl`` in its state folder (DIR, or outputs.py's for an object
prefix), append-only JSON lines (the last line of a document wins), and the decision it gives a rerun for
each document (``decide``). Outputs are written atomically."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ..jobs.codec import json_text
from .jsontext import utf8


STATE_FILE = ".hyocr-batch.jsonl"
TEMP_PREFIX = ".hyocr-tmp-"
RUN_FILE = ".hyocr-batch-run"  # the folder's id: its --url jobs' idempotency keys are its own


@dataclass(frozen=True, slots=True)
class Record:
    """One line of the state file."""

    key: str  # Document.key
    sha256: str  # the file's content
    options: str  # options_fingerprint of what it was read with
    status: Literal["submitted", "done", "failed"]  # submitted: a job exists (--url), not finished here
    attempts: int  # attempts so far, this one included
    output: str  # the output's name in DIR (or below the output prefix)
    job_id: str | None = None
    pages: int | None = None  # done: pages in the result
    failed_pages: int | None = None  # done: those of them that are error pages (a rerun's summary counts them)
    error: str | None = None  # failed: why
    at: float = 0.0  # when (Unix time)


@dataclass(frozen=True, slots=True)
class Decision:
    action: Literal["skip", "read", "give_up"]  # skip: done before; give_up: out of attempts
    attempt: int  # the attempt this run makes (read), or the attempts made (skip, give_up)
    output: str  # the output name: the one recorded first, so a document never gets two
    job_id: str | None = None  # --url: the job an interrupted run submitted (re-attached by its key)
    record: Record | None = None

    def idempotency_key(self, key: str, sha256: str, options: str, run: str = "") -> str:
        """The same for the same document, content, options and attempt in one state folder (``run``): a rerun
        after an interruption gets the job already submitted; a retry after a failure (the next attempt), or
        another folder, a new one (without ``run``, an evaluation into a fresh folder got an earlier one's
        jobs back, read by whatever engine the server had then)."""
        text = f"{key}\n{sha256}\n{options}\n{self.attempt}"
        digest = hashlib.sha256(utf8(f"{run}\n{text}" if run else text)).hexdigest()
        return f"hyocr-batch-{digest[:40]}"


def decide(record: Record | None, *, name: str, sha256: str, options: str, present: Callable[[str], bool],
           max_attempts: int) -> Decision:
    """What this run does with a document, given its last record (None: never seen); ``present``: whether
    an output of that name is there (in DIR, below the output prefix)."""
    if record is None:
        return Decision("read", 1, name)
    output = record.output or name
    if record.sha256 != sha256 or record.options != options:  # changed since: a new document
        return Decision("read", 1, output)
    if record.status == "done":
        if present(output):
            return Decision("skip", record.attempts, output, record.job_id, record)
        return Decision("read", record.attempts + 1, output)  # its output was removed: read it again
    if record.status == "submitted":  # interrupted while its job ran: the same attempt, the same job
        return Decision("read", record.attempts, output, record.job_id, record)
    if record.attempts >= max_attempts:
        return Decision("give_up", record.attempts, output, record.job_id, record)
    return Decision("read", record.attempts + 1, output)


def _run_id(path: Path, *, begun: bool) -> str:
    """This state folder's own id, made once (its jobs' idempotency keys); "" for a folder begun before
    there were ids, so that its interrupted run re-attaches to the jobs it submitted."""
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().strip()
    if begun:
        return ""
    run_id = uuid.uuid4().hex
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}.{os.getpid()}")
    temp.write_text(run_id + "\n")
    os.replace(temp, path)
    return run_id


class StateFile:
    """The state file, locked for this run (one batch per DIR at a time); appends are flushed and synced
    one line each, so an interruption loses at most the line being written (a torn line is skipped)."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / STATE_FILE
        self.records = load(self.path)
        self.run_id = _run_id(out_dir / RUN_FILE, begun=bool(self.records))
        self._file = self.path.open("a+b")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise RuntimeError(f"another hyocr batch is writing {out_dir}") from None
        self._file.seek(0, os.SEEK_END)
        if self._file.tell():
            self._file.seek(-1, os.SEEK_END)
            if self._file.read(1) != b"\n":  # a torn last line: the next record starts on its own line
                self._write(b"\n")

    def append(self, record: Record) -> None:
        record = Record(**{**asdict(record), "at": record.at or round(time.time(), 3)})
        self.records[record.key] = record
        self._write(json_text(asdict(record)).encode() + b"\n")

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def load(path: Path) -> dict[str, Record]:
    """The last record of each document; lines that do not parse (a torn write) are skipped."""
    records: dict[str, Record] = {}
    with contextlib.suppress(FileNotFoundError), path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = Record(**json.loads(line))
            except (ValueError, TypeError):
                continue
            records[record.key] = record
    return records


def write_atomic(path: Path, data: Any) -> None:
    """JSON to ``path`` through a temp file and ``os.replace``: readers see the old file or the whole new
    one, never a part."""
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}.{os.getpid()}")
    with temp.open("w", encoding="utf-8") as f:
        f.write(json_text(data, indent=1))
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def clean_temps(out_dir: Path) -> None:
    """Temp files an interrupted run left (never outputs: they are only ever whole)."""
    for temp in out_dir.glob(f"{TEMP_PREFIX}*"):
        with contextlib.suppress(OSError):
            temp.unlink()
