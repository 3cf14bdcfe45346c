"""BatchRunner: runs the OpenAI batches stored beside the jobs.

Two kinds of work. Chunks of lines are handed out by the JobRunner's dispatcher, under the same rule as a
job's ranges (JOB_WORKERS at once, only while online traffic leaves room): each line goes through the online
route's own path (``answer``, given by the api layer: its wire models, its conversion, ``OcrService`` at
BACKGROUND priority) and its answer is stored once as it finishes. Whole-batch work (reading the input file
into lines, writing the output and error files, the output URI) runs in a loop of its own: it needs no
engine, and a cancel or an expiry must not wait for the engine to have room.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from ..errors import HyocrError
from ..pipeline.objects import ObjectStore, is_object_uri
from .batch_store import BatchRecord, BatchStore, ChunkClaim, OpenLine
from .batches import MAX_REPORTED, error_line, line_max_bytes, parse_line, split_lines
from .codec import json_bytes
from .exports import export_batch
from .files import FileStore, held_bytes
from .loops import passes

log = logging.getLogger("hyocr.jobs")
PAGE = 500  # lines per query when writing the output files
_ENDINGS = {"cancelled": ("batch_cancelled", "This request was not run: the batch was cancelled."),
            "expired": ("batch_expired",
                        "This request could not be executed before the completion window expired."),
            "completed": ("batch_incomplete", "This request was not run.")}


@dataclass(frozen=True, slots=True)
class Answered:
    """What the endpoint answered a line: its HTTP status, body and request id, and the tokens it used."""

    status_code: int
    body: dict
    request_id: str
    tokens: tuple[int, int] = (0, 0)


LineAnswer = Callable[[str, bytes], Awaitable[Answered]]  # (endpoint, request body JSON) -> the answer


def output_line(custom_id: str, answered: Answered) -> dict:
    """OpenAI's output line; a non-2xx answer also says why in ``error`` (the body's own error)."""
    line = {"id": f"batch_req_{hashlib.sha256(answered.request_id.encode()).hexdigest()[:32]}",
            "custom_id": custom_id,
            "response": {"status_code": answered.status_code, "request_id": answered.request_id,
                         "body": answered.body}, "error": None}
    if not 200 <= answered.status_code < 300:
        error = answered.body.get("error") if isinstance(answered.body, dict) else None
        error = error if isinstance(error, dict) else {}
        line["error"] = {"code": error.get("code") or error.get("type") or "request_failed",
                         "message": error.get("message") or f"HTTP {answered.status_code}"}
    return line


class BatchRunner:
    def __init__(self, store: BatchStore, files: FileStore, objects: ObjectStore, settings, *, replica: str,
                 answer: LineAnswer | None) -> None:
        self.store = store
        self.files = files
        self.objects = objects
        self.settings = settings
        self.replica = replica
        self.answer = answer  # None: this server runs no batch lines (the api layer gave no endpoint path)

    # ------------------------------------------------------------------ chunks (from the dispatcher)

    async def claim(self) -> ChunkClaim | None:
        return None if self.answer is None else await self.store.claim_chunk(self.replica)

    async def run_chunk(self, claim: ChunkClaim) -> None:
        renewing = asyncio.create_task(self._renew_chunk(claim, asyncio.current_task()))
        try:
            if claim.attempts > self.settings.job_max_attempts:  # its replica went down while it ran, each time
                await self._one_at_a_time(claim)
            else:
                ran = await asyncio.gather(*(self._line(claim, line) for line in claim.lines))
                retry = [pair for pair in ran if pair is not None]
                if retry and claim.attempts < self.settings.job_max_attempts:
                    delay = min(60.0, 2.0 ** claim.attempts)
                    log.warning("batch %s: %d lines failed retryably; again in %gs", claim.batch_id,
                                len(retry), delay)
                    await self.store.release_chunk(claim.chunk_id, self.replica,
                                                   not_before=time.time() + delay)
                    return
                for line, answered in retry:  # the last attempt: its answer is the line's
                    await self.store.put_answer(claim.batch_id, line.n, answered.status_code,
                                                output_line(line.custom_id, answered), answered.tokens)
            await self.store.finish_chunk(claim.chunk_id, self.replica)
        except asyncio.CancelledError:  # cancelled batch, lost lease, or stopping: the answers stored stay
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release_chunk(claim.chunk_id, self.replica, tried=False))
            raise
        except Exception:
            log.exception("batch %s chunk %d failed", claim.batch_id, claim.chunk_id)
            await self.store.release_chunk(claim.chunk_id, self.replica, not_before=time.time() + 5)
        finally:
            renewing.cancel()

    async def _one_at_a_time(self, claim: ChunkClaim) -> None:
        """A chunk claimed past its budget: a retryable failure ends on the last attempt, so its replica went down
        while running it, each time. A line that takes the server down must not do so for ever, and the lines
        beside it must not fail with it: the lines run one at a time, each answer kept, so that a crash leaves
        the lines before it answered. Claimed once more, the first open line is the one that was running when the
        server went down again: it alone fails (``crashed_repeatedly``); the rest run."""
        lines = list(claim.lines)
        if claim.attempts > self.settings.job_max_attempts + 1 and lines:
            suspect = lines.pop(0)
            why = (f"this request was not run: its server went down each time it ran ({claim.attempts - 1} times)")
            await self.store.put_answer(claim.batch_id, suspect.n, 0,
                                        error_line(suspect.custom_id, "crashed_repeatedly", why))
        for line in lines:
            answered = await self.answer(claim.endpoint, line.request)  # past the budget: a 5xx is the answer
            await self.store.put_answer(claim.batch_id, line.n, answered.status_code,
                                        output_line(line.custom_id, answered), answered.tokens)

    async def _line(self, claim: ChunkClaim, line: OpenLine) -> tuple[OpenLine, Answered] | None:
        """Run one line and store its answer; a retryable failure (5xx) is returned instead, for the chunk
        to try again later."""
        answered = await self.answer(claim.endpoint, line.request)
        if answered.status_code >= 500:
            return line, answered
        await self.store.put_answer(claim.batch_id, line.n, answered.status_code,
                                    output_line(line.custom_id, answered), answered.tokens)
        return None

    async def _renew_chunk(self, claim: ChunkClaim, reader: asyncio.Task) -> None:
        while True:
            await asyncio.sleep(self.store.lease / 3)
            status = await self.store.renew_chunk(claim.chunk_id, self.replica)
            if status != "in_progress":
                log.info("batch %s chunk %d stops: %s", claim.batch_id, claim.chunk_id,
                         status or "lease lost")
                reader.cancel()
                return

    # ------------------------------------------------------------------ whole-batch work (its own loop)

    async def run(self, poll: float, wake: asyncio.Event, dispatch: asyncio.Event) -> None:
        """Whole-batch work until cancelled: when ``wake`` is set, or every ``poll`` seconds. ``dispatch``
        (the dispatcher's wake) is set when a batch's chunks become claimable."""
        async def one_pass() -> bool:
            worked = False
            while (batch := await self.store.claim_batch(self.replica)) is not None:
                await self._held(batch)
                dispatch.set()
                worked = True
            return worked

        await passes(one_pass, wake, poll, "batch work")

    async def _held(self, batch: BatchRecord) -> None:
        """``_whole`` in a task of its own, which a lost claim cancels (never this loop)."""
        work = asyncio.create_task(self._whole(batch))
        try:
            await work
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # this loop is stopping, not just the work
                raise
            log.info("batch %s: its claim was lost; another replica goes on", batch.id)

    async def _whole(self, batch: BatchRecord) -> None:
        task = asyncio.current_task()

        async def hold() -> None:
            while True:
                await asyncio.sleep(self.store.lease / 3)
                if not await self.store.renew_batch(batch.id, self.replica):
                    task.cancel()
                    return

        holding = asyncio.create_task(hold())
        later = 0.0  # seconds before another try may claim it (a failure's backoff)
        validating = batch.status == "validating"
        try:
            if validating:
                await self._validate(batch)
            else:
                if batch.status == "cancelling" and not batch.total:  # its validation never finished
                    await self._list_cancelled(batch)
                if batch.status == "in_progress":
                    ending = "expired" if batch.expires_at <= time.time() else "completed"
                    await self.store.begin_finalizing(batch.id, self.replica, ending)
                await self._finalize(batch.id)
        except HyocrError as exc:  # the input could not be read now (the object store down): later
            if validating and batch.expires_at <= time.time():
                await self._fail(batch, [{"code": exc.code or "input_unavailable", "message": exc.message,
                                          "param": "input_file_id", "line": None}])
                return
            log.warning("batch %s: %s; again later", batch.id, exc.message)
            later = 10.0
        except Exception:  # a fault of ours: a validation fails the batch, saying so; other work is tried later
            log.exception("batch %s: %s failed", batch.id, "validation" if validating else "work")
            if validating:
                await self._fail(batch, [{"code": "validation_failed", "param": None, "line": None,
                                          "message": f"the input file could not be read (batch {batch.id}: see "
                                          "the server log)"}])
            later = 30.0
        finally:
            holding.cancel()
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release_batch(batch.id, self.replica, after=later))

    async def _validate(self, batch: BatchRecord) -> None:
        """The input file -> lines (requests to run, or error lines), or the batch failed with its errors."""
        await self.store.reset_lines(batch.id)
        uploaded = not is_object_uri(batch.input_file_id)
        if uploaded and await self.files.get(batch.owner, batch.input_file_id) is None:
            why = f"input file {batch.input_file_id} is gone (deleted or expired)"
            await self._fail(batch, [{"code": "file_not_found", "param": "input_file_id", "line": None,
                                      "message": why}])
            return
        seen: dict[str, int] = {}
        errors: list[dict] = []
        rows: list[dict] = []
        numbers: list[int] = []
        try:
            async for n, raw in split_lines(self._input(batch), line_max_bytes(self.settings)):
                if not await self._take(batch, n, raw, numbers, seen, errors, rows):
                    return
        except HyocrError as exc:
            if exc.status >= 500:  # the store is down, not the input bad: tried again later
                raise
            await self._fail(batch, [{"code": exc.code or "invalid_file", "message": exc.message,
                                      "param": "input_file_id", "line": None}])
            return
        await self.store.add_lines(batch.id, rows)
        room = self.settings.job_max_stored_bytes
        held = await held_bytes(batch.owner, self.files, self.store)
        if held > room:  # counted with these lines in: batches created together each passed create's check
            await self._fail(batch, [{"code": "too_many_batch_bytes", "param": "input_file_id", "line": None,
                                      "message": f"your files and the requests of your active batches would hold "
                                      f"{held} bytes, past the {room} bytes kept per caller: create this batch "
                                      "again as others finish"}])
        elif errors:
            await self._fail(batch, errors)
        elif not numbers:
            await self._fail(batch, [{"code": "empty_file", "message": "the input file has no requests",
                                      "param": "input_file_id", "line": None}])
        elif await self.store.start(batch.id, self.replica, numbers=numbers,
                                    chunk_lines=self.settings.job_range_pages):
            log.info("batch %s in progress: %d requests", batch.id, len(numbers))

    async def _list_cancelled(self, batch: BatchRecord) -> None:
        """The lines of a batch cancelled after a crash cut its validation short (the dead validation stored only
        some): read from the input again, each stored closed, batch_cancelled (a bad line as its own error), so
        that every line comes back. None is run or kept as a request; nothing fails the batch (a duplicate
        custom_id, the caller's bytes). An input that cannot be read now (deleted, the store down) leaves the
        lines the dead validation stored: the cancel is not held back for it."""
        code, message = _ENDINGS["cancelled"]
        limit, rows = line_max_bytes(self.settings), []
        try:
            if is_object_uri(batch.input_file_id) or await self.files.get(batch.owner, batch.input_file_id):
                async for n, raw in split_lines(self._input(batch), limit):
                    if len(rows) >= self.settings.batch_max_lines:
                        break
                    line = parse_line(n, raw, batch.endpoint, limit)
                    why = line.error[:2] if line.error is not None else (code, message)
                    rows.append({"n": n, "custom_id": line.custom_id, "status_code": 0,
                                 "answer": error_line(line.custom_id, *why)})
        except HyocrError as exc:
            log.warning("batch %s: cancelled, and its input cannot be read now (%s): its lines as they were stored",
                        batch.id, exc.message)
            return
        if rows:
            await self.store.reset_lines(batch.id)
            for start in range(0, len(rows), 1000):
                await self.store.add_lines(batch.id, rows[start:start + 1000])

    async def _take(self, batch: BatchRecord, n: int, raw: bytes | None, numbers: list[int],
                    seen: dict[str, int], errors: list[dict], rows: list[dict]) -> bool:
        """One input line into ``rows`` (stored in groups); False when the batch failed on it (too many)."""
        numbers.append(n)
        if len(numbers) > self.settings.batch_max_lines:
            cap = self.settings.batch_max_lines
            await self._fail(batch, [{"code": "batch_too_large", "line": n, "param": "input_file_id",
                                      "message": f"the input file has more than {cap} requests: split it"}])
            return False
        line = parse_line(n, raw, batch.endpoint, line_max_bytes(self.settings))
        if line.custom_id is not None:
            if line.custom_id in seen and len(errors) < MAX_REPORTED:
                errors.append({"code": "duplicate_custom_id", "line": n, "param": "custom_id",
                               "message": f"line {n}: custom_id {line.custom_id[:80]!r} is also on line "
                               f"{seen[line.custom_id]}; each request needs its own"})
            seen.setdefault(line.custom_id, n)
        if line.error is not None:
            code, message, _ = line.error
            rows.append({"n": n, "custom_id": line.custom_id, "status_code": 0,
                         "answer": error_line(line.custom_id, code, message)})
        else:
            rows.append({"n": n, "custom_id": line.custom_id, "request": line.request})
        if len(rows) >= 200 or sum(len(r.get("request") or b"") for r in rows) > 16 * 1024**2:
            await self.store.add_lines(batch.id, rows)
            rows.clear()
        return True

    async def _input(self, batch: BatchRecord) -> AsyncIterator[bytes]:
        if is_object_uri(batch.input_file_id):
            yield await self.objects.read(batch.input_file_id, max_bytes=self.settings.file_max_bytes,
                                          param="input_file_id")
            return
        async for part in self.files.parts(batch.input_file_id):
            yield part

    async def _fail(self, batch: BatchRecord, errors: list[dict]) -> None:
        log.info("batch %s failed validation: %s", batch.id, errors[0]["message"])
        await self.store.fail(batch.id, self.replica, errors, self.settings.job_retention)

    async def _finalize(self, batch_id: str) -> None:
        """Every open line answered with the ending's error, the output and error files written (under ids
        made from the batch's, so a finalizer that died half-way is replaced, not doubled), the output URI
        written, then the batch ends."""
        batch = await self.store.get(None, batch_id)
        code, message = _ENDINGS[batch.ending or "completed"]
        if closed := await self.store.close_open_lines(batch.id, code, message):
            log.info("batch %s %s: %d requests not run", batch.id, batch.ending, closed)
        batch = await self.store.get(None, batch_id)
        keep = batch.output_expires_after or self.settings.job_retention
        output = errors = None
        if batch.completed:
            output = await self._file(batch, "output", keep, lambda status: 200 <= status < 300)
        if batch.failed:
            errors = await self._file(batch, "error", keep, lambda status: not 200 <= status < 300)
        export = await export_batch(batch, self.store, self.objects) if batch.output_uri else None
        if await self.store.finish(batch.id, self.replica, output_file_id=output, error_file_id=errors,
                                   export=export, retention=self.settings.job_retention):
            log.info("batch %s %s: %d completed, %d failed", batch.id, batch.ending, batch.completed,
                     batch.failed)

    async def _file(self, batch: BatchRecord, kind: str, keep: float, wanted: Callable[[int], bool]) -> str:
        file_id = f"file-{hashlib.sha256(f'{batch.id}:{kind}'.encode()).hexdigest()[:32]}"

        async def lines() -> AsyncIterator[bytes]:
            after = 0
            while found := await self.store.answers(batch.id, after=after, limit=PAGE):
                yield b"".join(json_bytes(answer) + b"\n"
                               for _, _, status, answer in found if wanted(status))
                after = found[-1][0]

        await self.files.write(owner=batch.owner, filename=f"{batch.id}_{kind}.jsonl", purpose="batch_output",
                               parts=lines(), expires_at=time.time() + keep, file_id=file_id)
        return file_id
