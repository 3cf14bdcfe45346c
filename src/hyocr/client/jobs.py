"""The jobs API (/v1/jobs): typed views (``Job``, ``JobList``), what each job call sends (``Call``, shared
by both clients) and the polling decisions of ``wait`` and ``iter_job_pages`` (``Poller``, no I/O)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from .calls import Call, ImageInput, OcrOptions, media_body, ocr_body
from .errors import Timeout
from .results import OcrResult, Page
from .retry import RETRY_AFTER_CAP

FINISHED = frozenset({"succeeded", "failed", "cancelled"})


@dataclass(frozen=True, slots=True)
class JobPages:
    total: int
    done: int
    failed: int


@dataclass(frozen=True, slots=True)
class Job:
    """A typed view of a job object; ``raw`` is the JSON as received, ``retry_after`` the answer's
    Retry-After (seconds), when it had one."""

    id: str
    status: str  # queued | running | succeeded | failed | cancelled
    task: str
    created_at: int
    started_at: int | None
    finished_at: int | None
    expires_at: int | None
    pages: JobPages
    queue_position: int | None
    error: dict[str, Any] | None  # {"message", "type", "code"} when failed
    raw: dict[str, Any] = field(repr=False, compare=False)
    retry_after: float | None = field(default=None, compare=False)

    @property
    def finished(self) -> bool:
        """succeeded, failed or cancelled: nothing will change but its expiry."""
        return self.status in FINISHED

    @classmethod
    def from_json(cls, body: dict[str, Any], retry_after: float | None = None) -> Job:
        pages = body.get("pages") or {}
        return cls(body["id"], body["status"], body.get("task", ""), body.get("created_at", 0),
                   body.get("started_at"), body.get("finished_at"), body.get("expires_at"),
                   JobPages(pages.get("total", 0), pages.get("done", 0), pages.get("failed", 0)),
                   body.get("queue_position"), body.get("error"), body, retry_after)


@dataclass(frozen=True, slots=True)
class JobList:
    """One page of ``list_jobs``, newest first; pass ``jobs[-1].id`` as ``after`` for the next."""

    jobs: list[Job]
    has_more: bool

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)


@dataclass(frozen=True, slots=True)
class PageChunk:
    """One answer of GET /v1/jobs/{id}/pages: (seq, position, page) in the order the pages were stored."""

    items: list[tuple[int, int, Page]]
    has_more: bool


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


def _job(response: httpx.Response) -> Job:
    return Job.from_json(response.json(), _retry_after(response))


def _job_or_none(response: httpx.Response) -> Job | None:
    body = response.json()
    return None if body.get("object") == "ocr.job.deleted" else Job.from_json(body, _retry_after(response))


def _path(job_id: str, tail: str = "") -> str:
    return f"/v1/jobs/{quote(job_id, safe='')}{tail}"


def submit_call(images: ImageInput | Sequence[ImageInput], options: OcrOptions, *,
                idempotency_key: str | None, callback_url: str | None,
                callback_headers: Mapping[str, str] | None) -> Call:
    """POST /v1/jobs, the images as ``media_body`` sends them (a multipart upload, or JSON for data URLs).
    Safe to retry: it carries an Idempotency-Key (a fresh uuid4 when the caller gives none), so a repeat after
    a lost answer returns the same job instead of a second one."""
    many = not isinstance(images, bytes | bytearray | memoryview | str | Path)
    if many and not images:
        raise ValueError("submit_job() takes an image, or a non-empty sequence of images")
    body, timeout, on_page = ocr_body(options)
    if on_page is not None:
        raise TypeError("a job does not stream: use iter_job_pages() for its pages as they finish")
    if callback_url is not None:
        body["callback_url"] = callback_url
    if callback_headers:
        body["callback_headers"] = dict(callback_headers)
    pages = list(images) if many else [images]  # type: ignore[list-item]
    key = idempotency_key or str(uuid.uuid4())
    return Call("POST", "/v1/jobs", media_body(pages, body, many=many), _job, timeout,
                headers={"Idempotency-Key": key})


def get_call(job_id: str) -> Call:
    return Call("GET", _path(job_id), {}, _job)


def cancel_call(job_id: str) -> Call:
    """POST .../cancel: an active job is cancelled, a finished one answered as it is (its job object). Safe to
    retry: DELETE, which deletes a finished job, would delete the job a lost answer had just cancelled."""
    return Call("POST", _path(job_id, "/cancel"), {}, _job)


def delete_call(job_id: str) -> Call:
    """DELETE: an active job is cancelled (its job object); a finished one is deleted (None)."""
    return Call("DELETE", _path(job_id), {}, _job_or_none)


def result_call(job_id: str) -> Call:
    return Call("GET", _path(job_id, "/result"), {}, lambda r: OcrResult.from_json(r.json()))


def webhook_secret_call() -> Call:
    """The caller's own webhook signing secret (whsec_...), which its receivers verify with."""
    return Call("GET", "/v1/webhooks/secret", {}, lambda r: str(r.json()["secret"]))


def list_call(limit: int, after: str | None) -> Call:
    params: dict[str, Any] = {"limit": limit, **({"after": after} if after else {})}
    return Call("GET", "/v1/jobs", {"params": params},
                lambda r: JobList([Job.from_json(j) for j in r.json()["data"]], bool(r.json()["has_more"])))


def pages_call(job_id: str, after: int, limit: int = 100) -> Call:
    def parse(r: httpx.Response) -> PageChunk:
        body = r.json()
        items = [(d["seq"], d["position"], Page.from_json(d["page"])) for d in body["data"]]
        return PageChunk(items, bool(body.get("has_more")))
    return Call("GET", _path(job_id, "/pages"), {"params": {"after": after, "limit": limit}}, parse)


class Poller:
    """The waits of ``wait`` and ``iter_job_pages`` (no I/O: both clients): ``poll`` seconds between
    looks, or the server's Retry-After when it sent one (capped at ``RETRY_AFTER_CAP``), never past the
    deadline; ``Timeout`` once the deadline has passed with the job unfinished."""

    def __init__(self, job_id: str, poll: float, timeout: float | None) -> None:
        if poll <= 0 or (timeout is not None and timeout < 0):
            raise ValueError("poll must be > 0, timeout >= 0")
        self.job_id, self.poll, self.timeout = job_id, poll, timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def pause(self, job: Job) -> float:
        """Seconds to sleep before looking at an unfinished ``job`` again; raises Timeout at the deadline."""
        wait = self.poll if job.retry_after is None else min(job.retry_after, RETRY_AFTER_CAP)
        if self.deadline is None:
            return wait
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise Timeout(f"job {self.job_id} is still {job.status} after {self.timeout:g} s")
        return min(wait, remaining)
