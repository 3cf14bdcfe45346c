"""The jobs API under the inputs a hostile or unlucky client sends, over real HTTP: integers past SQLite's
range, a corrupt image among good ones, a reused Idempotency-Key, a caller filling the queue, a slow
webhook receiver, a callback host whose name server never answers."""

from __future__ import annotations

import base64
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from imaging import Line, render, to_bytes

from hyocr.engines.fake import FakeEngine, FakeScript

ALICE = {"Authorization": "Bearer alice-key"}
BOB = {"Authorization": "Bearer bob-key"}
KEYS = "alice-key,bob-key"


def _png(text: str = "GOOD PAGE 1") -> bytes:
    return to_bytes(render([Line(text, (20, 20), 30)], size=(360, 96)).image)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _finished(url: str, job_id: str, headers: dict | None = None, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = requests.get(f"{url}/v1/jobs/{job_id}", headers=headers, timeout=10).json()
        if job["status"] not in ("queued", "running"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish: {job}")


def _is_error(r: requests.Response, status: int, code: str | None = None) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code, error


@pytest.mark.parametrize("after", [str(2**63), str(-(2**63) - 1), str(10**30), "-1", "1e3", "nan"])
def test_integer_query_parameters_are_bounded_before_the_database(fake_server_factory, after):
    server = fake_server_factory(ui=False)
    job = requests.post(f"{server.url}/v1/jobs", json={"image": _b64(_png()), "task": "text"}, timeout=30).json()
    _finished(server.url, job["id"])
    for accept in ("application/json", "application/x-ndjson"):
        r = requests.get(f"{server.url}/v1/jobs/{job['id']}/pages?after={after}", headers={"Accept": accept},
                         timeout=10)
        _is_error(r, 400)
        assert r.json()["error"]["param"] == "after"
    for query in (f"limit={10**20}", f"limit={-(2**63)}", "limit=0"):
        _is_error(requests.get(f"{server.url}/v1/jobs/{job['id']}/pages?{query}", timeout=10), 400)
        _is_error(requests.get(f"{server.url}/v1/jobs?{query}", timeout=10), 400)
    _is_error(requests.get(f"{server.url}/v1/jobs?after={'j' * 10_000}", timeout=10), 400)
    # the largest allowed cursor is an empty page, not an error
    top = requests.get(f"{server.url}/v1/jobs/{job['id']}/pages?after={2**53 - 1}", timeout=10)
    assert top.status_code == 200 and top.json()["data"] == []


def test_a_corrupt_image_fails_its_own_page_only(fake_server_factory):
    server = fake_server_factory(ui=False, job_range_pages=4)
    good = _png("GOOD PAGE 1")
    corrupt = _png("BAD PAGE 2")
    corrupt = corrupt[: len(corrupt) * 2 // 3]  # the header is whole, the pixels cut short
    r = requests.post(f"{server.url}/v1/jobs", json={"images": [_b64(good), _b64(corrupt), _b64(good)],
                                                     "task": "text"}, timeout=30)
    assert r.status_code == 202, r.text  # the headers are fine: the decode fails when the job runs
    job = _finished(server.url, r.json()["id"])
    assert job["status"] == "succeeded" and job["pages"] == {"total": 3, "done": 3, "failed": 1}, job
    pages = requests.get(f"{server.url}/v1/jobs/{job['id']}/result", timeout=10).json()["pages"]
    assert [p["index"] for p in pages] == [0, 1, 2]
    assert "error" not in pages[0] and "error" not in pages[2] and pages[0]["finish_reason"] != "error"
    assert pages[1]["finish_reason"] == "error" and "corrupt" in pages[1]["error"]


def test_an_idempotency_key_reused_for_another_document_is_a_422(fake_server_factory):
    server = fake_server_factory(ui=False, api_keys=KEYS)
    first_doc, other_doc = _png("FIRST DOCUMENT"), _png("ANOTHER DOCUMENT")
    headers = {**ALICE, "Idempotency-Key": "batch-0001"}
    first = requests.post(f"{server.url}/v1/jobs", json={"image": _b64(first_doc), "task": "text"},
                          headers=headers, timeout=30)
    assert first.status_code == 202
    # the same document again, as a data URL and as an upload: the same request, the same job
    for again in (
        requests.post(f"{server.url}/v1/jobs", json={"image": "data:image/png;base64," + _b64(first_doc),
                                                     "task": "text"}, headers=headers, timeout=30),
        requests.post(f"{server.url}/v1/jobs", files={"file": ("a.png", first_doc, "image/png")},
                      data={"task": "text"}, headers=headers, timeout=30),
    ):
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text
    for changed in ({"image": _b64(other_doc), "task": "text"}, {"image": _b64(first_doc), "task": "spotting"}):
        r = requests.post(f"{server.url}/v1/jobs", json=changed, headers=headers, timeout=30)
        _is_error(r, 422, "idempotency_key_reused")
        assert first.json()["id"] in r.json()["error"]["message"]
    # keys are per caller: Bob's batch-0001 is his own
    assert requests.post(f"{server.url}/v1/jobs", json={"image": _b64(other_doc), "task": "text"},
                         headers={**BOB, "Idempotency-Key": "batch-0001"}, timeout=30).status_code == 202
    mine = requests.get(f"{server.url}/v1/jobs", headers=ALICE, timeout=10).json()["data"]
    assert [j["id"] for j in mine] == [first.json()["id"]]  # nothing stored by the refused submits


def test_queue_positions_and_caps_are_per_caller(fake_server_factory):
    engine = FakeEngine(FakeScript(hang=True))  # nothing finishes: everything submitted stays active
    image = _b64(_png())
    server = fake_server_factory(engine, ui=False, api_keys=KEYS, job_workers=1, job_max_active=3,
                                 job_max_stored_bytes=3 * len(_png()) + 10, stall_timeout=0)
    jobs = [requests.post(f"{server.url}/v1/jobs", json={"image": image, "task": "text", "max_tokens": 5000},
                          headers=BOB, timeout=30).json() for _ in range(3)]
    deadline = time.monotonic() + 30
    while requests.get(f"{server.url}/v1/jobs/{jobs[0]['id']}", headers=BOB, timeout=10).json()["status"] \
            != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    theirs = requests.post(f"{server.url}/v1/jobs", json={"image": image, "task": "text"}, headers=ALICE,
                           timeout=30).json()
    assert theirs["queue_position"] == 0  # Bob's queued jobs ahead are not counted for Alice
    positions = [requests.get(f"{server.url}/v1/jobs/{j['id']}", headers=BOB, timeout=10).json()["queue_position"]
                 for j in jobs[1:]]
    assert positions == [0, 1]
    # Bob is at JOB_MAX_ACTIVE: a 429 with Retry-After, nothing stored; Alice is not
    over = requests.post(f"{server.url}/v1/jobs", json={"image": image, "task": "text"}, headers=BOB, timeout=30)
    _is_error(over, 429, "too_many_jobs")
    assert over.headers["retry-after"].isdigit()
    assert len(requests.get(f"{server.url}/v1/jobs", headers=BOB, timeout=10).json()["data"]) == 3
    # Alice's stored bytes: one image held; three more would pass the cap
    two = requests.post(f"{server.url}/v1/jobs", json={"images": [image, image], "task": "text"}, headers=ALICE,
                        timeout=30)
    assert two.status_code == 202, two.text
    bytes_over = requests.post(f"{server.url}/v1/jobs", json={"image": image, "task": "text"}, headers=ALICE,
                               timeout=30)
    _is_error(bytes_over, 429, "too_many_job_bytes")
    assert bytes_over.headers["retry-after"].isdigit()
    # cancelling frees the caller's room
    requests.delete(f"{server.url}/v1/jobs/{jobs[2]['id']}", headers=BOB, timeout=10)
    assert requests.post(f"{server.url}/v1/jobs", json={"image": image, "task": "text"}, headers=BOB,
                         timeout=30).status_code == 202


def test_a_document_larger_than_the_callers_allowance_is_a_413(fake_server_factory):
    server = fake_server_factory(ui=False, job_max_stored_bytes=1000)
    r = requests.post(f"{server.url}/v1/jobs", json={"image": _b64(_png()), "task": "text"}, timeout=30)
    _is_error(r, 413)


class _Receiver(BaseHTTPRequestHandler):
    """Records (path, time) of each delivery; paths under /slow answer after ``delay`` seconds."""

    seen: list = []
    delay = 0.0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        type(self).seen.append((self.path, time.monotonic()))
        if self.path.startswith("/slow"):
            time.sleep(type(self).delay)
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def _receiver() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_slow_webhook_receiver_delays_only_its_own_deliveries(fake_server_factory):
    _Receiver.seen, _Receiver.delay = [], 30.0  # answers long after the 8 s delivery timeout
    slow, fast = _receiver(), _receiver()  # two receivers: another port is another host:port
    try:
        server = fake_server_factory(ui=False, api_keys=KEYS, media_fetch_allow_private=True, webhook_timeout=8,
                                     job_max_running=8, job_workers=8)
        slow_hook = f"http://127.0.0.1:{slow.server_address[1]}/slow"
        jobs = [requests.post(f"{server.url}/v1/jobs", json={"image": _b64(_png()), "task": "text",
                                                             "callback_url": f"{slow_hook}/{n}"},
                              headers=ALICE, timeout=30).json() for n in range(6)]
        for job in jobs:
            _finished(server.url, job["id"], ALICE)
        deadline = time.monotonic() + 20
        while sum(p.startswith("/slow") for p, _ in _Receiver.seen) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        # the slow receiver holds its four slots now; another caller's webhook goes to another receiver
        theirs = requests.post(f"{server.url}/v1/jobs", json={
            "image": _b64(_png()), "task": "text", "callback_url": f"http://127.0.0.1:{fast.server_address[1]}/ok"},
            headers=BOB, timeout=30).json()
        done_at = time.monotonic()
        _finished(server.url, theirs["id"], BOB)
        deadline = time.monotonic() + 30
        while not any(p == "/ok" for p, _ in _Receiver.seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        arrived = [t for p, t in _Receiver.seen if p == "/ok"]
        assert arrived, "the fast receiver's webhook never arrived"
        # one at a time it would wait behind six 8 s timeouts; concurrently it waits for nothing
        assert arrived[0] - done_at < 6.0, arrived[0] - done_at
        slow_seen = [p for p, _ in _Receiver.seen if p.startswith("/slow")]
        assert len(slow_seen) <= 4 + 2  # never more than WEBHOOK_HOST_CONCURRENCY at once, retries aside
    finally:
        slow.shutdown()
        fast.shutdown()


def test_a_callback_host_that_never_resolves_is_refused_in_seconds(fake_server_factory, monkeypatch):
    import asyncio

    from hyocr.pipeline import fetch

    async def never(host: str, port: int):
        await asyncio.sleep(3600)

    monkeypatch.setattr(fetch, "resolve_host", never)
    server = fake_server_factory(ui=False)
    started = time.monotonic()
    r = requests.post(f"{server.url}/v1/jobs", json={"image": _b64(_png()), "task": "text",
                                                     "callback_url": "https://hooks.slow-dns.example/x"}, timeout=60)
    _is_error(r, 400, "fetch_failed")
    assert r.json()["error"]["param"] == "callback_url" and "resolve" in r.json()["error"]["message"]
    assert time.monotonic() - started < 30
    assert requests.get(f"{server.url}/v1/jobs", timeout=10).json()["data"] == []


@pytest.mark.parametrize("route", ["/v1/jobs", "/v1/ocr"])
@pytest.mark.parametrize("field", ["callback_headers", "schema"])
def test_json_form_fields_nested_past_the_interpreters_depth_are_a_400(fake_server_factory, route, field):
    """A multipart field that holds JSON, nested 100,000 deep: Python's parser raises RecursionError, which
    was a 500 with a traceback for callback_headers (found by a hostile client)."""
    server = fake_server_factory()
    deep = "[" * 100_000 + "]" * 100_000
    form = {field: deep, "callback_url": "https://example.com/hook"} if field == "callback_headers" else {
        field: deep}
    r = requests.post(f"{server.url}{route}", files={"file": ("a.png", _png(), "image/png")}, data=form,
                      timeout=30)
    if route == "/v1/ocr" and field == "callback_headers":  # not a field of /v1/ocr: refused by name
        assert r.status_code == 400, r.text
        return
    _is_error(r, 400)
    assert r.json()["error"]["param"] == field
    assert requests.get(f"{server.url}/health", timeout=10).status_code == 200


def test_a_jobs_database_that_cannot_be_written_is_a_retryable_503(fake_server_factory, monkeypatch, caplog):
    # Fault injection (a full disk cannot be made here without root's tmpfs): the store's write fails as SQLite's
    # does on a full disk. Was a bare 500 whose log line had lost the cause.
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from hyocr.jobs.store import JobStore

    server = fake_server_factory(ui=False)

    async def full(*args, **kwargs):
        raise OperationalError("INSERT INTO hyocr_jobs ...", {}, sqlite3.OperationalError("database or disk is full"))

    monkeypatch.setattr(JobStore, "submit", full)
    r = requests.post(f"{server.url}/v1/jobs", json={"image": _b64(_png()), "task": "text"}, timeout=30)
    assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
    error = r.json()["error"]
    assert error["code"] == "storage_unavailable" and "OperationalError" in error["message"]
    assert "disk is full" not in error["message"]  # the driver's words stay in the log
    assert any("database or disk is full" in rec.getMessage() for rec in caplog.records)
