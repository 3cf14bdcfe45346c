"""BatchStore and FileStore on a real SQLite file: the guarantees batches rest on (a chunk held by one
replica, a line answered once, a dead replica's chunk freed by its lease with only its open lines, nothing
answered after a batch was closed), without a server."""

from __future__ import annotations

import asyncio
import time

from hyocr.jobs.batch_store import BatchStore
from hyocr.jobs.files import PART, FileStore
from hyocr.jobs.store import JobStore


async def _stores(tmp_path, lease: float = 30.0) -> tuple[BatchStore, FileStore]:
    jobs = JobStore(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}", lease=lease)
    await jobs.open()
    return BatchStore(jobs.engine, lease=lease), FileStore(jobs.engine, None)


async def _batch(store: BatchStore, lines: int = 5, chunk: int = 2) -> str:
    batch = await store.create(owner="alice", endpoint="/v1/ocr", input_file_id="file-x", completion_window="24h",
                               metadata=None, output_uri=None, output_expires_after=None, window=86400)
    assert (await store.claim_batch("validator")).id == batch.id
    await store.add_lines(batch.id, [{"n": n, "custom_id": f"c{n}", "request": b"{}"} for n in range(1, lines + 1)])
    assert await store.start(batch.id, "validator", numbers=list(range(1, lines + 1)), chunk_lines=chunk)
    await store.release_batch(batch.id, "validator")
    return batch.id


def _run(test, tmp_path, lease: float = 30.0) -> None:
    """``test(batches, files)`` on fresh stores, their database closed after (no aiosqlite thread left)."""
    async def go():
        store, files = await _stores(tmp_path, lease)
        try:
            await test(store, files)
        finally:
            await store.engine.dispose()
    asyncio.run(go())


def _answer(n: int) -> dict:
    return {"id": f"batch_req_{n}", "custom_id": f"c{n}", "response": {"status_code": 200}, "error": None}


def test_a_chunk_has_one_holder_and_a_line_is_answered_once(tmp_path):
    async def go(store, _files):
        batch_id = await _batch(store)
        first, second = await asyncio.gather(store.claim_chunk("a"), store.claim_chunk("b"))
        assert first.chunk_id != second.chunk_id  # two replicas, two different chunks
        assert [line.n for line in first.lines] == [1, 2]
        assert await store.put_answer(batch_id, 1, 200, _answer(1), (3, 4))
        assert not await store.put_answer(batch_id, 1, 200, _answer(1))  # a second answer is a no-op
        batch = await store.get("alice", batch_id)
        assert (batch.total, batch.completed, batch.failed, batch.prompt_tokens) == (5, 1, 0, 3)
        assert await store.get("bob", batch_id) is None
    _run(go, tmp_path)


def test_a_dead_replicas_chunk_is_run_again_for_its_open_lines_only(tmp_path):
    async def go(store, _files):
        batch_id = await _batch(store, lines=3, chunk=3)
        held = await store.claim_chunk("dead")
        await store.put_answer(batch_id, 2, 200, _answer(2))  # it answered one line, then died
        assert await store.claim_chunk("alive") is None  # its lease still runs
        await asyncio.sleep(0.4)
        again = await store.claim_chunk("alive")
        assert again.chunk_id == held.chunk_id and [line.n for line in again.lines] == [1, 3]
        assert again.attempts == 2
        assert await store.renew_chunk(held.chunk_id, "dead") is None  # the dead one lost it
    _run(go, tmp_path, lease=0.3)


def test_closing_a_batch_answers_its_open_lines_and_a_late_answer_is_dropped(tmp_path):
    async def go(store, _files):
        batch_id = await _batch(store, lines=4)
        late = await store.claim_chunk("slow")
        await store.put_answer(batch_id, 1, 200, _answer(1))
        assert await store.cancel("alice", batch_id)
        assert not await store.cancel("alice", batch_id)  # once
        assert await store.renew_chunk(late.chunk_id, "slow") == "cancelling"  # it stops at its next renewal
        assert await store.close_open_lines(batch_id, "batch_cancelled", "not run") == 3
        assert not await store.put_answer(batch_id, 2, 200, _answer(2))  # too late: answered as cancelled
        rows = await store.answers(batch_id, after=0, limit=10)
        assert [(n, status) for n, _, status, _ in rows] == [(1, 200), (2, 0), (3, 0), (4, 0)]
        assert rows[1][3]["error"]["code"] == "batch_cancelled" and rows[1][3]["response"] is None
        assert await store.claim_chunk("slow") is None  # every chunk closed
    _run(go, tmp_path)


