"""The jobs layer's background loops (jobs/loops.py): an idle loop queries its database less and less often,
down to once per IDLE_FACTOR polls; work found or a wake brings it back to every poll at once."""

from __future__ import annotations

import asyncio
import time

from hyocr.jobs.loops import IDLE_FACTOR, next_wait, passes


def test_the_wait_doubles_while_idle_up_to_its_bound_and_work_resets_it():
    waits = [0.5]
    for _ in range(4):
        waits.append(next_wait(waits[-1], 0.5, worked=False))
    assert waits[1:] == [1.0, 2.0, 2.0, 2.0] and 0.5 * IDLE_FACTOR == 2.0
    assert next_wait(2.0, 0.5, worked=True) == 0.5  # (a wake resets it too: the next test)


def test_an_idle_loop_passes_less_often_and_a_wake_runs_a_pass_at_once():
    async def scenario():
        times: list[float] = []
        wake = asyncio.Event()

        async def one_pass() -> bool:
            times.append(time.monotonic())
            return False

        loop = asyncio.create_task(passes(one_pass, wake, 0.1, "test"))
        await asyncio.sleep(1.0)  # passes at 0, 0.2, 0.6, 1.0 (then every 0.4 s), where a fixed poll made 10
        idle_passes = len(times)
        wake.set()
        woken_at = time.monotonic()
        while len(times) == idle_passes and time.monotonic() - woken_at < 1.0:
            await asyncio.sleep(0.005)
        loop.cancel()
        return idle_passes, times[idle_passes] - woken_at if len(times) > idle_passes else None, times

    idle_passes, after_wake, times = asyncio.run(scenario())
    assert 2 <= idle_passes <= 5, times
    assert after_wake is not None and after_wake < 0.3  # at once, not after the idle wait (0.4 s)
    gaps = [b - a for a, b in zip(times, times[1:idle_passes], strict=False)]
    assert len(gaps) < 2 or gaps[0] < gaps[-1]


def test_a_failing_pass_is_logged_and_tried_again_at_the_poll(caplog):
    async def scenario():
        calls = 0

        async def one_pass() -> bool:
            nonlocal calls
            calls += 1
            raise RuntimeError("database away")

        loop = asyncio.create_task(passes(one_pass, asyncio.Event(), 0.02, "test loop"))
        await asyncio.sleep(0.6)
        loop.cancel()
        return calls

    calls = asyncio.run(scenario())
    assert calls >= 12  # every poll (~30), not backed off (~8): a failure is not idleness
    assert "test loop failed" in caplog.text
