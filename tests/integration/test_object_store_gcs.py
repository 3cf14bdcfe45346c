"""gs:// for jobs and batches, against a real GCS JSON-API server on loopback (gcp-storage-emulator, started
here, reached through STORAGE_EMULATOR_HOST as Google's libraries reach an emulator): a job reads its document
from gs:// and writes its result and manifest to a gs:// prefix; an OpenAI batch reads its input file and its
lines' images from gs:// and writes one object per line. rapidocr on rendered cards. The S3 side, the bucket
that refuses writes and the hostile URIs are in test_object_store.py (one code path past the filesystem)."""

from __future__ import annotations

import json
import time

import openai
import pytest
import requests
from imaging import Line, render, squash, to_bytes
from object_store import GcsServer, gcs_environment
from servers import LiveServer

from hyocr.config import load_settings

WORDS = {"scan-1": "INVOICE 4711", "scan-2": "RECEIPT 2026"}


@pytest.fixture(scope="module")
def gcs():
    server = GcsServer()
    with gcs_environment(server):
        for bucket in ("corpus", "results"):
            server.bucket(bucket)
        for name, text in WORDS.items():
            server.put("corpus", f"cards/{name}.png",
                       to_bytes(render([Line(text, (30, 30), 44)], size=(560, 120)).image))
        yield server
    server.stop()


@pytest.fixture(scope="module")
def rapid(gcs):
    live = LiveServer(load_settings(engine="rapidocr", ui=False,
                                    object_store_allowed_buckets="gs://corpus,gs://results")).start()
    yield live
    live.stop()


def _until(check, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := check()) is not None:
            return value
        time.sleep(0.25)
    raise AssertionError("did not end in time")


def test_a_job_reads_from_gs_and_writes_its_result_there(rapid, gcs):
    r = requests.post(f"{rapid.url}/v1/jobs", json={"image": "gs://corpus/cards/scan-1.png", "task": "text",
                                                    "output_uri": "gs://results/jobs/scan-1/"}, timeout=60)
    assert r.status_code == 202, r.text

    def ended():
        job = requests.get(f"{rapid.url}/v1/jobs/{r.json()['id']}", timeout=10).json()
        return job if job["status"] not in ("queued", "running") and job["output"]["status"] not in (
            "pending", "writing") else None

    job = _until(ended)
    assert job["status"] == "succeeded" and job["output"] == {
        "uri": "gs://results/jobs/scan-1/", "status": "written", "error": None}
    assert gcs.keys("results", "jobs/scan-1/") == ["jobs/scan-1/manifest.json", "jobs/scan-1/result.json"]
    assert squash(WORDS["scan-1"]) in squash(gcs.json("results", "jobs/scan-1/result.json")["text"])
    assert gcs.json("results", "jobs/scan-1/manifest.json")["result"] == "gs://results/jobs/scan-1/result.json"

    # a missing object is the request's 4xx, as on S3, never a 500
    r = requests.post(f"{rapid.url}/v1/jobs", json={"image": "gs://corpus/cards/none.png"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "object_not_found", r.text


def test_a_gs_to_gs_batch_through_the_sdk(rapid, gcs):
    lines = [{"custom_id": name, "method": "POST", "url": "/v1/ocr",
              "body": {"image": f"gs://corpus/cards/{name}.png", "task": "text"}} for name in WORDS]
    gcs.put("corpus", "batches/run.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode())
    client = openai.OpenAI(base_url=f"{rapid.url}/v1", api_key="-", max_retries=0)
    batch = client.batches.create(input_file_id="gs://corpus/batches/run.jsonl", endpoint="/v1/ocr",
                                  completion_window="24h", extra_body={"output_uri": "gs://results/run/"})

    def ended():
        b = client.batches.retrieve(batch.id)
        return b if b.status in ("completed", "failed", "cancelled", "expired") and (
            b.model_extra.get("output_export") or {}).get("status") not in (None, "pending", "writing") else None

    done = _until(ended)
    assert done.status == "completed" and done.request_counts.completed == 2, done
    assert done.model_extra["output_export"]["written"] == 2
    assert gcs.keys("results", "run/") == ["run/manifest.json", "run/scan-1.json", "run/scan-2.json"]
    for name, text in WORDS.items():
        assert squash(text) in squash(gcs.json("results", f"run/{name}.json")["text"])
