"""The service's PDF path: where PDFs are accepted, what reaches the engine, pages as they finish.

The fake engine stands in for a vision-language model here: these tests are about the serving layer
(which pages reach the engine, at what size, in what order); tests/integration/test_pdf_api.py reads
PDFs with the real rapidocr engine.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from dataclasses import replace

import pdfs
import pytest
from imaging import to_bytes
from PIL import Image

from hyocr.engines.fake import FakeEngine
from hyocr.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from hyocr.pipeline.media import MediaLimits
from hyocr.pipeline.pdf import PdfRenderer
from hyocr.pipeline.service import OcrService, result_of
from hyocr.types import EngineChunk, EngineRequest, FinishReason, MediaInput, OcrCall, OcrResult, PageResult, ReadDone, Started, Task
from hyocr.ui.runner import stream_run

DOC = pdfs.text_pdf([["ONE"], ["TWO"], ["THREE"]])


@pytest.fixture(scope="module")
def renderer():
    pool = PdfRenderer(workers=1)
    yield pool
    pool.close()


async def _service(renderer, engine: FakeEngine | None = None, **kwargs) -> OcrService:
    engine = engine or FakeEngine()
    await engine.start()
    return OcrService(engine, pdf=renderer, **kwargs)


def _pdf_call(data: bytes | str = DOC, **kwargs) -> OcrCall:
    return OcrCall(media=(MediaInput(data, param="file"),), accept_pdf=True, task=kwargs.pop("task", Task.TEXT),
                   **kwargs)


async def test_a_pdf_is_rendered_for_a_vision_language_engine_within_its_token_budget(renderer):
    service = await _service(renderer)
    result = await result_of(service.read(_pdf_call(pages="1,3")))
    assert [p.index for p in result.pages] == [0, 2]
    for page in result.pages:  # A4 at the highest DPI within 2048^2 pixels and 4162 tokens
        assert (page.width, page.height, page.dpi, page.source) == (1719, 2433, 208, "render")
    sizes = [r.images[0].image.size for r in service.engine.requests]
    assert sizes == [(1719, 2433)] * 2


async def test_pdfs_are_refused_where_the_caller_takes_images_only(renderer):
    service = await _service(renderer)
    with pytest.raises(UnsupportedMediaType, match="PDF documents are read by /v1/ocr"):
        await result_of(service.read(OcrCall(media=(MediaInput(DOC),))))  # a chat route's call


async def test_a_pdf_comes_alone_and_pages_select_pdf_pages_only(renderer):
    service = await _service(renderer)
    png = to_bytes(Image.new("RGB", (64, 64), "white"))
    with pytest.raises(InvalidRequest, match="one document per request"):
        await result_of(service.read(OcrCall(media=(MediaInput(png), MediaInput(DOC, param="images.1")), accept_pdf=True)))
    with pytest.raises(InvalidRequest, match="pages selects pages of a PDF") as exc:
        await result_of(service.read(OcrCall(media=(MediaInput(png),), accept_pdf=True, pages="1")))
    assert exc.value.param == "pages"


async def test_the_pdf_byte_cap_is_its_own_and_checked_before_decoding_base64(renderer):
    limits = MediaLimits(max_image_bytes=1024, max_pdf_bytes=len(DOC))
    service = await _service(renderer, limits=limits)
    encoded = base64.b64encode(DOC).decode()
    result = await result_of(service.read(_pdf_call("data:application/pdf;base64," + encoded)))
    assert len(result.pages) == 3  # larger than an image may be, within the PDF cap
    service = await _service(renderer, limits=MediaLimits(max_image_bytes=1024, max_pdf_bytes=len(DOC) - 1))
    with pytest.raises(PayloadTooLarge, match="the PDF is larger than"):
        await result_of(service.read(_pdf_call(DOC)))
    # from the base64 length alone: its first bytes say PDF, so the PDF cap is the one named
    with pytest.raises(PayloadTooLarge, match="the PDF is larger than"):
        await result_of(service.read(_pdf_call(base64.b64encode(DOC * 2).decode())))
    with pytest.raises(PayloadTooLarge, match="image is larger than"):  # not a PDF: the image cap
        await result_of(service.read(_pdf_call(base64.b64encode(b"\x89PNG" + b"0" * 4096).decode())))


async def test_text_layer_pages_never_reach_the_engine_and_only_for_the_text_task(renderer):
    service = await _service(renderer)
    data = pdfs.mixed_pdf(["A TYPESET PAGE WITH ITS OWN TEXT LAYER"], ["SCANNED"])
    result = await result_of(service.read(_pdf_call(data, prefer_text_layer=True)))
    typeset, scanned = result.pages
    assert (typeset.source, typeset.dpi, typeset.text) == ("text_layer", 72, "A TYPESET PAGE WITH ITS OWN TEXT LAYER")
    assert scanned.source == "render" and scanned.text == "fake text output for a 1720x2433 image"
    assert len(service.engine.requests) == 1  # the scanned page only
    result = await result_of(service.read(_pdf_call(data, prefer_text_layer=True, task=Task.SPOTTING)))
    assert [p.source for p in result.pages] == ["render", "render"]


async def test_a_page_that_cannot_be_read_is_an_error_page_and_the_rest_is_read(renderer):
    service = await _service(renderer)
    result = await result_of(service.read(_pdf_call(pdfs.partly_cyclic_pdf())))
    good, bad = result.pages
    assert good.finish_reason is FinishReason.STOP and good.source == "render"
    assert bad.finish_reason is FinishReason.ERROR and bad.error == "page 2: PDFium could not load this page"
    assert len(service.engine.requests) == 1


class _SlowFirstPage(FakeEngine):
    """Page 1 answers last: pages finish out of order."""

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        if request.images[0].index == 0:
            await asyncio.sleep(0.3)
        async for chunk in super().generate(request):
            yield chunk


async def test_pages_are_yielded_as_they_finish_and_the_result_keeps_page_order(renderer):
    service = await _service(renderer, _SlowFirstPage())
    started, *reads, done = [event async for event in service.read(_pdf_call())]
    assert isinstance(started, Started) and isinstance(done, ReadDone)
    pages, result = [r.page for r in reads], done.result
    assert all(isinstance(p, PageResult) for p in pages) and isinstance(result, OcrResult)
    assert [p.index for p in pages][-1] == 0  # the slow first page came last
    assert [p.index for p in result.pages] == [0, 1, 2]
    assert result.text == "\n\n".join(p.text for p in result.pages)


class _HangsOnFirstPage(FakeEngine):
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        if request.images[0].index == 0:
            request = replace(request, prompt=request.prompt + "[[fake:hang]]")
        return super().generate(request)


async def test_closing_the_page_stream_cancels_the_pages_still_running(renderer):
    engine = _HangsOnFirstPage()
    service = await _service(renderer, engine)
    stream = service.read(_pdf_call())
    prep = (await anext(stream)).prep
    await anext(stream)  # page 2 or 3
    assert engine.active == {prep.request_id + "-p0"}
    await stream.aclose()
    assert not engine.active and list(engine.aborted) == [prep.request_id + "-p0"]


async def test_document_markdown_joins_the_pages(renderer):
    service = await _service(renderer)
    result = await result_of(service.read(_pdf_call(task=Task.DOCUMENT)))
    assert result.markdown == "\n\n".join(p.markdown for p in result.pages) and result.markdown.count("\n\n") >= 2


async def test_the_ui_runner_reads_a_pdf_page_by_page_with_the_same_dpi_and_sources(renderer):
    service = await _service(renderer)
    data = pdfs.mixed_pdf(["A TYPESET PAGE WITH ITS OWN TEXT LAYER"], ["SCANNED"])
    snaps = [s async for s in stream_run(service, _pdf_call(data, prefer_text_layer=True), every=0)]
    result = snaps[-1].result
    assert [(p.index, p.source, p.dpi) for p in result.pages] == [(0, "text_layer", 72), (1, "render", 208)]
