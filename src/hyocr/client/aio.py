"""``AsyncHyocrClient``: the asyncio client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Self, Unpack

import httpx

from .base import _Base
from .calls import HEALTH, MODELS, READY, Call, ImageInput, OcrOptions, chat_call, ocr_call
from .errors import error_from_response
from .jobs import (
    Job,
    JobList,
    Poller,
    cancel_call,
    delete_call,
    get_call,
    list_call,
    pages_call,
    result_call,
    submit_call,
    webhook_secret_call,
)
from .results import (
    Delivered,
    OcrResult,
    Page,
    StreamedError,
    is_event_stream,
    paced,
    read_events_async,
    stream_cut,
)


class AsyncHyocrClient(_Base):
    """``HyocrClient`` on asyncio (httpx.AsyncClient): the same methods, as coroutines."""

    _http_class = httpx.AsyncClient
    _default_sleep = staticmethod(asyncio.sleep)

    async def _run(self, call: Call) -> Any:
        state = self._retry_state(call)
        while True:
            timeout, request_id = state.start()
            headers = {**(call.headers or {}), "X-Request-ID": request_id}
            pages = Delivered(call.on_page)
            result: Any
            try:
                async with asyncio.timeout(timeout) as limit:  # the whole answer, not each read (sync.py: why)
                    async with self._http.stream(call.method, call.path, timeout=timeout, headers=headers,
                                                 **call.kwargs) as response:
                        if not (call.stream and is_event_stream(response)):
                            await response.aread()
                            result = response
                        else:  # a page stream: the wait for each page is bounded (sync.py: the errors)
                            try:
                                return await read_events_async(
                                    paced(response.aiter_lines(), limit, timeout, state), pages)
                            except StreamedError as exc:
                                result = exc.as_response(response)
                                if pages.count:
                                    raise error_from_response(result) from None
            except TimeoutError:
                result = httpx.ReadTimeout(f"no whole answer within {timeout:g} s")
            except httpx.TransportError as exc:
                result = exc
            if pages.count and isinstance(result, httpx.TransportError):  # a retry would repeat given pages
                raise stream_cut(result, pages.count, request_id) from result
            done, value = self._settle(state, call, result, timeout, request_id)
            if done:
                return value
            await self._sleep(value)

    async def ocr(self, image: ImageInput, **options: Unpack[OcrOptions]) -> OcrResult:
        return await self._run(ocr_call([image], options))

    async def ocr_many(self, images: Sequence[ImageInput], **options: Unpack[OcrOptions]) -> OcrResult:
        return await self._run(ocr_call(images, options, many=True))

    async def chat(self, messages: list[dict], *, timeout: float | None = None, **body: Any) -> dict:
        return await self._run(chat_call(messages, timeout, body))

    async def submit_job(self, image_or_images: ImageInput | Sequence[ImageInput], *,
                         idempotency_key: str | None = None, callback_url: str | None = None,
                         callback_headers: Mapping[str, str] | None = None,
                         **options: Unpack[OcrOptions]) -> Job:
        return await self._run(submit_call(image_or_images, options, idempotency_key=idempotency_key,
                                           callback_url=callback_url, callback_headers=callback_headers))

    async def get_job(self, job_id: str) -> Job: return await self._run(get_call(job_id))

    async def webhook_secret(self) -> str:
        """This caller's webhook signing secret (whsec_...): what its receivers verify events with."""
        return await self._run(webhook_secret_call())
    async def job_result(self, job_id: str) -> OcrResult: return await self._run(result_call(job_id))
    async def cancel_job(self, job_id: str) -> Job: return await self._run(cancel_call(job_id))

    async def delete_job(self, job_id: str) -> None:
        if await self._run(delete_call(job_id)) is not None:
            await self._run(delete_call(job_id))

    async def list_jobs(self, limit: int = 20, after: str | None = None) -> JobList:
        return await self._run(list_call(limit, after))

    async def wait(self, job_id: str, *, poll: float = 1.0, timeout: float | None = None) -> Job:
        poller = Poller(job_id, poll, timeout)
        while not (job := await self.get_job(job_id)).finished:
            await self._sleep(poller.pause(job))
        return job

    async def iter_job_pages(self, job_id: str, *, poll: float = 1.0,
                             timeout: float | None = None) -> AsyncIterator[tuple[int, Page]]:
        poller, after = Poller(job_id, poll, timeout), 0
        while True:
            job = await self.get_job(job_id)
            while True:
                chunk = await self._run(pages_call(job_id, after))
                for seq, position, page in chunk.items:
                    after = seq
                    yield position, page
                if not (chunk.has_more and chunk.items):
                    break
            if job.finished:
                return
            await self._sleep(poller.pause(job))

    async def health(self) -> bool: return await self._run(HEALTH)
    async def ready(self) -> bool: return await self._run(READY)
    async def models(self) -> list[dict[str, Any]]: return await self._run(MODELS)
    async def aclose(self) -> None: await self._http.aclose()
    async def __aenter__(self) -> Self: return self
    async def __aexit__(self, *exc: object) -> None: await self.aclose()
