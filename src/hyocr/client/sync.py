"""``HyocrClient``: the blocking client."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Self, Unpack

import httpx

from .base import _Base
from .calls import HEALTH, MODELS, READY, Call, ImageInput, OcrOptions, chat_call, ocr_call
from .results import OcrResult, read_events


class HyocrClient(_Base):
    """Blocking client (httpx.Client): close it, or use it as a context manager."""

    _http_class = httpx.Client
    _default_sleep = staticmethod(time.sleep)

    def _run(self, call: Call) -> Any:
        state = self._retry_state(call)
        while True:
            timeout, request_id = state.start()
            try:
                if call.on_page is None:
                    result: Any = self._http.request(call.method, call.path, timeout=timeout,
                                                     headers={"X-Request-ID": request_id}, **call.kwargs)
                else:
                    with self._http.stream(call.method, call.path, timeout=timeout,
                                           headers={"X-Request-ID": request_id}, **call.kwargs) as result:
                        if result.is_success:
                            return read_events(result.iter_lines(), call.on_page)
                        result.read()
            except httpx.TransportError as exc:
                result = exc
            done, value = self._settle(state, call, result, timeout, request_id)
            if done:
                return value
            self._sleep(value)

    def ocr(self, image: ImageInput, **options: Unpack[OcrOptions]) -> OcrResult:
        """Read one image or PDF: bytes, a path (str or Path), or a ``data:`` URL."""
        return self._run(ocr_call([image], options))

    def ocr_many(self, images: Sequence[ImageInput], **options: Unpack[OcrOptions]) -> OcrResult:
        """Read several images as the pages of one request: one result, ``pages`` in order."""
        return self._run(ocr_call(images, options, many=True))

    def chat(self, messages: list[dict], *, timeout: float | None = None, **body: Any) -> dict:
        """POST /v1/chat/completions, not streaming; ``body``: the rest of the OpenAI request."""
        return self._run(chat_call(messages, timeout, body))

    # Related one-liners. health: the process answers; ready: the engine is loaded and answering. Both
    # report the state now: one attempt, False on any failure (503, unreachable).
    def health(self) -> bool: return self._run(HEALTH)
    def ready(self) -> bool: return self._run(READY)
    def models(self) -> list[dict[str, Any]]: return self._run(MODELS)
    def close(self) -> None: self._http.close()
    def __enter__(self) -> Self: return self
    def __exit__(self, *exc: object) -> None: self.close()
