"""Jobs and batches on object storage, against a real S3 protocol server on loopback (moto's server mode,
started here): documents read from s3://, results written to an output prefix (an object per document and a
manifest), a bucket that refuses writes (a clear error per document, the results kept), the bucket allowlist,
credentials never taken from a request, presigned URLs under the image-URL rules. rapidocr on rendered
cards where the result is checked."""

from __future__ import annotations

import base64
import json
import time

import openai
import pytest
import requests
from imaging import Line, render, squash, to_bytes
from object_store import S3Server, s3_environment
from servers import LiveServer

from hyocr.config import load_settings

WORDS = {"scan-1": "INVOICE 4711", "scan-2": "RECEIPT 2026", "scan/3": "TICKET 0815"}


def _card(text: str) -> bytes:
    return to_bytes(render([Line(text, (30, 30), 44)], size=(560, 120)).image)


@pytest.fixture(scope="module")
def s3():
    with s3_environment():
        server = S3Server()
        for bucket in ("corpus", "results", "locked", "private"):
            server.bucket(bucket)
        server.deny_writes("locked")
        for name, text in WORDS.items():
            server.put("corpus", f"cards/{name}.png", _card(text))
        yield server
        server.stop()


@pytest.fixture(scope="module")
def rapid(s3):
    live = LiveServer(load_settings(engine="rapidocr", ui=False, job_range_pages=2, allowed_media_domains="127.0.0.1",
                                    object_store_allowed_buckets="s3://corpus,s3://results,s3://locked",
                                    object_store_endpoint=s3.url)).start()
    yield live
    live.stop()


def _job_done(url: str, job_id: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = requests.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
        if job["status"] not in ("queued", "running") and job["output"]["status"] not in ("pending", "writing"):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end: {job}")


def _batch_done(client: openai.OpenAI, batch_id: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.25)
    raise AssertionError(f"batch {batch_id} did not end: {batch}")


def test_a_job_reads_its_document_from_s3_and_writes_its_result_there(rapid, s3):
    r = requests.post(f"{rapid.url}/v1/jobs", json={"image": "s3://corpus/cards/scan-1.png", "task": "text",
                                                    "output_uri": "s3://results/jobs/scan-1"}, timeout=60)
    assert r.status_code == 202, r.text
    job = _job_done(rapid.url, r.json()["id"])
    assert job["status"] == "succeeded"
    assert job["output"] == {"uri": "s3://results/jobs/scan-1/", "status": "written", "error": None}
    assert s3.keys("results", "jobs/scan-1/") == ["jobs/scan-1/manifest.json", "jobs/scan-1/result.json"]
    result = s3.json("results", "jobs/scan-1/result.json")
    assert result == requests.get(f"{rapid.url}/v1/jobs/{job['id']}/result", timeout=10).json() | {
        "created": result["created"]}
    assert squash(WORDS["scan-1"]) in squash(result["text"])
    manifest = s3.json("results", "jobs/scan-1/manifest.json")
    assert manifest["job"] == job["id"] and manifest["status"] == "succeeded"
    assert manifest["result"] == "s3://results/jobs/scan-1/result.json" and manifest["pages"]["done"] == 1


def test_an_s3_to_s3_batch_through_the_sdk(rapid, s3):
    lines = [{"custom_id": name, "method": "POST", "url": "/v1/ocr",
              "body": {"image": f"s3://corpus/cards/{name}.png", "task": "text"}} for name in WORDS]
    lines.append({"custom_id": "missing", "method": "POST", "url": "/v1/ocr",
                  "body": {"image": "s3://corpus/cards/none.png", "task": "text"}})
    s3.put("corpus", "batches/run-1.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode())
    client = openai.OpenAI(base_url=f"{rapid.url}/v1", api_key="-", max_retries=0)
    batch = client.batches.create(input_file_id="s3://corpus/batches/run-1.jsonl", endpoint="/v1/ocr",
                                  completion_window="24h", extra_body={"output_uri": "s3://results/run-1/"})
    done = _batch_done(client, batch.id)
    assert done.status == "completed" and done.input_file_id == "s3://corpus/batches/run-1.jsonl"
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 1)
    export = done.model_extra["output_export"]
    assert export["status"] == "written" and export["written"] == 4 and export["failed"] == 0
    assert export["refused"] == [] and export["manifest"] == "s3://results/run-1/manifest.json"
    assert s3.keys("results", "run-1/") == ["run-1/manifest.json", "run-1/missing.json", "run-1/scan%2F3.json",
                                            "run-1/scan-1.json", "run-1/scan-2.json"]
    for name, text in WORDS.items():
        body = s3.json("results", f"run-1/{name.replace('/', '%2F')}.json")
        assert body["object"] == "ocr.result" and squash(text) in squash(body["text"])
    missing = s3.json("results", "run-1/missing.json")
    assert missing["response"]["status_code"] == 400 and missing["error"]["code"] == "object_not_found"
    manifest = s3.json("results", "run-1/manifest.json")
    assert manifest["batch"] == batch.id and [e["custom_id"] for e in manifest["lines"]] == [*WORDS, "missing"]
    assert all(e["object"] and e["error"] is None for e in manifest["lines"])
    # the output files hold the same answers
    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    assert [line["custom_id"] for line in output] == list(WORDS)

    # an object URI goes wherever an image goes: a chat line's image_url too
    chat = {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "s3://corpus/cards/scan-2.png"}},
                                     {"type": "text", "text": "Read the text."}]}]}}
    uploaded = client.files.create(file=("chat.jsonl", json.dumps(chat).encode()), purpose="batch")
    done = _batch_done(client, client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                                     completion_window="24h").id)
    [line] = [json.loads(text) for text in client.files.content(done.output_file_id).text.splitlines()]
    assert squash(WORDS["scan-2"]) in squash(line["response"]["body"]["choices"][0]["message"]["content"])


