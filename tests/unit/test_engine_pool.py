"""EnginePool's rules on fake copies (speed and fault injection; the real vLLM cores are driven in
tests/models/test_engine_cores.py): balancing by outstanding work, a request moved before its first output,
a dead copy restarted alone while the other serves, the accounting back to zero."""

from __future__ import annotations

import asyncio

import pytest
from PIL import Image

from hyocr.engines.fake import FakeEngine, FakeScript
from hyocr.engines.pool import EnginePool, default_cost
from hyocr.errors import EngineError, ServiceUnavailable
from hyocr.types import EngineRequest, PageImage, SamplingParams, Task


def _request(rid: str, size: tuple[int, int], max_tokens: int = 150, prompt: str = "read") -> EngineRequest:
    return EngineRequest(rid, Task.TEXT, prompt, (PageImage(Image.new("RGB", size, "white")),),
                         sampling=SamplingParams(max_tokens=max_tokens))


CARD, PAGE = (1024, 640), (2048, 2048)


async def _drain(pool: EnginePool, request: EngineRequest) -> list:
    return [chunk async for chunk in pool.generate(request)]


class Flaky(FakeEngine):
    """A copy whose next requests fail the way a dead vLLM core's do (before output, or after it)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fail_before = 0
        self.fail_after = 0

    async def generate(self, request):
        if self.fail_before:
            self.fail_before -= 1
            raise ServiceUnavailable("the vLLM engine died", code="engine_dead")
        async for n, chunk in _numbered(super().generate(request)):
            if n == 2 and self.fail_after:
                self.fail_after -= 1
                raise ServiceUnavailable("the vLLM engine died", code="engine_dead")
            yield chunk


async def _numbered(stream):
    n = 0
    async for item in stream:
        n += 1
        yield n, item


def test_the_cost_counts_pixels_and_the_output_budget():
    card, page = default_cost(_request("c", CARD)), default_cost(_request("p", PAGE, max_tokens=4000))
    assert card.prefill == 640 and card.output == 150
    assert page.prefill == 4096 and page.output == 1024  # an unbounded budget counts as a page's output


async def test_requests_go_to_the_copy_with_the_least_outstanding_work():
    copies = [FakeEngine(FakeScript(token_delay=0.01)) for _ in range(2)]
    pool = EnginePool(copies, monitor_interval=60)
    await pool.start()
    try:
        # a page still in its prefill (no output for 0.5 s): its visual tokens are owed
        page = asyncio.create_task(_drain(pool, _request("page", PAGE, max_tokens=4000, prompt="[[fake:delay=0.5]]")))
        await asyncio.sleep(0.05)
        cards = [asyncio.create_task(_drain(pool, _request(f"card{n}", CARD))) for n in range(8)]
        await asyncio.sleep(0.05)
        held = {r.request_id for r in copies[0].requests}, {r.request_id for r in copies[1].requests}
        # the page's 5120 tokens of work outweigh six cards (790 each); a request count would alternate
        assert held[0] == {"page", "card7"} and held[1] == {f"card{n}" for n in range(7)}, held
        assert pool.replicas()[0].details["requests"] == 2 and pool.replicas()[1].details["requests"] == 7
        await asyncio.gather(page, *cards)
        assert [c.outstanding for c in pool.copies] == [0, 0] and [c.requests for c in pool.copies] == [0, 0]
    finally:
        await pool.stop()


async def test_a_copy_that_fails_before_output_hands_the_request_to_another():
    flaky = Flaky()
    pool = EnginePool([flaky, FakeEngine()], monitor_interval=60)
    await pool.start()
    try:
        flaky.fail_before = 1
        chunks = await _drain(pool, _request("moved", CARD))
        assert chunks[-1].finish_reason is not None and "moved" in pool.copies[1].engine.completed
        # after output the client has seen text: the error is the request's
        pool.copies[1].state = "down"  # only the flaky copy is left to pick
        flaky.fail_after = 1
        with pytest.raises(ServiceUnavailable):
            await _drain(pool, _request("cut", CARD))
        # a scripted engine error is not a dead copy: it is not retried elsewhere
        pool.copies[1].state = "up"
        with pytest.raises(EngineError):
            await _drain(pool, EngineRequest("bad", Task.TEXT, "[[fake:fail]]", sampling=SamplingParams(max_tokens=5)))
        assert [c.outstanding for c in pool.copies] == [0, 0]
    finally:
        await pool.stop()


async def test_a_dead_copy_is_restarted_alone_while_the_other_serves():
    copies = [FakeEngine(FakeScript(start_delay=0.3)), FakeEngine(FakeScript(start_delay=0.3))]
    pool = EnginePool(copies, monitor_interval=0.05)
    await pool.start()
    try:
        assert [c.starts for c in copies] == [1, 1] and await pool.ready()
        copies[0].kill()  # its process died: readiness fails
        await asyncio.sleep(0.2)
        assert pool.copies[0].state == "restarting" and await pool.ready()
        # meanwhile every request is served by the other copy
        for n in range(5):
            await _drain(pool, _request(f"during{n}", CARD))
        assert all(f"during{n}" in copies[1].completed for n in range(5))
        body = {r.id: r for r in pool.replicas()}
        assert body["0"].alive is False and body["0"].details["state"] == "restarting" and body["1"].alive
        for _ in range(40):
            if pool.copies[0].state == "up":
                break
            await asyncio.sleep(0.05)
        assert pool.copies[0].state == "up" and copies[0].starts == 2 and copies[1].starts == 1
        assert pool.replicas()[0].details["restarts"] == 1
    finally:
        await pool.stop()


async def test_no_copy_up_is_a_retryable_503():
    pool = EnginePool([FakeEngine()], monitor_interval=60)
    await pool.start()
    pool.copies[0].state = "restarting"
    with pytest.raises(ServiceUnavailable) as raised:
        await _drain(pool, _request("none", CARD))
    assert raised.value.code == "engine_restarting" and not await pool.ready()
    await pool.stop()


async def test_a_client_that_leaves_frees_the_copys_work():
    copy = FakeEngine(FakeScript(token_delay=0.05))
    pool = EnginePool([copy], monitor_interval=60)
    await pool.start()
    try:
        stream = pool.generate(_request("gone", CARD))
        await anext(stream)
        assert pool.copies[0].outstanding > 0
        await stream.aclose()
        assert pool.copies[0].outstanding == 0 and pool.copies[0].requests == 0 and "gone" in copy.aborted
    finally:
        await pool.stop()
