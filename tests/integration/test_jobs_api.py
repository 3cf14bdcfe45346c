"""/v1/jobs over real HTTP on loopback: rapidocr on rendered scans for the results, the fake engine (it
does no OCR) for cancellation and load; webhooks to a real receiver that checks the signature."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pdfs
import pytest
import requests
from imaging import Line, render, squash, to_bytes
from standardwebhooks import Webhook

from hyocr.engines.fake import FakeEngine, FakeScript

SCAN = pdfs.scanned_pdf([[f"PAGE {n} OF THREE"] for n in (1, 2, 3)])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _wait(url: str, job_id: str, *, timeout: float = 120, headers: dict | None = None) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = requests.get(f"{url}/v1/jobs/{job_id}", headers=headers, timeout=10).json()
        if job["status"] not in ("queued", "running"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not finish: {job}")


@pytest.fixture(scope="module")
def rapid_jobs():
    from servers import LiveServer

    from hyocr.config import load_settings

    server = LiveServer(load_settings(engine="rapidocr", ui=False, api_keys="alice-key,bob-key",
                                      job_range_pages=2)).start()
    yield server
    server.stop()


ALICE = {"Authorization": "Bearer alice-key"}
BOB = {"Authorization": "Bearer bob-key"}


def test_a_pdf_job_is_read_and_its_result_is_the_ocr_body(rapid_jobs):
    url = rapid_jobs.url
    r = requests.post(f"{url}/v1/jobs", json={"image": _b64(SCAN), "task": "text"}, headers=ALICE, timeout=60)
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["location"] == f"/v1/jobs/{job['id']}" and r.headers["retry-after"].isdigit()
    assert job["object"] == "ocr.job" and job["status"] in ("queued", "running") and job["pages"]["total"] == 3
    done = _wait(url, job["id"], headers=ALICE)
    assert done["status"] == "succeeded" and done["pages"] == {"total": 3, "done": 3, "failed": 0}
    assert done["expires_at"] > done["finished_at"] >= done["started_at"] >= done["created_at"]

    result = requests.get(f"{url}/v1/jobs/{job['id']}/result", headers=ALICE, timeout=10).json()
    assert result["id"] == job["id"] and [p["index"] for p in result["pages"]] == [0, 1, 2]
    for n, page in enumerate(result["pages"], 1):
        assert f"PAGE{n}OFTHREE" in squash(page["text"]), page["text"]
    # the same pages as /v1/ocr reads them
    direct = requests.post(f"{url}/v1/ocr", json={"image": _b64(SCAN), "task": "text"}, headers=ALICE,
                           timeout=60).json()
    assert [p["text"] for p in result["pages"]] == [p["text"] for p in direct["pages"]]

    # pages, as stored: a cursor over seq, JSON or JSON lines, every position exactly once
    first = requests.get(f"{url}/v1/jobs/{job['id']}/pages?limit=2", headers=ALICE, timeout=10).json()
    assert len(first["data"]) == 2 and first["has_more"] is True
    rest = requests.get(f"{url}/v1/jobs/{job['id']}/pages?after={first['last_seq']}", headers=ALICE,
                        timeout=10).json()
    assert rest["has_more"] is False
    assert sorted(p["position"] for p in first["data"] + rest["data"]) == [0, 1, 2]
    lines = requests.get(f"{url}/v1/jobs/{job['id']}/pages", headers={**ALICE, "Accept": "application/x-ndjson"},
                         timeout=10)
    assert lines.headers["content-type"].startswith("application/x-ndjson")
    assert [json.loads(line)["seq"] for line in lines.text.splitlines()] == \
        [p["seq"] for p in first["data"] + rest["data"]]


def test_a_pdf_whose_first_pages_cannot_be_rendered_is_a_job_with_error_pages(rapid_jobs):
    # Its first page was rendered at submit and its failure refused the whole job with a 413, whatever the
    # selection; a range of such pages then gave every page the first one's message.
    giant, a4 = b"[0 0 14400 14400]", b"[0 0 595 842]"
    document = pdfs.pages_pdf([giant, giant, a4])
    for pages, expected in ((None, [0, 1, 2]), ("3", [2]), ("2-3", [1, 2])):
        body = {"image": _b64(document), "task": "text", **({"pages": pages} if pages else {})}
        r = requests.post(f"{rapid_jobs.url}/v1/jobs", json=body, headers=ALICE, timeout=60)
        assert r.status_code == 202, r.text
        done = _wait(rapid_jobs.url, r.json()["id"], headers=ALICE)
        result = requests.get(f"{rapid_jobs.url}/v1/jobs/{done['id']}/result", headers=ALICE, timeout=10).json()
        assert [p["index"] for p in result["pages"]] == expected
        for page in result["pages"]:
            failed = page["index"] < 2
            assert (page["finish_reason"] == "error") == failed, page
            if failed:
                assert page["error"].startswith(f"page {page['index'] + 1}:"), page
        assert done["pages"]["failed"] == sum(i < 2 for i in expected)
    # A document of one page that cannot be rendered is refused at submit, saying why, as before; one page
    # selected alone fails its job with that page's own message (it said "every page failed", not why).
    r = requests.post(f"{rapid_jobs.url}/v1/jobs", json={"image": _b64(pdfs.pages_pdf([giant])), "task": "text"},
                      headers=ALICE, timeout=60)
    assert r.status_code == 413 and "inches" in r.json()["error"]["message"], r.text
    r = requests.post(f"{rapid_jobs.url}/v1/jobs", json={"image": _b64(document), "task": "text", "pages": "1"},
                      headers=ALICE, timeout=60)
    done = _wait(rapid_jobs.url, r.json()["id"], headers=ALICE)
    assert done["status"] == "failed" and "inches" in done["error"]["message"], done


def test_a_retried_submit_with_the_same_key_is_the_same_job(rapid_jobs):
    card = _b64(to_bytes(render([Line("IDEMPOTENT 42", (40, 40), 48)], size=(640, 160)).image))
    body = {"images": [card, card], "task": "text"}
    headers = {**ALICE, "Idempotency-Key": "retry-me-1"}
    first = requests.post(f"{rapid_jobs.url}/v1/jobs", json=body, headers=headers, timeout=60)
    again = requests.post(f"{rapid_jobs.url}/v1/jobs", json=body, headers=headers, timeout=60)
    assert first.status_code == 202 and again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other = requests.post(f"{rapid_jobs.url}/v1/jobs", json=body, headers={**BOB, "Idempotency-Key": "retry-me-1"},
                          timeout=60)
    assert other.status_code == 202 and other.json()["id"] != first.json()["id"]  # keys are per caller
    done = _wait(rapid_jobs.url, first.json()["id"], headers=ALICE)
    result = requests.get(f"{rapid_jobs.url}/v1/jobs/{done['id']}/result", headers=ALICE, timeout=10).json()
    assert [p["index"] for p in result["pages"]] == [0, 1]  # images numbered through the job
    assert all("IDEMPOTENT42" in squash(p["text"]) for p in result["pages"])
    mine = requests.get(f"{rapid_jobs.url}/v1/jobs?limit=100", headers=ALICE, timeout=10).json()
    assert done["id"] in [j["id"] for j in mine["data"]] and other.json()["id"] not in [j["id"] for j in mine["data"]]


def test_another_caller_can_neither_read_nor_cancel_a_job(rapid_jobs):
    job = requests.post(f"{rapid_jobs.url}/v1/jobs", json={"image": _b64(SCAN), "task": "text"}, headers=ALICE,
                        timeout=60).json()
    for method, path in (("get", ""), ("get", "/result"), ("get", "/pages"), ("delete", ""), ("post", "/cancel")):
        r = requests.request(method, f"{rapid_jobs.url}/v1/jobs/{job['id']}{path}", headers=BOB, timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "job_not_found", (method, path, r.text)
    assert _wait(rapid_jobs.url, job["id"], headers=ALICE)["status"] == "succeeded"  # untouched by Bob


def test_bad_submissions_are_clear_json_errors(rapid_jobs):
    url = rapid_jobs.url
    cases = [
        ({"image": "%%%"}, 400),
        ({"image": _b64(b"not an image at all")}, 400),
        ({"image": _b64(SCAN), "pages": "7"}, 400),
        ({"image": _b64(SCAN), "stream": True}, 400),
        ({"image": _b64(SCAN), "callback_url": "http://169.254.169.254/latest"}, 400),
        ({"image": _b64(SCAN), "task": "nonsense"}, 400),
    ]
    for body, status in cases:
        r = requests.post(f"{url}/v1/jobs", json=body, headers=ALICE, timeout=60)
        assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}, r.text
    assert requests.get(f"{url}/v1/jobs/job-nope", headers=ALICE, timeout=10).status_code == 404
    assert requests.get(f"{url}/v1/jobs?limit=0", headers=ALICE, timeout=10).status_code == 400


# ---------------------------------------------------------------- the fake engine: cancel, load, retention


def _images(n: int) -> list[str]:
    return [_b64(to_bytes(render([Line(f"IMAGE {i}", (20, 20), 30)], size=(320, 96)).image)) for i in range(n)]


def test_cancel_stops_the_engines_work_and_a_running_result_is_409(fake_server_factory):
    engine = FakeEngine(FakeScript(hang=True))  # pages that never finish by themselves
    server = fake_server_factory(engine, ui=False, job_workers=1, job_range_pages=2, stall_timeout=0)
    job = requests.post(f"{server.url}/v1/jobs", json={"images": _images(6), "task": "text", "max_tokens": 4000},
                        timeout=30).json()
    deadline = time.monotonic() + 30
    while not engine.active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.active, "the job never reached the engine"
    early = requests.get(f"{server.url}/v1/jobs/{job['id']}/result", timeout=10)
    assert early.status_code == 409 and early.json()["error"]["code"] == "job_not_finished"
    reading = set(engine.active)
    cancelled = requests.post(f"{server.url}/v1/jobs/{job['id']}/cancel", timeout=10).json()
    assert cancelled["status"] == "cancelled"
    # a retried cancel (its answer lost) finds the job cancelled and leaves it: DELETE would delete it
    again = requests.post(f"{server.url}/v1/jobs/{job['id']}/cancel", timeout=10)
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    deadline = time.monotonic() + 30
    while not reading <= set(engine.aborted) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reading <= set(engine.aborted) and not engine.active  # the engine's work stopped
    time.sleep(0.5)
    assert not engine.active  # and no further range started
    gone = requests.get(f"{server.url}/v1/jobs/{job['id']}/result", timeout=10)
    assert gone.status_code == 409 and gone.json()["error"]["code"] == "job_cancelled"
    assert gone.json()["error"]["message"].endswith(" cancelled")  # said once ("cancelled: cancelled" before)
    deleted = requests.delete(f"{server.url}/v1/jobs/{job['id']}", timeout=10).json()
    assert deleted == {"id": job["id"], "object": "ocr.job.deleted", "deleted": True}
    assert requests.get(f"{server.url}/v1/jobs/{job['id']}", timeout=10).status_code == 404


def test_online_requests_keep_working_while_a_long_job_runs(fake_server_factory):
    engine = FakeEngine(FakeScript(token_delay=0.002))
    server = fake_server_factory(engine, ui=False, max_concurrency=8, job_workers=2, job_range_pages=4,
                                 max_images_per_request=8)
    job = requests.post(f"{server.url}/v1/jobs", json={"images": _images(8) * 1, "task": "text"}, timeout=30).json()
    single = _images(1)[0]
    answered = 0
    while requests.get(f"{server.url}/v1/jobs/{job['id']}", timeout=10).json()["status"] in ("queued", "running"):
        r = requests.post(f"{server.url}/v1/ocr", json={"image": single, "task": "text"}, timeout=30)
        assert r.status_code == 200, r.text
        answered += 1
    assert answered >= 1
    assert _wait(server.url, job["id"])["pages"]["done"] == 8


def test_a_finished_job_is_deleted_after_its_retention(fake_server_factory):
    server = fake_server_factory(ui=False, job_retention=1)
    job = requests.post(f"{server.url}/v1/jobs", json={"image": _images(1)[0], "task": "text"}, timeout=30).json()
    assert _wait(server.url, job["id"])["status"] == "succeeded"
    deadline = time.monotonic() + 20
    while requests.get(f"{server.url}/v1/jobs/{job['id']}", timeout=10).status_code != 404:
        assert time.monotonic() < deadline, "the job outlived its retention"
        time.sleep(0.2)


# ---------------------------------------------------------------- webhooks


class _Receiver(BaseHTTPRequestHandler):
    seen: list = []
    fail_first = True
    secret = ""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        try:
            Webhook(self.secret).verify(body, dict(self.headers))
            verified = True
        except Exception:
            verified = False
        type(self).seen.append((dict(self.headers), json.loads(body), verified))
        status = 500 if type(self).fail_first and len(type(self).seen) == 1 else 204
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_the_webhook_is_signed_and_retried_after_a_failed_delivery(fake_server_factory, tmp_path):
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        server = fake_server_factory(ui=False, webhook_secret=secret, media_fetch_allow_private=True)
        # the receiver verifies with the caller's own secret, as the README tells a user to fetch it
        mine = requests.get(f"{server.url}/v1/webhooks/secret", timeout=10).json()
        assert mine["object"] == "webhook_secret" and mine["secret"].startswith("whsec_") and mine["secret"] != secret
        _Receiver.seen, _Receiver.secret = [], mine["secret"]
        hook = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
        job = requests.post(f"{server.url}/v1/jobs", json={"image": _images(1)[0], "task": "text",
                                                           "callback_url": hook,
                                                           "callback_headers": {"X-Mine": "yes"}}, timeout=30).json()
        deadline = time.monotonic() + 60
        while len(_Receiver.seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        receiver.shutdown()
    assert len(_Receiver.seen) == 2, _Receiver.seen  # failed once (500), delivered on the retry
    (h1, _, v1), (h2, b2, v2) = _Receiver.seen
    assert v1 and v2 and h1["webhook-id"] == h2["webhook-id"] and h1["X-Mine"] == "yes"
    assert b2["type"] == "job.succeeded" and b2["data"]["id"] == job["id"] and b2["data"]["pages"]["done"] == 1


class _StallsOnce(FakeEngine):
    """Fault injection: the first read of the document's second page fails as a stalled engine's does (503)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    async def generate(self, request):
        self.asked.append(request.request_id)
        if request.request_id.endswith("-p1") and sum(r.endswith("-p1") for r in self.asked) == 1:
            from hyocr.pipeline.progress import stalled_error

            raise stalled_error(120)
        async for chunk in super().generate(request):
            yield chunk


def test_a_jobs_page_that_fails_retryably_is_read_again_not_kept_as_an_error_page(fake_server_factory):
    # An error page is final (a helper round saw a job "succeed" with 14 of 17 pages "stalled, retry"): a 5xx
    # on a page of background work fails the range's read, and the runner reads the pages not stored again.
    engine = _StallsOnce()
    server = fake_server_factory(engine, ui=False, job_workers=1, job_range_pages=3)
    job = requests.post(f"{server.url}/v1/jobs", json={"image": _b64(SCAN), "task": "text"}, timeout=30).json()
    done = _wait(server.url, job["id"], timeout=60)
    assert done["status"] == "succeeded" and done["pages"] == {"total": 3, "done": 3, "failed": 0}, done
    result = requests.get(f"{server.url}/v1/jobs/{job['id']}/result", timeout=10).json()
    assert [p["index"] for p in result["pages"]] == [0, 1, 2] and not any(p.get("error") for p in result["pages"])
    assert sum(r.endswith("-p1") for r in engine.asked) == 2
