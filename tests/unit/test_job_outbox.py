"""The webhook outbox and the schema upgrade on a real SQLite file: a delivery claimed by one replica is not
sent by another, the per-receiver bound holds, a lapsed claim is due again, and a database made before a
column existed gets it."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from types import SimpleNamespace

from hyocr.jobs import outbox as outbox_module
from hyocr.jobs.outbox import Outbox, receiver
from hyocr.jobs.store import JobStore
from hyocr.jobs.webhooks import Outcome
from hyocr.pipeline.fetch import FetchPolicy
from hyocr.types import MediaInput, OcrCall, Task

SETTINGS = SimpleNamespace(webhook_timeout=5.0, webhook_concurrency=64, webhook_host_concurrency=2,
                           webhook_max_attempts=3)


async def _store(tmp_path) -> JobStore:
    store = JobStore(f"sqlite+aiosqlite:///{tmp_path / 'jobs.db'}")
    await store.open()
    return store


async def _jobs(store: JobStore, *ids: str) -> None:
    """Finished jobs for deliveries to belong to (a delivery is signed with its job owner's secret)."""
    from sqlalchemy import insert

    from hyocr.jobs.schema import jobs

    async with store.engine.begin() as db:
        await db.execute(insert(jobs), [{"id": i, "owner": "key-test", "status": "succeeded", "created_at": time.time(),
                                         "call": {}, "pdf": 0, "pages_total": 1, "task": "text",
                                         "requested_task": "text", "model": "m", "engine": "fake"} for i in ids])


async def _eventually(check, timeout: float = 10.0) -> None:
    """Waits for what other tasks do next: fixed sleeps were too short on a loaded two-core CI machine."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_receivers_are_host_and_port():
    assert receiver("https://Hooks.Example.com/a") == receiver("https://hooks.example.com:443/b")
    assert receiver("http://h.test/x") != receiver("http://h.test:8080/x")
    assert receiver("http://[::1]:99999/x") == "http://[::1]:99999/x"  # unparseable: a receiver of its own


def test_two_replicas_never_send_one_delivery_and_each_receiver_is_bounded(tmp_path, monkeypatch):
    sent: list[str] = []
    release = asyncio.Event()

    async def deliver(delivery, signer, policy, **_):  # a receiver that answers when told to
        sent.append(delivery.id)
        await release.wait()
        return Outcome(True, 204, None, None)

    monkeypatch.setattr(outbox_module, "deliver", deliver)

    async def scenario():
        store = await _store(tmp_path)
        replicas = [Outbox(store.engine, SETTINGS, policy=FetchPolicy(())) for _ in range(2)]
        for box in replicas:
            box.signer = object()
        await _jobs(store, *(f"job-{n}" for n in range(5)), "job-x")
        for n in range(5):
            await replicas[0].add(f"slow-{n}", f"job-{n}", "http://slow.test/hook", None, b"{}")
        await replicas[0].add("other", "job-x", "http://other.test/hook", None, b"{}")
        await replicas[0].add("other", "job-x", "http://other.test/hook", None, b"{}")  # queued once
        started = await asyncio.gather(*(box.start_due(time.time()) for box in replicas))
        await _eventually(lambda: len(sent) == sum(started))
        # each replica may hold two slow.test slots; the other receiver is not held up behind them
        assert sum(started) == len(sent) == len(set(sent)) and "other" in sent
        assert sum(s.startswith("slow") for s in sent) == 4
        assert await replicas[0].start_due(time.time()) == 0  # nothing more is due: claimed or bounded
        release.set()
        fifth, deadline = 0, time.monotonic() + 10  # the fifth, once a slot is free (a loaded machine takes a while)
        while not fifth and time.monotonic() < deadline:
            fifth = await replicas[1].start_due(time.time())
            await asyncio.sleep(0.02)
        assert fifth == 1
        await _eventually(lambda: len(sent) == 6)
        assert len(set(sent)) == 6
        await store.close()

    asyncio.run(scenario())


def test_a_claim_that_lapses_makes_the_delivery_due_again(tmp_path):
    async def scenario():
        store = await _store(tmp_path)
        box = Outbox(store.engine, SETTINGS, policy=FetchPolicy(()))
        await _jobs(store, "job-1")
        await box.add("d1", "job-1", "http://h.test/x", None, b"{}")
        (due,) = await box.due(time.time())
        assert await box.claim(due, hold=0.2) is True
        assert await box.claim(due, hold=0.2) is False  # taken: its next_at moved
        assert await box.due(time.time()) == []
        await asyncio.sleep(0.3)
        (again,) = await box.due(time.time())
        assert again.id == "d1" and again.attempt == 1
        await store.close()

    asyncio.run(scenario())


def test_an_older_database_gets_the_new_columns(tmp_path):
    async def make():
        store = await _store(tmp_path)
        await store.close()

    asyncio.run(make())
    with sqlite3.connect(tmp_path / "jobs.db") as db:  # as hyocr made it before request_digest existed
        db.execute("ALTER TABLE hyocr_jobs DROP COLUMN request_digest")
        assert "request_digest" not in [r[1] for r in db.execute("PRAGMA table_info(hyocr_jobs)")]

    async def reopen():
        store = await _store(tmp_path)
        job, created = await store.submit(
            owner="a", idempotency_key="k", call=OcrCall(media=(MediaInput(b"x"),), task=Task.TEXT), pdf=False,
            items=[0], range_pages=1, task="text", requested_task="text", model="m", engine="fake",
            callback_url=None, callback_headers=None, request_digest="d" * 64)
        assert created and (await store.get_by_key("a", "k")).request_digest == "d" * 64
        await store.close()

    asyncio.run(reopen())


def test_a_delivery_given_up_is_logged_once_by_its_host_without_the_query(tmp_path, monkeypatch, caplog):
    # It was counted by a metric only; and httpx's own INFO line carried the whole URL, a token in its query
    async def deliver(delivery, signer, policy, **_):
        return Outcome(False, 500, None, None)  # no retry left

    monkeypatch.setattr(outbox_module, "deliver", deliver)

    async def scenario():
        store = await _store(tmp_path)
        box = Outbox(store.engine, SETTINGS, policy=FetchPolicy(()))
        box.signer = object()
        await _jobs(store, "job-1")
        await box.add("d1", "job-1", "http://hooks.test/x?token=s3cret", None, b"{}")
        assert await box.start_due(time.time()) == 1
        await _eventually(lambda: any("given up" in r.getMessage() for r in caplog.records))
        await store.close()

    with caplog.at_level("WARNING", logger="hyocr"):
        asyncio.run(scenario())
    (line,) = [r.getMessage() for r in caplog.records if "given up" in r.getMessage()]
    assert "hooks.test:80" in line and "HTTP 500" in line and "s3cret" not in line
    import logging

    from hyocr.observability.logs import setup_logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        setup_logging("info", "text")
        assert logging.getLogger("httpx").getEffectiveLevel() == logging.WARNING
    finally:
        root.handlers[:], root.level = handlers, level
        logging.getLogger("httpx").setLevel(logging.NOTSET)
