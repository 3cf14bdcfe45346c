"""RayServeEngine's handling of replica failures, with a scripted deployment handle (fault injection; the real
application runs in tests/e2e/test_ray_serve.py): a replica lost before any output is retried once on another,
one lost mid-stream ends the request with a retryable 503, Serve's back-pressure is an overload 503."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.serve")
from ray.exceptions import ActorDiedError  # noqa: E402
from ray.serve.exceptions import BackPressureError  # noqa: E402

from hyocr.errors import ServiceUnavailable  # noqa: E402
from hyocr.ray.engine import RayServeEngine  # noqa: E402
from hyocr.ray.replica import HELLO  # noqa: E402
from hyocr.types import EngineChunk, EngineRequest, FinishReason, Task  # noqa: E402


class Stream:
    def __init__(self, items: list) -> None:
        self.items, self.cancelled = list(items), False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.items:
            raise StopAsyncIteration
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled = True


class Handle:
    """``handle.options(stream=True).generate.remote(request)``, one scripted stream per call."""

    def __init__(self, *streams: list) -> None:
        self.streams = [Stream(s) for s in streams]
        self.calls = 0

    def options(self, **_):
        return self

    @property
    def generate(self):
        return self

    def remote(self, _request):
        stream = self.streams[self.calls]
        self.calls += 1
        return stream


REQUEST = EngineRequest("r1", Task.TEXT, "read")
DONE = EngineChunk(text="HELLO", finish_reason=FinishReason.STOP)


async def _read(engine: RayServeEngine) -> list[EngineChunk]:
    return [chunk async for chunk in engine.generate(REQUEST)]


async def test_a_replica_lost_before_any_output_is_retried_on_another():
    handle = Handle([(HELLO, "a"), ActorDiedError()], [(HELLO, "b"), DONE])
    engine = RayServeEngine(handle)
    assert await _read(engine) == [DONE]
    assert handle.calls == 2 and dict(engine.served) == {"a": 1, "b": 1}
    assert all(s.cancelled for s in handle.streams)  # nothing left running on either replica


async def test_a_replica_lost_mid_stream_is_a_retryable_503_not_a_replayed_stream():
    handle = Handle([(HELLO, "a"), EngineChunk(text="HE"), ActorDiedError()], [DONE])
    engine = RayServeEngine(handle)
    seen = []
    with pytest.raises(ServiceUnavailable) as failure:
        async for chunk in engine.generate(REQUEST):
            seen.append(chunk)
    assert failure.value.code == "engine_replica_lost" and seen == [EngineChunk(text="HE")]
    assert handle.calls == 1


async def test_two_lost_replicas_in_a_row_give_up_cleanly():
    handle = Handle([ActorDiedError()], [ActorDiedError()])
    with pytest.raises(ServiceUnavailable, match="stopped"):
        await _read(RayServeEngine(handle))


async def test_every_replica_at_its_limit_is_an_overload_503():
    handle = Handle([BackPressureError(num_queued_requests=10, max_queued_requests=10)])
    with pytest.raises(ServiceUnavailable) as failure:
        await _read(RayServeEngine(handle))
    assert failure.value.code == "overloaded"
