"""JobStore on a real SQLite file: the guarantees the jobs rest on (one holder per range, a page stored once,
a dead replica's range freed by its lease, the per-caller cap, retention), without a server."""

from __future__ import annotations

import asyncio
import time

import pytest

from hyocr.jobs import codec
from hyocr.jobs.store import JobStore
from hyocr.types import FinishReason, MediaInput, OcrCall, PageResult, SamplingParams, Task, TextBlock, Usage

CALL = OcrCall(media=(MediaInput(b"png-1"), MediaInput(b"png-2"), MediaInput(b"png-3")), task=Task.EXTRACT,
               fields=("name",), sampling=SamplingParams(max_tokens=9, stop=("x",)), accept_pdf=True)


def _run(coro):
    return asyncio.run(coro)


async def _store(tmp_path, lease: float = 30.0) -> JobStore:
    store = JobStore(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}", lease=lease)
    await store.open()
    return store


async def _submit(store: JobStore, owner: str = "alice", key: str | None = None, range_pages: int = 1):
    return await store.submit(owner=owner, idempotency_key=key, call=CALL, pdf=False, items=[0, 1, 2],
                              range_pages=range_pages, task="extract", requested_task="extract", model="m",
                              engine="fake", callback_url=None, callback_headers=None)


def _page(index: int, text: str = "t") -> PageResult:
    return PageResult(index, 10, 20, text, (TextBlock(text, (1.0, 2.0, 3.0, 4.0), 0.9, ((1, 2), (3, 2), (3, 4),
                                                                                           (1, 4))),),
                      FinishReason.STOP, fields={"name": text}, usage=Usage(5, 2))


def test_a_call_and_a_page_survive_the_round_trip_through_json():
    back = codec.call_from_json(codec.call_to_json(CALL))
    assert back == OcrCall(media=(), **{f: getattr(CALL, f) for f in codec._CALL_FIELDS})
    page = _page(3)
    assert codec.page_from_json(codec.page_to_json(page)) == page


def test_what_the_reader_sets_is_not_part_of_the_stored_call_or_its_digest():
    # document_range is decided where a range is read: a digest stored before it existed still matches
    from dataclasses import replace

    from hyocr.pipeline.media import MediaLimits as Limits

    assert "document_range" not in codec.call_to_json(CALL)
    # min_p came later: unset, a call's JSON (and the digest of a key submitted before the upgrade) is as it was
    assert "min_p" not in codec.call_to_json(CALL)["sampling"]
    with_min_p = replace(CALL, sampling=replace(CALL.sampling, min_p=0.1))
    assert codec.call_from_json(codec.call_to_json(with_min_p)).sampling.min_p == 0.1
    ranged = replace(CALL, document_range=True)
    assert codec.request_digest(ranged, None, Limits()) == codec.request_digest(CALL, None, Limits())


def test_two_replicas_never_hold_one_range_and_a_page_is_stored_once(tmp_path):
    async def scenario():
        store = await _store(tmp_path)
        job, created = await _submit(store)
        assert created and job.status == "queued" and job.pages_total == 3 and job.queue_position == 0
        claims = await asyncio.gather(*(store.claim(f"r{n}", max_running=5) for n in range(6)))
        held = [c for c in claims if c is not None]
        assert sorted(c.range_id for c in held) == sorted({c.range_id for c in held}) and len(held) == 3
        assert all(c.call.media and c.call.task is Task.EXTRACT for c in held)
        first = held[0]
        assert await store.put_page(job.id, first.positions[0], _page(0)) is True
        assert await store.put_page(job.id, first.positions[0], _page(0, "again")) is False
        got = await store.get("alice", job.id)
        assert got.status == "running" and got.pages_done == 1
        assert await store.get("bob", job.id) is None  # not another caller's
        await store.close()
    _run(scenario())


