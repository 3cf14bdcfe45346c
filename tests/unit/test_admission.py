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