def test_closing_more_lines_than_one_group_answers_each_once(tmp_path, monkeypatch):
    from hyocr.jobs import batch_store

    monkeypatch.setattr(batch_store, "CLOSE_GROUP", 7)  # closed a group a transaction

    async def go(store, _files):
        batch_id = await _batch(store, lines=30, chunk=10)
        await store.put_answer(batch_id, 5, 200, _answer(5))
        assert await store.cancel("alice", batch_id)
        assert await store.close_open_lines(batch_id, "batch_cancelled", "not run") == 29
        assert await store.close_open_lines(batch_id, "batch_cancelled", "not run") == 0  # nothing open is left
        rows = await store.answers(batch_id, after=0, limit=100)
        assert [n for n, *_ in rows] == list(range(1, 31)) and rows[4][2] == 200
        closed = [answer for n, _, status, answer in rows if status == 0]
        assert len({a["id"] for a in closed}) == 29 and {a["custom_id"] for a in closed} == {
            row[1] for row in rows if row[0] != 5}
    _run(go, tmp_path)


def test_a_validation_that_died_half_way_starts_again_from_nothing(tmp_path):
    async def go(store, _files):
        batch = await store.create(owner="alice", endpoint="/v1/ocr", input_file_id="file-x",
                                   completion_window="24h", metadata={"k": "v"}, output_uri=None,
                                   output_expires_after=None, window=86400)
        assert (await store.claim_batch("dead")).status == "validating"
        await store.add_lines(batch.id, [{"n": 1, "custom_id": "a", "request": b"{}"}])
        assert await store.claim_batch("alive") is None
        await asyncio.sleep(0.4)
        assert (await store.claim_batch("alive")).id == batch.id
        await store.reset_lines(batch.id)
        assert await store.answers(batch.id, after=0, limit=10) == []
        assert not await store.start(batch.id, "dead", numbers=[1], chunk_lines=1)  # no longer its claim
    _run(go, tmp_path, lease=0.3)