def test_a_bucket_that_refuses_writes_fails_each_document_clearly_and_loses_nothing(rapid, s3):
    r = requests.post(f"{rapid.url}/v1/jobs", json={"image": "s3://corpus/cards/scan-2.png", "task": "text",
                                                    "output_uri": "s3://locked/jobs/"}, timeout=60)
    job = _job_done(rapid.url, r.json()["id"])
    assert job["status"] == "succeeded" and job["output"]["status"] == "failed"
    assert "ACCESS_DENIED" in job["output"]["error"] and "s3://locked/jobs/result.json" in job["output"]["error"]
    result = requests.get(f"{rapid.url}/v1/jobs/{job['id']}/result", timeout=10).json()
    assert squash(WORDS["scan-2"]) in squash(result["text"])  # the result is kept
    assert s3.keys("locked") == []

    s3.put("corpus", "batches/locked.jsonl", "".join(json.dumps(
        {"custom_id": name, "method": "POST", "url": "/v1/ocr", "body": {"image": f"s3://corpus/cards/{name}.png"}})
        + "\n" for name in ("scan-1", "scan-2")).encode())
    client = openai.OpenAI(base_url=f"{rapid.url}/v1", api_key="-", max_retries=0)
    done = _batch_done(client, client.batches.create(
        input_file_id="s3://corpus/batches/locked.jsonl", endpoint="/v1/ocr", completion_window="24h",
        extra_body={"output_uri": "s3://locked/run/"}).id)
    assert done.status == "completed" and done.request_counts.completed == 2
    export = done.model_extra["output_export"]
    assert export["status"] == "failed" and export["written"] == 0 and export["failed"] == 2
    assert export["manifest"] is None and "ACCESS_DENIED" in export["error"]
    assert [(r["custom_id"], "s3://locked/run/" in r["error"]) for r in export["refused"]] == [
        ("scan-1", True), ("scan-2", True)]  # each document's own error
    output = client.files.content(done.output_file_id).text.splitlines()
    assert [json.loads(line)["custom_id"] for line in output] == ["scan-1", "scan-2"]  # nothing lost


