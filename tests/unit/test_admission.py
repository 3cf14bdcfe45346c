"""Admission: slots, the queue, and the bound on a queued request's wait."""

from __future__ import annotations

import asyncio

import pytest

from hyocr.errors import ServiceUnavailable
from hyocr.pipeline.admission import Admission


def test_a_queued_request_waits_at_most_max_wait_and_its_place_is_freed():
    async def scenario():
        admission = Admission(max_concurrency=1, max_queue=4, max_wait=0.2)
        held = await admission.acquire()
        with pytest.raises(ServiceUnavailable) as info:
            await admission.acquire()
        assert info.value.code == "queue_timeout" and info.value.headers == {"Retry-After": "1"}
        assert admission.waiting == 0 and admission.in_flight == 1
        # A waiter whose slot comes in time gets it, and the slot count stays right after both.
        later = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0.05)
        held.release()
        ticket = await later
        ticket.release()
        assert admission.in_flight == 0 and admission.waiting == 0

    asyncio.run(scenario())


def test_without_max_wait_a_queued_request_waits_for_its_slot():
    async def scenario():
        admission = Admission(max_concurrency=1, max_queue=1)
        held = await admission.acquire()
        waiting = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0.3)
        assert not waiting.done() and admission.waiting == 1
        held.release()
        (await waiting).release()
        assert admission.in_flight == 0

    asyncio.run(scenario())


async def _queued(admission: Admission, caller: str | None, order: list, tag: str) -> None:
    ticket = await admission.acquire(caller)
    order.append(tag)
    await asyncio.sleep(0)
    ticket.release()


def test_callers_take_turns_for_freed_slots():
    """A caller's burst does not hold another caller's single request behind all of it."""
    async def scenario():
        admission = Admission(max_concurrency=1, max_queue=16)
        held = await admission.acquire("alice")
        order: list[str] = []
        tasks = [asyncio.ensure_future(_queued(admission, "alice", order, f"a{i}")) for i in range(5)]
        await asyncio.sleep(0)
        tasks.append(asyncio.ensure_future(_queued(admission, "bob", order, "b0")))
        await asyncio.sleep(0)
        assert admission.waiting == 6
        held.release()
        await asyncio.gather(*tasks)
        assert order == ["a0", "b0", "a1", "a2", "a3", "a4"]
        assert admission.in_flight == 0 and admission.waiting == 0

    asyncio.run(scenario())


def test_one_caller_holds_at_most_three_quarters_of_the_queue():
    async def scenario():
        admission = Admission(max_concurrency=1, max_queue=4)
        held = await admission.acquire("alice")
        assert admission.caller_places() == 3
        mine = [asyncio.ensure_future(admission.acquire("alice")) for _ in range(3)]
        await asyncio.sleep(0)
        with pytest.raises(ServiceUnavailable) as info:
            await admission.acquire("alice")
        assert info.value.code == "overloaded"
        bobs = asyncio.ensure_future(admission.acquire("bob"))  # the last place is left for the others
        await asyncio.sleep(0)
        assert admission.waiting == 4
        with pytest.raises(ServiceUnavailable):
            await admission.acquire("carol")  # the queue is full
        held.release()
        for waiter in (mine[0], bobs, *mine[1:]):  # alice, then bob in his turn
            (await waiter).release()
        assert admission.in_flight == 0 and admission.waiting == 0

    asyncio.run(scenario())


def test_anonymous_requests_share_one_line_with_the_whole_queue():
    async def scenario():
        admission = Admission(max_concurrency=1, max_queue=4)
        held = await admission.acquire()
        order: list[str] = []
        tasks = [asyncio.ensure_future(_queued(admission, None, order, str(i))) for i in range(4)]
        await asyncio.sleep(0)
        assert admission.waiting == 4  # no per-caller bound without an identity
        held.release()
        await asyncio.gather(*tasks)
        assert order == ["0", "1", "2", "3"]

    asyncio.run(scenario())


def test_a_caller_giving_up_leaves_the_turns_and_counts_right():
    async def scenario():
        admission = Admission(max_concurrency=1, max_queue=8, max_wait=0.2)
        held = await admission.acquire("alice")
        gone = asyncio.ensure_future(admission.acquire("bob"))
        await asyncio.sleep(0)
        gone.cancel()  # bob's client went away
        await asyncio.sleep(0)
        assert admission.waiting == 0
        stays = asyncio.ensure_future(admission.acquire("carol"))
        await asyncio.sleep(0)
        held.release()
        (await stays).release()
        with pytest.raises(ServiceUnavailable):  # a timeout in a line of its own
            held = await admission.acquire("alice")
            await admission.acquire("dave")
        held.release()
        assert admission.in_flight == 0 and admission.waiting == 0

    asyncio.run(scenario())


def test_a_gone_waiter_at_the_head_of_a_line_does_not_cost_its_caller_the_turn():
    async def scenario():
        admission = Admission(max_concurrency=1, max_queue=16)
        held = await admission.acquire("alice")
        order: list[str] = []
        gone = asyncio.ensure_future(admission.acquire("alice"))
        await asyncio.sleep(0)
        waiting = [asyncio.ensure_future(_queued(admission, caller, order, tag))
                   for caller, tag in (("alice", "a2"), ("bob", "b1"), ("bob", "b2"))]
        await asyncio.sleep(0)
        gone.cancel()  # its task has not run yet: still at the head of alice's line when the slot comes free
        held.release()
        await asyncio.gather(*waiting)
        assert order == ["a2", "b1", "b2"]
        assert admission.in_flight == 0 and admission.waiting == 0

    asyncio.run(scenario())


def test_small_queues_keep_a_place_for_other_callers():
    assert [Admission(1, q).caller_places() for q in (1, 2, 3, 4, 5, 8, 256)] == [1, 1, 2, 3, 3, 6, 192]


def test_a_ticket_collected_unreleased_frees_its_slot_on_the_loop():
    """Freed inside a collection that ran in acquire() (between its look for a free slot and its place in the
    queue), the slot waited unused behind the new waiter for the whole QUEUE_TIMEOUT: it is freed on the loop."""
    async def scenario():
        admission = Admission(max_concurrency=1, max_queue=4, max_wait=5)
        ticket = await admission.acquire("alice")
        del ticket  # collected at once (no cycle): the release is scheduled, not run here
        assert admission.in_flight == 1
        waiter = asyncio.ensure_future(admission.acquire("bob"))
        (await asyncio.wait_for(waiter, 1)).release()  # the scheduled release hands bob the slot
        assert admission.in_flight == 0 and admission.waiting == 0

    asyncio.run(scenario())
