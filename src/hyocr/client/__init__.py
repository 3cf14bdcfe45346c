"""Python client for a hyocr server: ``HyocrClient`` (blocking) and ``AsyncHyocrClient`` (asyncio).

    with HyocrClient("http://127.0.0.1:8000") as client:
        print([(b.text, b.box) for b in client.ocr("card.png").pages[0].blocks])  # lines, pixel boxes

Images and PDFs given as bytes or paths are sent as a multipart upload, as they are (``ocr``, ``ocr_many``,
``submit_job``); a ``data:`` URL, text already, goes in a JSON body.

Retries (the reference article promises "a 3 s timeout and at most 2 retries"): ``timeout`` bounds each
attempt's whole answer (not each read: a server or proxy that trickles bytes is cut off at it), and for a
document (a PDF, a multi-page TIFF, ``ocr_many``) or a call with ``on_page``, which are read as the page
stream, the wait for each next page; ``total_timeout`` a whole call (by default, room for every attempt at
its full timeout plus the backoffs, moved on as a document's pages come, so it only bites on a long
``Retry-After``). Retried, at most ``max_retries`` times, after a
jittered exponential backoff or the server's ``Retry-After`` (capped at 10 s; one that ends past the
deadline is not waited for, the error is raised at once): connection failures (refused, connect timeout,
reset, a keep-alive connection the server had closed), 429, 503, 502/504 from a proxy, and read timeouts:
OCR and chat requests have no side effects, so a repeat is safe, and a stalled connection or a brief
overload may spare the next attempt (a ``Retry-After`` is waited out and a little more, at random, so that
clients turned away together do not return together). The server stops an attempt's work when the client
leaves, but work it had done is spent again by the retry (use ``max_retries=0`` with a saturated server). A
page stream cut after a page has been handed to ``on_page`` is not retried (the pages would come twice):
``ConnectionFailed``. Never retried: 400/401/403/404/413/415/422 (it would fail the
same way), 500 (the engine failed on this input, maybe after expensive work) and hyocr's own 504 (its
request deadline passed, and would again). Each attempt sends ``X-Request-ID: <call id>.<attempt>``, so the
server's logs tie retries together; exceptions carry that id (``request_id``) and ``attempts``.

Jobs (``/v1/jobs``: documents read in the background, durable on the server), the same on both clients::

    job = client.submit_job("report.pdf", task="text", pages="1-40")   # -> Job (status "queued")
    for position, page in client.iter_job_pages(job.id):               # pages as they are stored, any order
        print(position, page.text[:40])
    job = client.wait(job.id, timeout=600)     # polls every ``poll`` s (or the server's Retry-After)
    result = client.job_result(job.id)         # -> OcrResult, as ocr() gives; 409 ``Conflict`` if unfinished

``submit_job(image_or_images, *, idempotency_key=None, callback_url=None, callback_headers=None, **options)``
takes ``ocr``'s options (no ``on_page``) and always sends an ``Idempotency-Key`` (a uuid4 when none is
given): a submit retried after a lost answer gets the same job back, never a second one; give your own key
to re-attach to a job across processes. ``get_job(id) -> Job``, ``cancel_job(id) -> Job`` (an active
job cancelled; a finished one as it is: safe to retry), ``delete_job(id)`` (cancelled first if active),
``list_jobs(limit=20, after=None) -> JobList`` (newest first; ``after``: the last id seen),
``wait(id, *, poll=1.0, timeout=None) -> Job`` (finished: ``job.finished``; ``Timeout`` when it is not by
then) and ``iter_job_pages(id, *, poll=1.0, timeout=None)`` -> (position, Page) (an async iterator on
``AsyncHyocrClient``), following the pages' ``seq`` cursor until the job is finished and no pages remain.
Each job request is one ``Call`` with the retries above.

Layout: ``errors`` (the exception tree), ``retry`` (``RetryState``), ``results`` (``OcrResult`` and the
event stream), ``calls`` (what each call sends), ``jobs`` (``Job``, the job calls, the polling waits),
``base``, ``sync`` and ``aio`` (the clients).
"""

from __future__ import annotations

from .aio import AsyncHyocrClient
from .calls import HEALTH, MODELS, READY, Call, ImageInput, OcrOptions, chat_call, ocr_call
from .errors import (
    APIError,
    AuthenticationError,
    BadRequest,
    Conflict,
    ConnectionFailed,
    HyocrClientError,
    NotFound,
    PermissionDenied,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    Timeout,
    error_from_response,
    error_from_transport,
)
from .jobs import Job, JobList, JobPages, Poller
from .results import Block, OcrResult, Page, read_events, read_events_async
from .retry import BACKOFF_CAP, RETRY_AFTER_CAP, RetryState
from .sync import HyocrClient

__all__ = [  # noqa: RUF022 (clients, results, then the exception tree)
    "HyocrClient", "AsyncHyocrClient", "OcrOptions", "OcrResult", "Page", "Block", "Job", "JobPages",
    "JobList",
    "HyocrClientError", "Timeout", "ConnectionFailed", "APIError", "BadRequest", "AuthenticationError",
    "PermissionDenied", "NotFound", "Conflict", "RateLimited", "ServerError", "ServiceUnavailable",
    # the parts both clients are built of (tests and the server's own tools use them)
    "RetryState", "BACKOFF_CAP", "RETRY_AFTER_CAP", "Call", "ImageInput", "ocr_call", "chat_call",
    "HEALTH", "READY", "MODELS", "read_events", "read_events_async", "error_from_response",
    "error_from_transport", "Poller"]