@pytest.mark.parametrize(("body", "code", "param"), [
    ({"image": "s3://private/a.png"}, "object_not_allowed", "image"),
    ({"image": "s3://corpus-private/a.png"}, "object_not_allowed", "image"),
    ({"image": "s3://KEY:SECRET@corpus/cards/scan-1.png"}, "invalid_object_uri", "image"),
    ({"image": "s3://corpus/cards/scan-1.png?endpoint_override=169.254.169.254"}, "invalid_object_uri", "image"),
    ({"image": "s3://corpus/cards/none.png"}, "object_not_found", "image"),
    ({"images": ["s3://corpus/cards/scan-1.png", "s3://private/b.png"]}, "object_not_allowed", "images.1"),
    ({"image": "s3://corpus/cards/scan-1.png", "output_uri": "s3://private/out/"}, "object_not_allowed", "output_uri"),
    ({"image": "s3://corpus/cards/scan-1.png", "output_uri": "https://example.com/out/"}, "invalid_object_uri",
     "output_uri"),
    ({"image": "s3://corpus/cards/scan-1.png", "aws_secret_access_key": "x"}, "credentials_not_accepted",
     "aws_secret_access_key"),
])
def test_object_uris_outside_the_rules_are_refused_at_submit(rapid, body, code, param):
    r = requests.post(f"{rapid.url}/v1/jobs", json={"task": "text", **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["param"] == param


def test_presigned_urls_are_image_urls_under_their_rules(rapid, s3, fake_server_factory):
    url = s3.presigned("corpus", "cards/scan-1.png")
    assert url.startswith("http://127.0.0.1:")
    r = requests.post(f"{rapid.url}/v1/jobs", json={"image": url, "task": "text"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "url_not_allowed"  # loopback: a private address
    opened = fake_server_factory(ui=False, allowed_media_domains="127.0.0.1", media_fetch_allow_private=True)
    r = requests.post(f"{opened.url}/v1/jobs", json={"image": url, "task": "text"}, timeout=30)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 30
    while (job := requests.get(f"{opened.url}/v1/jobs/{r.json()['id']}", timeout=10).json())["status"] != "succeeded":
        assert job["status"] in ("queued", "running") and time.monotonic() < deadline, job
        time.sleep(0.1)
    result = requests.get(f"{opened.url}/v1/jobs/{job['id']}/result", timeout=10).json()
    assert result["pages"][0]["width"] == 560  # the object's own pixels, fetched through the presigned URL


def test_object_uris_are_off_unless_buckets_are_allowed(fake_server_factory):
    server = fake_server_factory(ui=False)
    r = requests.post(f"{server.url}/v1/jobs", json={"image": "s3://corpus/cards/scan-1.png"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "object_store_disabled"
    data = base64.b64encode(_card("X")).decode()
    r = requests.post(f"{server.url}/v1/jobs", json={"image": data, "output_uri": "s3://results/x/"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "object_store_disabled"


def test_an_s3_input_file_is_validated_as_an_uploaded_one(s3, fake_server_factory):
    server = fake_server_factory(ui=False, batch_max_lines=2, object_store_allowed_buckets="s3://corpus",
                                 object_store_endpoint=s3.url)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="-", max_retries=0)
    line = {"method": "POST", "url": "/v1/ocr", "body": {"image": "s3://corpus/cards/scan-1.png"}}
    s3.put("corpus", "batches/three.jsonl", "".join(json.dumps({**line, "custom_id": f"r{n}"}) + "\n"
                                                    for n in range(3)).encode())
    too_many = _batch_done(client, client.batches.create(input_file_id="s3://corpus/batches/three.jsonl",
                                                         endpoint="/v1/ocr", completion_window="24h").id)
    assert too_many.status == "failed" and [e.code for e in too_many.errors.data] == ["batch_too_large"]
    missing = _batch_done(client, client.batches.create(input_file_id="s3://corpus/batches/none.jsonl",
                                                        endpoint="/v1/ocr", completion_window="24h").id)
    assert missing.status == "failed" and [e.code for e in missing.errors.data] == ["object_not_found"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id="s3://results/batch.jsonl", endpoint="/v1/ocr", completion_window="24h")
    assert refused.value.body["code"] == "object_not_allowed"
    s3.put("corpus", "batches/two.jsonl", (json.dumps({**line, "custom_id": "ok"}) + "\nnot json\n").encode())
    done = _batch_done(client, client.batches.create(input_file_id="s3://corpus/batches/two.jsonl",
                                                     endpoint="/v1/ocr", completion_window="24h").id)
    assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (1, 1)
