"""The progress board's rules: what is overdue, what is hung alone, when the whole engine is stalled."""

from __future__ import annotations

import asyncio

import pytest

from hyocr.errors import ServiceUnavailable
from hyocr.pipeline.progress import ONE_SHOT_SLACK, ProgressBoard, restarting_error, stalled_error


def _waiting(board: ProgressBoard, request_id: str, *, entered: float, since: float, started: bool = False,
             expected: float | None = None, priority: int = 0):
    watch = board.enter(request_id, expected, priority)
    watch.entered = entered
    if started:
        board.got(watch)
    watch.since, watch.waiting = since, True
    watch.budget = board._budget(watch)
    return watch


def test_nothing_watched_is_never_stalled_however_long_the_server_idled():
    board = ProgressBoard(stall_timeout=1.0)
    assert board.check(now=1e9) == ([], False)


def test_every_request_overdue_is_a_stalled_engine():
    board = ProgressBoard(stall_timeout=1.0)
    _waiting(board, "a", entered=0, since=0)
    assert board.check(now=0.5) == ([], False)
    assert board.check(now=2.0) == ([], True)


def test_a_request_that_went_silent_while_another_flows_is_hung_alone():
    board = ProgressBoard(stall_timeout=1.0)
    silent = _waiting(board, "silent", entered=0, since=0, started=True)
    _waiting(board, "flowing", entered=0, since=1.9, started=True)
    assert board.check(now=2.0) == ([silent], False)


def test_a_queued_request_is_hung_only_when_a_later_one_overtook_it():
    board = ProgressBoard(stall_timeout=1.0)
    queued = _waiting(board, "queued", entered=0, since=0)
    ahead = _waiting(board, "ahead", entered=-1, since=1.9, started=True)  # arrived first, progressing
    assert board.check(now=2.0) == ([], False)  # waiting its turn behind progressing work
    board.leave(ahead)
    _waiting(board, "later", entered=0.5, since=1.9, started=True)  # arrived after it, already started
    assert board.check(now=2.0) == ([queued], False)


def test_a_jobs_page_waiting_behind_online_requests_is_not_overtaken():
    # Engines serve online requests before a job's pages (priority 1): online work that arrived later and
    # started is the order they keep, not a stall (a helper round saw 14 of a job's 17 pages stored as
    # "stalled" error pages while online cards flowed on a one-worker rapidocr).
    board = ProgressBoard(stall_timeout=1.0)
    page = _waiting(board, "job page", entered=0, since=0, priority=1)
    online = _waiting(board, "online", entered=0.5, since=1.9, started=True)
    assert board.check(now=2.0) == ([], False)
    board.leave(online)
    _waiting(board, "later page", entered=0.5, since=1.9, started=True, priority=1)  # its own class overtook it
    assert board.check(now=2.0) == ([page], False)


def test_an_online_request_overtaken_by_a_jobs_page_is_hung():
    board = ProgressBoard(stall_timeout=1.0)
    queued = _waiting(board, "online", entered=0, since=0)
    _waiting(board, "job page", entered=0.5, since=1.9, started=True, priority=1)
    assert board.check(now=2.0) == ([queued], False)


def test_a_consumer_busy_elsewhere_is_not_a_wait_on_the_engine():
    board = ProgressBoard(stall_timeout=1.0)
    watch = _waiting(board, "slow reader", entered=0, since=0, started=True)
    watch.waiting = False  # the chunk arrived; the client is slow to take it
    assert board.check(now=100.0) == ([], False)


def test_a_one_shot_request_has_its_estimate_once_started():
    board = ProgressBoard(stall_timeout=1.0)
    watch = _waiting(board, "big image", entered=0, since=0, started=True, expected=3.0)
    assert watch.budget == ONE_SHOT_SLACK * 3.0
    assert board.check(now=29.0) == ([], False)
    assert board.check(now=31.0) == ([], True)
    quick = _waiting(board, "small image", entered=0, since=0, started=True, expected=0.01)
    assert quick.budget == 1.0  # never below the stall timeout


async def test_failing_a_waiting_request_ends_its_wait_with_the_error():
    board = ProgressBoard(stall_timeout=1.0)
    watch = board.enter("r")

    async def consumer():
        board.wait(watch)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            failure = board.failure_for(watch)
            if failure is None:
                raise
            raise failure from None

    task = asyncio.ensure_future(consumer())
    await asyncio.sleep(0)
    board.fail(watch, stalled_error(5))
    with pytest.raises(ServiceUnavailable) as caught:
        await task
    assert caught.value.code == "engine_stalled" and caught.value.headers["Retry-After"]


async def test_a_cancellation_from_elsewhere_wins_over_the_boards():
    board = ProgressBoard(stall_timeout=1.0)
    watch = board.enter("r")

    async def consumer():
        board.wait(watch)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            if board.failure_for(watch) is None:
                raise
            return "converted"

    task = asyncio.ensure_future(consumer())
    await asyncio.sleep(0)
    board.fail(watch, stalled_error(5))
    task.cancel()  # the client went away at the same moment
    with pytest.raises(asyncio.CancelledError):
        await task


def test_while_restarting_new_requests_get_a_retryable_error_and_later_waits_fail():
    board = ProgressBoard(stall_timeout=1.0)
    busy = board.enter("busy")  # not awaiting the engine when the restart began
    board.restarting = "stalled"
    assert board.fail_all(lambda w: restarting_error("stalled")) == 1
    with pytest.raises(ServiceUnavailable) as caught:
        board.enter("new")
    assert caught.value.code == "engine_restarting" and caught.value.headers["Retry-After"]
    with pytest.raises(ServiceUnavailable):
        board.wait(busy)  # its next wait fails at once
