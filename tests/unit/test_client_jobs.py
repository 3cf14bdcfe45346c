"""hyocr.client's job methods over httpx.MockTransport: what each sends, the Idempotency-Key that makes a
retried submit safe, the seq cursor of iter_job_pages, and wait's polling (no real sleeping)."""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import json

import httpx
import pytest

from hyocr import client as hc
from hyocr.client import AsyncHyocrClient, HyocrClient

OCR_BODY = {
    "id": "ocr-1", "object": "ocr.result", "created": 1, "model": "m", "engine": "fake", "task": "text",
    "requested_task": "text", "text": "A\nB", "pages": [], "usage": {}, "timings": {},
}


def page(index: int, text: str) -> dict:
    return {"index": index, "width": 10, "height": 5, "text": text, "finish_reason": "stop", "blocks": []}


def job(status: str = "queued", done: int = 0) -> dict:
    return {"id": "job-1", "object": "ocr.job", "status": status, "created_at": 1, "started_at": None,
            "finished_at": None, "expires_at": None, "task": "text", "pages": {"total": 2, "done": done,
            "failed": 0}, "queue_position": 0 if status == "queued" else None, "error": None}


class Server:
    """A scripted jobs API: answers by (method, path); records every request."""

    def __init__(self, routes: dict) -> None:
        self.routes, self.requests = {k: list(v) for k, v in routes.items()}, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answers = self.routes[(request.method, request.url.path)]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer(request) if callable(answer) else answer


def clients(server: Server):
    sleeps: list[float] = []
    transport = httpx.MockTransport(server)
    sync = HyocrClient("http://t", transport=transport, sleep=sleeps.append)

    async def asleep(s: float) -> None:
        sleeps.append(s)
    aio = AsyncHyocrClient("http://t", transport=transport, sleep=asleep)
    return sync, aio, sleeps


def form_of(request: httpx.Request) -> tuple[dict[str, str], list[tuple[str, bytes]]]:
    """A multipart request's text fields, and its files as (field, bytes) in the order sent."""
    head = f"Content-Type: {request.headers['content-type']}\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + request.content)
    fields, files = {}, []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if part.get_filename() is None:
            fields[name] = part.get_content()
        else:
            files.append((name, part.get_payload(decode=True)))
    return fields, files


