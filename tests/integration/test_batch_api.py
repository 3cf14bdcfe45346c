"""The OpenAI Batch API over real HTTP on loopback, driven by the official ``openai`` SDK unchanged (and by
OpenAI's documented curl calls): rapidocr on rendered cards for /v1/ocr, /v1/chat/completions and
/v1/completions lines, each line answered as its online route answers; the fake engine (slow on purpose)
for cancellation."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time

import openai
import pytest
import requests
from imaging import Line, render, squash, to_bytes
from servers import LiveServer

from hyocr.config import load_settings
from hyocr.engines.fake import FakeEngine, FakeScript

ALICE, BOB = "alice-key", "bob-key"
WORDS = ("INVOICE 4711", "RECEIPT 2026", "TICKET 0815")


def _card(text: str) -> bytes:
    return to_bytes(render([Line(text, (30, 30), 44)], size=(560, 120)).image)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _jsonl(items: list[dict]) -> bytes:
    return "".join(json.dumps(item) + "\n" for item in items).encode()


def _client(server: LiveServer, key: str = ALICE) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)


def _until_ended(client: openai.OpenAI, batch_id: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.25)
    raise AssertionError(f"batch {batch_id} did not end: {batch}")


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [] if file_id is None else [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


@pytest.fixture(scope="module")
def rapid():
    server = LiveServer(load_settings(engine="rapidocr", ui=False, api_keys=f"{ALICE},{BOB}",
                                      job_range_pages=2)).start()
    yield server
    server.stop()


def test_the_sdk_runs_a_batch_of_ocr_lines_from_upload_to_download(rapid):
    client = _client(rapid)
    cards = {f"card-{n}": _card(text) for n, text in enumerate(WORDS)}
    requests_ = [{"custom_id": cid, "method": "POST", "url": "/v1/ocr", "body": {"image": _b64(png), "task": "text"}}
                 for cid, png in cards.items()]
    uploaded = client.files.create(file=("cards.jsonl", _jsonl(requests_)), purpose="batch")
    assert uploaded.id.startswith("file-") and uploaded.purpose == "batch" and uploaded.filename == "cards.jsonl"
    assert uploaded.bytes == len(_jsonl(requests_)) and uploaded.expires_at > uploaded.created_at
    assert client.files.retrieve(uploaded.id).id == uploaded.id

    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/ocr", completion_window="24h",
                                  metadata={"run": "cards"})
    assert batch.id.startswith("batch_") and batch.status == "validating" and batch.metadata == {"run": "cards"}
    done = _until_ended(client, batch.id)
    assert done.status == "completed" and done.error_file_id is None
    assert done.request_counts.total == 3 and done.request_counts.completed == 3 and done.request_counts.failed == 0
    assert done.completed_at >= done.finalizing_at >= done.in_progress_at >= done.created_at

    output = _lines(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(cards)  # each request answered once
    online = requests.post(f"{rapid.url}/v1/ocr", json={"image": _b64(cards["card-0"]), "task": "text"},
                           headers={"Authorization": f"Bearer {ALICE}"}, timeout=60).json()
    for line, text in zip(output, WORDS, strict=True):  # in input order
        assert set(line) == {"id", "custom_id", "response", "error"} and line["error"] is None
        assert line["id"].startswith("batch_req_") and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "ocr.result" and body["id"] == line["response"]["request_id"]
        assert squash(text) in squash(body["text"]), body["text"]
    assert output[0]["response"]["body"]["pages"][0]["text"] == online["pages"][0]["text"]  # as /v1/ocr reads it

    output_file = client.files.retrieve(done.output_file_id)
    assert output_file.purpose == "batch_output" and output_file.bytes == len(
        client.files.content(done.output_file_id).content)
    listed = [b.id for b in client.batches.list(limit=1)]  # the SDK's cursor pages, one batch each
    assert batch.id in listed
    assert {uploaded.id, done.output_file_id} <= {f.id for f in client.files.list()}
    assert {uploaded.id} == {f.id for f in client.files.list(purpose="batch")} & {uploaded.id, done.output_file_id}

    # another caller sees none of it
    bob = _client(rapid, BOB)
    for call in (lambda: bob.batches.retrieve(batch.id), lambda: bob.files.retrieve(uploaded.id),
                 lambda: bob.files.content(done.output_file_id), lambda: bob.batches.cancel(batch.id),
                 lambda: bob.files.delete(uploaded.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in [b.id for b in bob.batches.list()]
    deleted = client.files.delete(uploaded.id)
    assert deleted.deleted and deleted.id == uploaded.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


def _chat_body(png: bytes) -> dict:
    return {"model": "tencent/HunyuanOCR", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_b64(png)}"}},
        {"type": "text", "text": "Extract the text in the image."}]}], "max_tokens": 512}


def test_chat_and_completions_lines_answer_as_their_online_routes(rapid):
    client = _client(rapid)
    png = _card(WORDS[1])
    online = client.chat.completions.with_raw_response.create(**_chat_body(png)).http_response.json()
    uploaded = client.files.create(file=("chat.jsonl", _jsonl([
        {"custom_id": "chat-1", "method": "POST", "url": "/v1/chat/completions", "body": _chat_body(png)}])),
        purpose="batch")
    done = _until_ended(client, client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                                      completion_window="24h").id)
    [line] = _lines(client, done.output_file_id)
    body = line["response"]["body"]
    assert body["object"] == "chat.completion" and body["id"] == line["response"]["request_id"]
    assert squash(WORDS[1]) in squash(body["choices"][0]["message"]["content"])
    for key in ("object", "model", "choices", "usage", "hyocr"):  # the online answer, but for its id and time
        assert body[key] == online[key], key
    assert done.usage.input_tokens == body["usage"]["prompt_tokens"]

    completion = {"prompt": "Extract the text in the image.", "image": _b64(png), "max_tokens": 512}
    online = client.completions.with_raw_response.create(
        model="m", prompt=completion["prompt"], max_tokens=512, extra_body={"image": completion["image"]}
    ).http_response.json()
    uploaded = client.files.create(file=("cmpl.jsonl", _jsonl([
        {"custom_id": "cmpl-1", "method": "POST", "url": "/v1/completions", "body": completion}])), purpose="batch")
    done = _until_ended(client, client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                                      completion_window="24h").id)
    [line] = _lines(client, done.output_file_id)
    body = line["response"]["body"]
    assert body["object"] == "text_completion" and body["choices"] == online["choices"]
    assert body["usage"] == online["usage"]


def test_cancel_stops_the_lines_not_run_and_keeps_what_finished(fake_server_factory):
    engine = FakeEngine(FakeScript())
    server = fake_server_factory(engine, ui=False, job_range_pages=1, job_workers=1)
    client = _client(server, "anything")
    png = _b64(_card("SLOW"))
    # two quick lines, then slow ones: the cancel lands while one of those runs
    uploaded = client.files.create(file=("slow.jsonl", _jsonl([
        {"custom_id": f"slow-{n}", "method": "POST", "url": "/v1/ocr",
         "body": {"image": png, "task": "vqa", "question": f"[[fake:delay={0.1 if n < 2 else 5}]]"}}
        for n in range(12)])), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/ocr", completion_window="24h")
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).request_counts.completed < 2 or not engine.active:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    running = set(engine.active)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None
    done = _until_ended(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at >= done.cancelling_at
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: as it is
    output, errors = _lines(client, done.output_file_id), _lines(client, done.error_file_id)
    assert len(output) == 2 and len(errors) == 10
    assert sorted(line["custom_id"] for line in output + errors) == sorted(f"slow-{n}" for n in range(12))
    assert all(line["response"] is None and line["error"]["code"] == "batch_cancelled" for line in errors)
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (12, len(output), len(errors))
    assert running & set(engine.aborted)  # the line running at the cancel was stopped in the engine


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_openais_documented_curl_calls(rapid, tmp_path):
    auth = ["-H", f"Authorization: Bearer {ALICE}"]

    def curl(*args: str) -> dict:
        out = subprocess.run(["curl", "-sS", "--fail-with-body", *auth, *args], capture_output=True, timeout=60,
                             check=True).stdout
        return json.loads(out)

    requests_file = tmp_path / "batchinput.jsonl"
    requests_file.write_bytes(_jsonl([{"custom_id": "request-1", "method": "POST", "url": "/v1/ocr",
                                       "body": {"image": _b64(_card(WORDS[2])), "task": "text"}}]))
    uploaded = curl(f"{rapid.url}/v1/files", "-F", "purpose=batch", "-F", f"file=@{requests_file}")
    assert uploaded["object"] == "file" and uploaded["filename"] == "batchinput.jsonl"
    batch = curl(f"{rapid.url}/v1/batches", "-H", "Content-Type: application/json", "-d", json.dumps(
        {"input_file_id": uploaded["id"], "endpoint": "/v1/ocr", "completion_window": "24h"}))
    assert batch["object"] == "batch" and batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    deadline = time.monotonic() + 120
    while (batch := curl(f"{rapid.url}/v1/batches/{batch['id']}"))["status"] != "completed":
        assert batch["status"] in ("validating", "in_progress", "finalizing") and time.monotonic() < deadline, batch
        time.sleep(0.25)
    output = tmp_path / "batch_output.jsonl"
    subprocess.run(["curl", "-sS", "--fail", *auth, f"{rapid.url}/v1/files/{batch['output_file_id']}/content",
                    "-o", str(output)], check=True, timeout=60)
    [line] = [json.loads(text) for text in output.read_text().splitlines()]
    assert line["custom_id"] == "request-1" and squash(WORDS[2]) in squash(line["response"]["body"]["text"])
    listed = curl(f"{rapid.url}/v1/batches?limit=10")
    assert listed["object"] == "list" and batch["id"] in [b["id"] for b in listed["data"]]
    ended = curl(f"{rapid.url}/v1/batches/{batch['id']}/cancel", "-H", "Content-Type: application/json",
                 "-X", "POST")
    assert ended["status"] == "completed"  # an ended batch is not cancelled


def test_files_batches_and_their_outputs_are_deleted_past_their_retention():
    """JOB_RETENTION holds for the Batch API's objects as for jobs: the input file (from its upload), the batch
    and its output file (from its end) answer 404 once their time is past and the sweep has run."""
    server = LiveServer(load_settings(engine="fake", ui=False, job_retention=4)).start()
    try:
        client = _client(server, key="-")
        lines = [{"custom_id": f"l{n}", "method": "POST", "url": "/v1/ocr", "body": {"image": _b64(_card("A1"))}}
                 for n in range(2)]
        uploaded = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
        kept = client.files.create(file=("kept.jsonl", _jsonl(lines)), purpose="batch",
                                   extra_body={"expires_after": {"anchor": "created_at", "seconds": 3600}})
        done = _until_ended(client, client.batches.create(input_file_id=uploaded.id, endpoint="/v1/ocr",
                                                          completion_window="24h").id, timeout=60)
        assert done.status == "completed" and done.request_counts.completed == 2
        assert client.files.retrieve(done.output_file_id).id == done.output_file_id
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            answers = [requests.get(f"{server.url}/v1/{path}", timeout=10).status_code for path in (
                f"files/{uploaded.id}", f"batches/{done.id}", f"files/{done.output_file_id}")]
            if answers == [404, 404, 404]:
                break
            time.sleep(0.5)
        assert answers == [404, 404, 404]
        assert client.files.retrieve(kept.id).id == kept.id  # its own expires_after: an hour
    finally:
        server.stop()
