"""``AsyncHyocrClient``: the asyncio client."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Self, Unpack

import httpx

from .base import _Base
from .calls import HEALTH, MODELS, READY, Call, ImageInput, OcrOptions, chat_call, ocr_call
from .results import OcrResult, read_events_async


class AsyncHyocrClient(_Base):
    """``HyocrClient`` on asyncio (httpx.AsyncClient): the same methods, as coroutines."""

    _http_class = httpx.AsyncClient
    _default_sleep = staticmethod(asyncio.sleep)

    async def _run(self, call: Call) -> Any:
        state = self._retry_state(call)
        while True:
            timeout, request_id = state.start()
            try:
                if call.on_page is None:
                    result: Any = await self._http.request(call.method, call.path, timeout=timeout,
                                                           headers={"X-Request-ID": request_id}, **call.kwargs)
                else:
                    async with self._http.stream(call.method, call.path, timeout=timeout,
                                                 headers={"X-Request-ID": request_id}, **call.kwargs) as result:
                        if result.is_success:
                            return await read_events_async(result.aiter_lines(), call.on_page)
                        await result.aread()
            except httpx.TransportError as exc:
                result = exc
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

    async def health(self) -> bool: return await self._run(HEALTH)
    async def ready(self) -> bool: return await self._run(READY)
    async def models(self) -> list[dict[str, Any]]: return await self._run(MODELS)
    async def aclose(self) -> None: await self._http.aclose()
    async def __aenter__(self) -> Self: return self
    async def __aexit__(self, *exc: object) -> None: await self.aclose()