def test_a_range_whose_holder_stopped_renewing_is_claimed_again(tmp_path):
    async def scenario():
        store = await _store(tmp_path, lease=0.3)
        job, _ = await _submit(store, range_pages=3)
        first = await store.claim("dead", max_running=5)
        assert first is not None and await store.claim("alive", max_running=5) is None
        await asyncio.sleep(0.4)  # the lease ran out: "dead" never renewed
        second = await store.claim("alive", max_running=5)
        assert second is not None and second.range_id == first.range_id and second.attempts == 2
        assert await store.renew(first.range_id, "dead") is None  # the old holder has lost it
        assert await store.renew(first.range_id, "alive") == "running"
        await store.close()
    _run(scenario())


def test_owners_take_turns_for_the_workers(tmp_path):
    # alice's job came first with three ranges; bob's, later, must not wait for all of alice's to be read
    # (a helper round: a 12-page job held the one worker for a minute while another caller's page waited).
    async def scenario():
        store = await _store(tmp_path)
        a, _ = await _submit(store, "alice")
        b, _ = await _submit(store, "bob")
        first = await store.claim("r1", max_running=5)
        second = await store.claim("r2", max_running=5)
        assert (first.job_id, second.job_id) == (a.id, b.id)
        third = await store.claim("r3", max_running=5)  # one range each being read: the older job's turn
        assert third.job_id == a.id
        await store.finish_range(second.range_id, "r2")
        fourth = await store.claim("r2", max_running=5)  # bob reads nothing now, alice two ranges
        assert fourth.job_id == b.id
        await store.close()
    _run(scenario())


def test_a_caller_at_the_running_cap_waits_while_others_run(tmp_path):
    async def scenario():
        store = await _store(tmp_path)
        a1, _ = await _submit(store, "alice", range_pages=3)
        a2, _ = await _submit(store, "alice", range_pages=3)
        b1, _ = await _submit(store, "bob", range_pages=3)
        claimed = [await store.claim("r", max_running=1) for _ in range(3)]
        assert [c.job_id for c in claimed if c] == [a1.id, b1.id]  # alice's second job waits
        assert (await store.get("alice", a2.id)).status == "queued"
        await store.close()
    _run(scenario())


def test_idempotency_keys_are_per_caller_and_retention_deletes_everything(tmp_path):
    async def scenario():
        store = await _store(tmp_path)
        first, created = await _submit(store, "alice", key="k")
        again, created_again = await _submit(store, "alice", key="k")
        other, other_created = await _submit(store, "bob", key="k")
        assert created and not created_again and again.id == first.id and other_created and other.id != first.id
        for _ in range(3):
            claim = await store.claim("r", max_running=5)
            await store.put_page(claim.job_id, claim.positions[0], _page(claim.positions[0]))
            await store.finish_range(claim.range_id, "r")
        ended = await store.complete_if_done(first.id, retention=0.1)
        assert ended.status == "succeeded" and ended.pages_done == 3 and ended.expires_at > ended.finished_at
        assert await store.complete_if_done(first.id, retention=0.1) is None  # ended once
        assert [p.index for p in await store.result_pages(first.id)] == [0, 1, 2]
        assert await store.sweep(time.time() + 1) == 1
        assert await store.get("alice", first.id) is None and await store.result_pages(first.id) == []
        await store.close()
    _run(scenario())


@pytest.mark.parametrize("status", ["queued", "running"])
def test_a_cancelled_job_is_no_longer_claimed(tmp_path, status):
    async def scenario():
        store = await _store(tmp_path)
        job, _ = await _submit(store, range_pages=1)
        if status == "running":
            assert await store.claim("r", max_running=5) is not None
        assert await store.cancel("alice", job.id, retention=60) is True
        assert await store.cancel("alice", job.id, retention=60) is False
        assert await store.claim("r", max_running=5) is None
        assert (await store.get("alice", job.id)).status == "cancelled"
        await store.close()
    _run(scenario())
