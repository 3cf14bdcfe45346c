"""A UI run goes through the service's own stream and ends in the result /v1/ocr would give."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest
from imaging import to_bytes
from PIL import Image

from hyocr.api.bodies import ocr_body
from hyocr.engines.fake import FakeEngine, FakeScript
from hyocr.errors import EngineError, InvalidMedia
from hyocr.pipeline.service import OcrService, result_of
from hyocr.types import MediaInput, OcrCall
from hyocr.types import EngineChunk, EngineRequest, Task
from hyocr.ui.runner import stream_run, until_set


def _png(width: int = 320, height: int = 200) -> bytes:
    return to_bytes(Image.new("RGB", (width, height), "white"))


async def _service(engine: FakeEngine | None = None) -> OcrService:
    engine = engine or FakeEngine()
    await engine.start()
    return OcrService(engine)


async def _collect(service: OcrService, call: OcrCall) -> list:
    return [snap async for snap in stream_run(service, call, every=0)]


@pytest.mark.parametrize(
    ("task", "extra"),
    [(Task.SPOTTING, {}), (Task.DOCUMENT, {}), (Task.EXTRACT, {"fields": ("name", "date")}),
     (Task.TRANSLATE, {"target_language": "zh"}), (Task.VQA, {"question": "What is it?"})],
)
async def test_a_run_streams_then_gives_the_same_pages_as_the_api(task, extra):
    service = await _service()
    call = OcrCall(media=(MediaInput(_png()),), task=task, **extra)
    snaps = await _collect(service, call)
    first, *middle, last = snaps
    assert first.text == "" and len(first.pages) == 1 and first.result is None
    texts = [s.text for s in middle]
    assert len(texts) >= 3 and all(b.startswith(a) for a, b in itertools.pairwise(texts))  # growing, in order
    expected = await result_of(service.read(call))
    got = last.result
    assert got is not None and got.task is task and got.usage == expected.usage
    for mine, theirs in zip(got.pages, expected.pages, strict=True):
        assert (mine.text, mine.blocks, mine.fields, mine.markdown, mine.finish_reason) == (
            theirs.text, theirs.blocks, theirs.fields, theirs.markdown, theirs.finish_reason)
    body = ocr_body(got)
    assert body["object"] == "ocr.result" and body["timings"]["first_text_ms"] is not None


async def test_pages_are_read_one_after_another():
    service = await _service()
    call = OcrCall(media=(MediaInput(_png(300)), MediaInput(_png(400))), task=Task.TEXT)
    snaps = await _collect(service, call)
    assert [s.current for s in snaps] == sorted(s.current for s in snaps)  # page 1, then page 2
    pages = snaps[-1].result.pages
    assert [p.width for p in pages] == [300, 400] and "300x200" in pages[0].text and "400x200" in pages[1].text
    assert [r.request_id for r in service.engine.requests][-2:] == [f"{snaps[0].request_id}-p0",
                                                                      f"{snaps[0].request_id}-p1"]


class _FailsOnWidePages(FakeEngine):
    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        if request.images[0].width > 1000:
            raise EngineError("secret internals")
        async for chunk in super().generate(request):
            yield chunk


async def test_a_failed_page_does_not_fail_the_others_and_keeps_its_secrets():
    service = await _service(_FailsOnWidePages())
    call = OcrCall(media=(MediaInput(_png(1200)), MediaInput(_png())), task=Task.TEXT)
    result = (await _collect(service, call))[-1].result
    bad, good = result.pages
    assert bad.error == "the engine failed on this page" and "secret" not in bad.error
    assert good.error is None and good.text


async def test_a_single_page_error_is_raised():
    service = await _service(_FailsOnWidePages())
    with pytest.raises(EngineError):
        await _collect(service, OcrCall(media=(MediaInput(_png(1200)),), task=Task.TEXT))
    with pytest.raises(InvalidMedia):
        await _collect(service, OcrCall(media=(MediaInput(b"not an image", param="x.png"),)))


async def test_stop_aborts_the_engine_even_before_its_first_token():
    engine = FakeEngine(FakeScript(hang=True))
    service = await _service(engine)
    stop = asyncio.Event()
    seen = []

    async def consume():
        async for snap in until_set(stream_run(service, OcrCall(media=(MediaInput(_png()),))), stop):
            seen.append(snap)

    task = asyncio.create_task(consume())
    for _ in range(100):
        if engine.active:
            break
        await asyncio.sleep(0.01)
    assert engine.active, "the engine never started"
    stop.set()
    await asyncio.wait_for(task, 5)
    assert len(seen) == 1 and not engine.active and engine.aborted and not engine.completed


async def test_until_set_passes_everything_through_when_not_stopped():
    async def numbers():
        for i in range(5):
            yield i

    assert [i async for i in until_set(numbers(), asyncio.Event())] == [0, 1, 2, 3, 4]


async def test_a_lora_adapter_is_selected_by_model_name_as_in_the_api():
    from dataclasses import replace

    engine = FakeEngine()
    engine.info = replace(engine.info, adapters=("invoices",))
    service = await _service(engine)
    result = (await _collect(service, OcrCall(media=(MediaInput(_png()),), model="invoices")))[-1].result
    assert result.model == "invoices" and engine.requests[-1].adapter == "invoices"
    result = (await _collect(service, OcrCall(media=(MediaInput(_png()),), model="fake-ocr")))[-1].result
    assert result.model == "fake-ocr" and engine.requests[-1].adapter is None


async def test_runs_are_admitted_like_api_requests():
    from hyocr.errors import ServiceUnavailable
    from hyocr.pipeline.admission import Admission

    engine = FakeEngine(FakeScript(hang=True))
    await engine.start()
    service = OcrService(engine, admission=Admission(max_concurrency=1, max_queue=0))
    stop = asyncio.Event()
    first = asyncio.create_task(_drain(until_set(stream_run(service, OcrCall(media=(MediaInput(_png()),))), stop)))
    while not engine.active:
        await asyncio.sleep(0.01)
    with pytest.raises(ServiceUnavailable):  # full: refused at once, before decoding
        await _collect(service, OcrCall(media=(MediaInput(b"never decoded"),)))
    stop.set()
    await asyncio.wait_for(first, 5)
    assert service.admission.in_flight == 0  # the stopped run gave its slot back


async def test_a_run_past_the_deadline_is_a_504_and_aborts_the_engine():
    from hyocr.errors import GatewayTimeout

    engine = FakeEngine(FakeScript(hang=True))
    await engine.start()
    service = OcrService(engine, request_timeout=0.3)
    with pytest.raises(GatewayTimeout):
        await _collect(service, OcrCall(media=(MediaInput(_png()), MediaInput(_png()))))
    assert engine.aborted and not engine.active and service.admission.in_flight == 0


async def _drain(source) -> None:
    async for _ in source:
        pass
