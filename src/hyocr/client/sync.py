"""``HyocrClient``: the blocking client."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
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
    read_events,
    stream_cut,
    whole,
    within,
)


class HyocrClient(_Base):
    """Blocking client (httpx.Client): close it, or use it as a context manager."""

    _http_class = httpx.Client
    _default_sleep = staticmethod(time.sleep)

    def _run(self, call: Call) -> Any:
        state = self._retry_state(call)
        while True:
            timeout, request_id = state.start()
            headers = {**(call.headers or {}), "X-Request-ID": request_id}
            # The attempt's timeout bounds its whole answer, not each read: httpx's timeouts are per read, and
            # a server that trickles a byte a second would hold the call for ever (a slow proxy, a stuck one).
            deadline = time.monotonic() + timeout
            pages = Delivered(call.on_page)
            result: Any
            try:
                with self._http.stream(call.method, call.path, timeout=timeout, headers=headers,
                                       **call.kwargs) as response:
                    if not (call.stream and is_event_stream(response)):
                        result = whole(within(response.iter_raw(), deadline, response), response)
                    else:
                        try:
                            return read_events(within(response.iter_lines(), deadline, response, idle=timeout,
                                                      state=state), pages)
                        except StreamedError as exc:  # decided as that answer before the stream would be
                            result = exc.as_response(response)
                            if pages.count:  # ... unless pages were handed over: a retry would give them again
                                raise error_from_response(result) from None
            except httpx.TransportError as exc:
                if pages.count:  # cut mid-stream: a retry would hand the pages already given over again
                    raise stream_cut(exc, pages.count, request_id) from exc
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

    # ------------------------------------------------------------------ jobs (/v1/jobs)

    def submit_job(self, image_or_images: ImageInput | Sequence[ImageInput], *,
                   idempotency_key: str | None = None, callback_url: str | None = None,
                   callback_headers: Mapping[str, str] | None = None,
                   **options: Unpack[OcrOptions]) -> Job:
        """Queue a document (an image, a PDF, or several images as pages) to be read in the background."""
        return self._run(submit_call(image_or_images, options, idempotency_key=idempotency_key,
                                     callback_url=callback_url, callback_headers=callback_headers))

    def get_job(self, job_id: str) -> Job: return self._run(get_call(job_id))

    def webhook_secret(self) -> str:
        """This caller's webhook signing secret (whsec_...): what its receivers verify events with."""
        return self._run(webhook_secret_call())
    def job_result(self, job_id: str) -> OcrResult: return self._run(result_call(job_id))

    def cancel_job(self, job_id: str) -> Job:
        """Cancel an active job (status cancelled); a finished one is answered as it is, never deleted (a retry
        of a cancel whose answer was lost finds it cancelled)."""
        return self._run(cancel_call(job_id))

    def delete_job(self, job_id: str) -> None:
        """Delete a job and its result, cancelling it first if it is still active."""
        if self._run(delete_call(job_id)) is not None:
            self._run(delete_call(job_id))

    def list_jobs(self, limit: int = 20, after: str | None = None) -> JobList:
        """The caller's jobs, newest first; ``after``: the last job id of the previous page."""
        return self._run(list_call(limit, after))

    def wait(self, job_id: str, *, poll: float = 1.0, timeout: float | None = None) -> Job:
        """The job once finished (succeeded, failed or cancelled); raises ``Timeout`` after ``timeout`` s."""
        poller = Poller(job_id, poll, timeout)
        while not (job := self.get_job(job_id)).finished:
            self._sleep(poller.pause(job))
        return job

    def iter_job_pages(self, job_id: str, *, poll: float = 1.0,
                       timeout: float | None = None) -> Iterator[tuple[int, Page]]:
        """(position, page) for each page as the job stores it (any order), until the job is finished and
        every page has been given; raises ``Timeout`` after ``timeout`` s."""
        poller, after = Poller(job_id, poll, timeout), 0
        while True:
            job = self.get_job(job_id)  # before the pages: finished now, the pages read next are all of them
            while True:
                chunk = self._run(pages_call(job_id, after))
                for seq, position, page in chunk.items:
                    after = seq
                    yield position, page
                if not (chunk.has_more and chunk.items):
                    break
            if job.finished:
                return
            self._sleep(poller.pause(job))

    # Related one-liners. health: the process answers; ready: the engine is loaded and answering. Both
    # report the state now: one attempt, False on any failure (503, unreachable).
    def health(self) -> bool: return self._run(HEALTH)
    def ready(self) -> bool: return self._run(READY)
    def models(self) -> list[dict[str, Any]]: return self._run(MODELS)
    def close(self) -> None: self._http.close()
    def __enter__(self) -> Self: return self
    def __exit__(self, *exc: object) -> None: self.close()