def test_a_file_is_stored_in_parts_and_read_back_whole(tmp_path):
    async def go(_store, files):
        data = bytes(range(256)) * (PART // 256 * 2 + 3)  # two whole parts and a bit

        async def pieces():
            for i in range(0, len(data), 777_777):
                yield data[i:i + 777_777]

        record = await files.write(owner="alice", filename="x.jsonl", purpose="batch", parts=pieces(),
                                   expires_at=time.time() + 60, count_lines=True)
        assert record.bytes == len(data)
        assert b"".join([p async for p in files.parts(record.id)]) == data
        assert await files.get("bob", record.id) is None and await files.stored("alice") == len(data)
        assert not await files.delete("bob", record.id) and await files.delete("alice", record.id)
        # hidden at once, but its bytes count until its parts are swept (an upload-delete loop passed the quota)
        assert await files.get("alice", record.id) is None and await files.stored("alice") == len(data)
        assert not await files.delete("alice", record.id)  # once
    _run(go, tmp_path)


def test_a_read_begun_before_a_delete_gets_the_whole_file_or_an_error_never_less(tmp_path):
    """DELETE hides a file at once, but a batch's validation or a download already reading it gets every byte
    (the parts outlive the row for DELETE_GRACE); a part swept under a read that outlasted that is NotFound,
    never a silently shorter file (it was: lines lost from a batch whose file was deleted while it was read)."""
    import pytest

    from hyocr.errors import NotFound
    from hyocr.jobs.files import DELETE_GRACE

    async def go(_store, files):
        data = b"x" * (PART * 2 + 10)

        async def pieces():
            yield data

        record = await files.write(owner="alice", filename="x.jsonl", purpose="batch", parts=pieces(),
                                   expires_at=time.time() + 3600)
        reading = files.parts(record.id)
        first = await anext(reading)
        assert await files.delete("alice", record.id)
        assert first + b"".join([p async for p in reading]) == data
        assert await files.sweep(time.time()) == 0  # within the grace
        reading = files.parts(record.id)
        await anext(reading)
        assert await files.sweep(time.time() + DELETE_GRACE + 1) == 1
        with pytest.raises(NotFound, match="deleted while it was read"):
            async for _ in reading:
                pass
        with pytest.raises(NotFound):
            await anext(files.parts(record.id))
    _run(go, tmp_path)


def test_batches_take_turns_for_chunks(tmp_path):
    async def go(store, _files):
        big = await _batch(store, lines=10, chunk=1)
        small = await _batch(store, lines=2, chunk=1)
        claims = [await store.claim_chunk("r") for _ in range(4)]
        assert [c.batch_id for c in claims] == [big, small, big, small]  # not all of the big one first
    _run(go, tmp_path)


def test_a_batch_past_its_window_expires_with_its_unrun_lines_as_batch_expired(tmp_path):
    import json

    from hyocr.config import load_settings
    from hyocr.jobs.batch_runner import Answered, BatchRunner
    from hyocr.pipeline.objects import ObjectStore

    async def answer(endpoint: str, request: bytes) -> Answered:  # the engine's part: not under test here
        return Answered(200, {"object": "ocr.result", "echo": json.loads(request)}, "ocr-1")

    async def go(store, files):
        settings = load_settings(engine="fake", job_range_pages=1)
        runner = BatchRunner(store, files, ObjectStore.from_settings(settings), settings, replica="r", answer=answer)

        async def parts():
            yield "".join(json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/ocr",
                                      "body": {"n": n}}) + "\n" for n in range(3)).encode()

        uploaded = await files.write(owner="alice", filename="in.jsonl", purpose="batch", parts=parts(),
                                     expires_at=None, count_lines=True)
        batch = await store.create(owner="alice", endpoint="/v1/ocr", input_file_id=uploaded.id,
                                   completion_window="24h", metadata=None, output_uri=None,
                                   output_expires_after=None, window=1.0)
        wake, dispatch = asyncio.Event(), asyncio.Event()
        loop = asyncio.create_task(runner.run(0.05, wake, dispatch))
        try:
            while (await store.get("alice", batch.id)).status == "validating":
                await asyncio.sleep(0.02)
            await runner.run_chunk(await runner.claim())  # one line runs in time
            await asyncio.sleep(1.0)
            assert await runner.claim() is None  # past its window: no chunk is handed out
            while (ended := await store.get("alice", batch.id)).status not in ("expired", "completed"):
                await asyncio.sleep(0.02)
        finally:
            loop.cancel()
        assert ended.status == "expired" and ended.expired_at and (ended.completed, ended.failed) == (1, 2)
        output = b"".join([p async for p in files.parts(ended.output_file_id)]).decode().splitlines()
        errors = b"".join([p async for p in files.parts(ended.error_file_id)]).decode().splitlines()
        assert [json.loads(line)["custom_id"] for line in output] == ["c0"]
        assert [(json.loads(e)["custom_id"], json.loads(e)["error"]["code"]) for e in errors] == [
            ("c1", "batch_expired"), ("c2", "batch_expired")]
    _run(go, tmp_path)


def test_a_database_from_before_batches_gets_their_tables_and_the_output_columns(tmp_path):
    import sqlite3

    from hyocr.types import MediaInput, OcrCall, Task

    async def make():
        await (await _stores(tmp_path))[0].engine.dispose()

    asyncio.run(make())
    with sqlite3.connect(tmp_path / "jobs.db") as db:  # as hyocr made it before issue 32
        for column in ("output_uri", "output_state", "output_lease_until", "output_error"):
            db.execute(f"ALTER TABLE hyocr_jobs DROP COLUMN {column}")
        for table in ("hyocr_batch_chunks", "hyocr_batch_lines", "hyocr_batches", "hyocr_file_parts", "hyocr_files"):
            db.execute(f"DROP TABLE {table}")

    async def reopen():
        jobs = JobStore(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}")
        await jobs.open()
        try:
            job, _ = await jobs.submit(
                owner="a", idempotency_key=None, call=OcrCall(media=(MediaInput(b"x"),), task=Task.TEXT), pdf=False,
                items=[0], range_pages=1, task="text", requested_task="text", model="m", engine="fake",
                callback_url=None, callback_headers=None, output_uri="s3://results/a/")
            assert (job.output_uri, job.output_state) == ("s3://results/a/", "pending")
            assert await _batch(BatchStore(jobs.engine)) is not None
        finally:
            await jobs.close()

    asyncio.run(reopen())