def test_submit_uploads_files_with_an_idempotency_key_kept_across_retries():
    server = Server({("POST", "/v1/jobs"): [httpx.ReadTimeout("lost"), httpx.Response(
        202, json=job(), headers={"Location": "/v1/jobs/job-1", "Retry-After": "2"})]})
    sync, _, sleeps = clients(server)
    got = sync.submit_job(b"\x89PNG...", task="text", pages="1-2", callback_url="https://cb",
                          callback_headers={"X-A": "1"})
    assert isinstance(got, hc.Job) and got.id == "job-1" and not got.finished and got.retry_after == 2
    first, second = server.requests
    keys = {first.headers["idempotency-key"], second.headers["idempotency-key"]}
    # generated once per call: the retry cannot make two jobs
    assert len(sleeps) == 1 and len(keys) == 1 and len(keys.pop()) >= 32
    fields, files = form_of(second)  # the file as it is, not base64 in JSON
    assert files == [("file", b"\x89PNG...")] and form_of(first) == (fields, files)
    assert fields["task"] == "text" and fields["pages"] == "1-2" and "stream" not in fields
    assert fields["callback_url"] == "https://cb" and json.loads(fields["callback_headers"]) == {"X-A": "1"}
    sync.submit_job([b"a", b"b"], idempotency_key="mine")
    assert server.requests[-1].headers["idempotency-key"] == "mine"
    assert form_of(server.requests[-1])[1] == [("files", b"a"), ("files", b"b")]  # pages in order
    sync.submit_job("data:image/png;base64,QUJD")  # a data URL is text already: JSON
    assert json.loads(server.requests[-1].content)["image"] == "data:image/png;base64,QUJD"
    with pytest.raises(TypeError, match="does not stream"):
        sync.submit_job(b"a", on_page=print)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_iter_job_pages_follows_the_cursor_until_finished(mode):
    def pages(request: httpx.Request) -> httpx.Response:
        after = int(request.url.params["after"])
        stored = [(1, 1, page(1, "B")), (2, 0, page(0, "A")), (3, 2, page(2, "C"))]
        visible = stored[:2] if len([r for r in server.requests if r.url.path == "/v1/jobs/job-1"]) < 3 \
            else stored
        data = [{"seq": s, "position": p, "page": pg} for s, p, pg in visible if s > after][:1]
        return httpx.Response(200, json={"object": "list", "data": data,
                                         "has_more": bool(data) and data[-1]["seq"] < visible[-1][0]})
    server = Server({("GET", "/v1/jobs/job-1"): [
        httpx.Response(200, json=job("running", 0), headers={"Retry-After": "0.5"}),
        httpx.Response(200, json=job("running", 2)), httpx.Response(200, json=job("succeeded", 3))],
        ("GET", "/v1/jobs/job-1/pages"): [pages]})
    sync, aio, sleeps = clients(server)
    if mode == "sync":
        got = list(sync.iter_job_pages("job-1", poll=0.25))
    else:
        async def collect():
            return [x async for x in aio.iter_job_pages("job-1", poll=0.25)]
        got = asyncio.run(collect())
    assert [(p, pg.text) for p, pg in got] == [(1, "B"), (0, "A"), (2, "C")]  # each once, in stored order
    assert sleeps == [0.5, 0.25]  # the server's Retry-After, then the poll interval
    afters = [r.url.params["after"] for r in server.requests if r.url.path.endswith("/pages")]
    assert afters[0] == "0" and "2" in afters


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_wait_polls_then_result_and_times_out(mode):
    server = Server({("GET", "/v1/jobs/job-1"): [httpx.Response(200, json=job("queued")),
                                                 httpx.Response(200, json=job("running", 1),
                                                                headers={"Retry-After": "60"}),
                                                 httpx.Response(200, json=job("succeeded", 2))],
                     ("GET", "/v1/jobs/job-1/result"): [httpx.Response(200, json=OCR_BODY)]})
    sync, aio, sleeps = clients(server)
    run = (lambda c: c) if mode == "sync" else asyncio.run
    client = sync if mode == "sync" else aio
    done = run(client.wait("job-1", poll=0.1))
    assert done.finished and done.status == "succeeded" and done.pages.done == 2
    assert sleeps == [0.1, hc.RETRY_AFTER_CAP]  # a long Retry-After is capped
    assert run(client.job_result("job-1")).text == "A\nB"
    server.routes[("GET", "/v1/jobs/job-1")] = [httpx.Response(200, json=job("running"))]
    with pytest.raises(hc.Timeout, match="still running"):
        run(client.wait("job-1", poll=0.1, timeout=0))


def test_result_before_the_end_is_a_conflict_and_not_retried():
    server = Server({("GET", "/v1/jobs/job-1/result"): [httpx.Response(
        409, json={"error": {"message": "not yet", "type": "conflict", "code": "job_not_finished"}},
        headers={"Retry-After": "1"})]})
    sync, _, _ = clients(server)
    with pytest.raises(hc.Conflict) as info:
        sync.job_result("job-1")
    assert info.value.code == "job_not_finished" and info.value.retry_after == 1 and len(server.requests) == 1


def test_cancel_delete_list_and_get():
    deleted = {"id": "job-1", "object": "ocr.job.deleted", "deleted": True}
    server = Server({("POST", "/v1/jobs/job-1/cancel"): [httpx.Response(200, json=job("cancelled")),
                                                         httpx.Response(200, json=job("succeeded"))],
                     ("DELETE", "/v1/jobs/job-1"): [httpx.Response(200, json=job("cancelled")),
                                                    httpx.Response(200, json=deleted)],
                     ("GET", "/v1/jobs"): [httpx.Response(200, json={"object": "list", "data": [job()],
                                                                     "has_more": True})],
                     ("GET", "/v1/jobs/nope"): [httpx.Response(404, json={"error": {"message": "no job"}})]})
    sync, _, _ = clients(server)
    assert sync.cancel_job("job-1").status == "cancelled"
    assert sync.cancel_job("job-1").status == "succeeded"  # it had finished: answered as it is, not deleted
    sync.delete_job("job-1")  # active: cancelled, then deleted
    assert [r.method for r in server.requests] == ["POST", "POST", "DELETE", "DELETE"]
    page_ = sync.list_jobs(limit=5, after="job-0")
    assert page_.has_more and [j.id for j in page_] == ["job-1"] and len(page_) == 1
    params = server.requests[-1].url.params
    assert params["limit"] == "5" and params["after"] == "job-0"
    with pytest.raises(hc.NotFound):
        sync.get_job("nope")
