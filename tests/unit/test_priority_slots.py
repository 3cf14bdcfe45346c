"""PrioritySlots: a freed worker goes to the most urgent waiter, and leaving a queue loses nothing."""

from __future__ import annotations

import asyncio

from hyocr.engines.slots import PrioritySlots


def test_a_freed_slot_goes_to_online_work_before_queued_background_work():
    async def scenario():
        slots, order = PrioritySlots(1), []

        async def work(name: str, priority: int, hold: asyncio.Event | None = None):
            async with slots.slot(priority):
                order.append(name)
                if hold is not None:
                    await hold.wait()

        hold = asyncio.Event()
        first = asyncio.create_task(work("job-1", 1, hold))
        await asyncio.sleep(0)
        queued = [asyncio.create_task(work(f"job-{n}", 1)) for n in (2, 3)]
        await asyncio.sleep(0)
        online = asyncio.create_task(work("online", 0))
        await asyncio.sleep(0)
        hold.set()
        await asyncio.gather(first, online, *queued)
        assert order == ["job-1", "online", "job-2", "job-3"]
        assert slots.free == 1
    asyncio.run(scenario())


def test_a_waiter_that_leaves_neither_takes_nor_loses_a_slot():
    async def scenario():
        slots = PrioritySlots(1)
        hold = asyncio.Event()

        async def holder():
            async with slots.slot():
                await hold.wait()

        task = asyncio.create_task(holder())
        await asyncio.sleep(0)

        async def waiter():
            async with slots.slot(1):
                raise AssertionError("never granted")

        gone = asyncio.create_task(waiter())
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        hold.set()
        await task
        assert slots.free == 1
        async with slots.slot(0):
            assert slots.free == 0
        assert slots.free == 1
    asyncio.run(scenario())