def test_a_lost_claim_stops_that_batchs_work_and_not_the_loop(tmp_path):
    import json

    from hyocr.config import load_settings
    from hyocr.jobs.batch_runner import BatchRunner
    from hyocr.pipeline.objects import ObjectStore

    async def go(store, files):
        settings = load_settings(engine="fake")
        runner = BatchRunner(store, files, ObjectStore.from_settings(settings), settings, replica="r",
                             answer=None)
        line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/ocr", "body": {}}).encode()

        async def one_line():
            yield line

        slow, quick = [await files.write(owner="alice", filename="x", purpose="batch", parts=one_line(),
                                         expires_at=None, count_lines=True) for _ in range(2)]
        reading = files.parts

        async def parts(file_id):  # fault injection: the first file reads slowly, and its claim is lost
            if file_id == slow.id:
                await asyncio.sleep(2)
            async for part in reading(file_id):
                yield part

        async def renew(batch_id, replica):  # another replica took the batch over (its lease had lapsed)
            from sqlalchemy import update

            from hyocr.jobs.schema import batches
            async with store.engine.begin() as db:
                await db.execute(update(batches).where(batches.c.id == batch_id)
                                 .values(claimed_by="other", lease_until=time.time() + 60))
            return False

        files.parts, store.renew_batch = parts, renew
        made = [await store.create(owner="alice", endpoint="/v1/ocr", input_file_id=f.id, completion_window="24h",
                                   metadata=None, output_uri=None, output_expires_after=None, window=86400)
                for f in (slow, quick)]
        loop = asyncio.create_task(runner.run(0.05, asyncio.Event(), asyncio.Event()))
        try:
            deadline = time.monotonic() + 10
            while (await store.get("alice", made[1].id)).status == "validating":
                assert not loop.done() and time.monotonic() < deadline, "the loop died with the lost claim"
                await asyncio.sleep(0.05)
            assert (await store.get("alice", made[1].id)).status == "in_progress"
        finally:
            loop.cancel()
    _run(go, tmp_path, lease=0.3)


def test_a_batch_cancelled_after_its_validation_died_half_way_answers_every_line(tmp_path):
    """A crash while validating leaves some lines stored and total 0; a cancel then used to end the batch with
    only those: its input is read again first, and every line comes back batch_cancelled."""
    import json

    from hyocr.config import load_settings
    from hyocr.jobs.batch_runner import BatchRunner
    from hyocr.pipeline.objects import ObjectStore

    async def go(store, files):
        settings = load_settings(engine="fake")
        runner = BatchRunner(store, files, ObjectStore.from_settings(settings), settings, replica="r", answer=None)

        async def parts():
            yield "".join(json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/ocr", "body": {"n": n}})
                          + "\n" for n in range(1, 11)).encode()

        uploaded = await files.write(owner="alice", filename="in.jsonl", purpose="batch", parts=parts(),
                                     expires_at=None, count_lines=True)
        batch = await store.create(owner="alice", endpoint="/v1/ocr", input_file_id=uploaded.id,
                                   completion_window="24h", metadata=None, output_uri=None,
                                   output_expires_after=None, window=86400)
        assert (await store.claim_batch("dead")).id == batch.id  # a replica begins, stores 3 lines, and dies
        await store.add_lines(batch.id, [{"n": n, "custom_id": f"c{n}", "request": b"{}"} for n in (1, 2, 3)])
        assert await store.cancel("alice", batch.id)
        await store.release_batch(batch.id, "dead")  # its lease ran out
        claimed = await store.claim_batch("r")
        assert (claimed.id, claimed.status, claimed.total) == (batch.id, "cancelling", 0)
        await runner._whole(claimed)
        ended = await store.get("alice", batch.id)
        assert (ended.status, ended.total, ended.completed, ended.failed) == ("cancelled", 10, 0, 10)
        errors = b"".join([p async for p in files.parts(ended.error_file_id)]).decode().splitlines()
        assert [(json.loads(e)["custom_id"], json.loads(e)["error"]["code"]) for e in errors] == [
            (f"c{n}", "batch_cancelled") for n in range(1, 11)]

        # What would fail a validation does not turn the cancel into a failure: a duplicate custom_id is listed,
        # and an input deleted since leaves the lines the dead validation stored.
        async def twice():
            yield b'{"custom_id": "same", "method": "POST", "url": "/v1/ocr", "body": {}}\n' * 2

        for gone in (False, True):
            uploaded = await files.write(owner="alice", filename="dup.jsonl", purpose="batch", parts=twice(),
                                         expires_at=None, count_lines=True)
            batch = await store.create(owner="alice", endpoint="/v1/ocr", input_file_id=uploaded.id,
                                       completion_window="24h", metadata=None, output_uri=None,
                                       output_expires_after=None, window=86400)
            assert (await store.claim_batch("dead")).id == batch.id
            await store.add_lines(batch.id, [{"n": 1, "custom_id": "same", "request": b"{}"}])
            assert await store.cancel("alice", batch.id)
            await store.release_batch(batch.id, "dead")
            if gone:
                assert await files.delete("alice", uploaded.id)
            await runner._whole(await store.claim_batch("r"))
            ended = await store.get("alice", batch.id)
            assert (ended.status, ended.total, ended.failed) == ("cancelled", 1 if gone else 2, 1 if gone else 2)
    _run(go, tmp_path)


def test_a_batch_cancelled_while_its_validation_runs_is_not_read_twice(tmp_path):
    async def go(store, _files):
        batch = await store.create(owner="alice", endpoint="/v1/ocr", input_file_id="file-x", completion_window="24h",
                                   metadata=None, output_uri=None, output_expires_after=None, window=86400)
        assert (await store.claim_batch("v")).id == batch.id
        await store.add_lines(batch.id, [{"n": n, "custom_id": f"c{n}", "request": b"{}"} for n in (1, 2)])
        assert await store.cancel("alice", batch.id)
        assert not await store.start(batch.id, "v", numbers=[1, 2], chunk_lines=1)  # cancelled meanwhile
        assert (await store.get("alice", batch.id)).total == 2  # whole: the finalizer closes them as they are
    _run(go, tmp_path)


def test_owners_take_turns_for_chunks_before_a_batch_does(tmp_path):
    """Two older batches of one owner held a newer batch of another back for as long as they ran: the owner
    with the fewest chunks running goes first."""
    async def go(store, _files):
        async def batch(owner: str, lines: int) -> str:
            made = await store.create(owner=owner, endpoint="/v1/ocr", input_file_id="file-x", completion_window="24h",
                                      metadata=None, output_uri=None, output_expires_after=None, window=86400)
            assert (await store.claim_batch("v")).id == made.id
            await store.add_lines(made.id, [{"n": n, "custom_id": f"c{n}", "request": b"{}"}
                                            for n in range(1, lines + 1)])
            assert await store.start(made.id, "v", numbers=list(range(1, lines + 1)), chunk_lines=1)
            await store.release_batch(made.id, "v")
            return made.id

        first, second = await batch("alice", 4), await batch("alice", 4)
        bobs = await batch("bob", 1)
        a, b = await store.claim_chunk("w1"), await store.claim_chunk("w2")
        assert {a.batch_id, b.batch_id} == {first, bobs}  # bob's batch has the fewest running, then alice's oldest
        await store.finish_chunk(b.chunk_id if b.batch_id == bobs else a.chunk_id, "w2" if b.batch_id == bobs
                                 else "w1")
        c = await store.claim_chunk("w3")  # alice runs one chunk: her second batch, not her first again
        assert c.batch_id == second
    _run(go, tmp_path)
