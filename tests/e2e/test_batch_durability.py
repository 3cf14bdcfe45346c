"""Batches survive their server: `hyocr serve` (rapidocr, rendered cards) killed with SIGKILL mid-way through
two batches, the OpenAI SDK's (an uploaded JSONL file) and an S3-to-S3 one (its JSONL, its images and its
results in a real S3 protocol server on loopback), and started again on the same data folder finishes
both: every line answered exactly once, every result object written."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import time

import openai
from imaging import Line, render, squash, to_bytes
from object_store import ENV, S3Server, s3_environment
from servers import serve_process

CARDS = {f"doc-{n}": f"FORM {n}0{n} NO {n}" for n in range(1, 6)}


def _card(text: str) -> bytes:
    return to_bytes(render([Line(text, (30, 30), 44)], size=(560, 120)).image)


def _jsonl(items: list[dict]) -> bytes:
    return "".join(json.dumps(item) + "\n" for item in items).encode()


def test_batches_killed_mid_way_resume_and_answer_every_line_once(tmp_path):
    with s3_environment():
        s3 = S3Server()
        try:
            _run(tmp_path, s3)
        finally:
            s3.stop()


def _run(tmp_path, s3: S3Server) -> None:
    for bucket in ("corpus", "results"):
        s3.bucket(bucket)
    for name, text in CARDS.items():
        s3.put("corpus", f"in/{name}.png", _card(text))
    s3.put("corpus", "in/requests.jsonl", _jsonl([
        {"custom_id": name, "method": "POST", "url": "/v1/ocr", "body": {"image": f"s3://corpus/in/{name}.png",
                                                                         "task": "text"}} for name in CARDS]))
    # a line per chunk, one chunk of each batch at a time; a short lease lets the restarted server take over
    env = {**ENV, "HYOCR_DATA_DIR": str(tmp_path / "data"), "HYOCR_JOB_RANGE_PAGES": "1", "HYOCR_JOB_WORKERS": "2",
           "HYOCR_JOB_LEASE": "2", "HYOCR_UI": "false", "HYOCR_OBJECT_STORE_ENDPOINT": s3.url,
           "HYOCR_OBJECT_STORE_ALLOWED_BUCKETS": "s3://corpus,s3://results"}
    proc, url = serve_process("--engine", "rapidocr", env=env, stdout=subprocess.DEVNULL)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=2)
        uploaded = client.files.create(file=("cards.jsonl", _jsonl([
            {"custom_id": name, "method": "POST", "url": "/v1/ocr",
             "body": {"image": base64.b64encode(_card(text)).decode(), "task": "text"}}
            for name, text in CARDS.items()])), purpose="batch")
        sdk = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/ocr", completion_window="24h")
        s3_batch = client.batches.create(input_file_id="s3://corpus/in/requests.jsonl", endpoint="/v1/ocr",
                                         completion_window="24h", extra_body={"output_uri": "s3://results/out/"})
        deadline = time.monotonic() + 120
        while min(counts := [client.batches.retrieve(b.id).request_counts.completed for b in (sdk, s3_batch)]) < 1:
            assert time.monotonic() < deadline, "the batches made no progress"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert max(counts) < len(CARDS), "a batch finished before the kill: nothing was tested"

    proc, url = serve_process("--engine", "rapidocr", env=env, stdout=subprocess.DEVNULL)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="-", max_retries=2)
        deadline = time.monotonic() + 240
        for batch in (sdk, s3_batch):
            while (done := client.batches.retrieve(batch.id)).status != "completed":
                assert done.status in ("in_progress", "finalizing") and time.monotonic() < deadline, done
                time.sleep(0.25)
            assert done.request_counts.total == len(CARDS) and done.request_counts.completed == len(CARDS)
            assert done.error_file_id is None
            output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
            assert [line["custom_id"] for line in output] == list(CARDS)  # each line once, in input order
            for line in output:
                assert squash(CARDS[line["custom_id"]]) in squash(line["response"]["body"]["text"]), line
        export = done.model_extra["output_export"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert export["status"] == "written" and export["written"] == len(CARDS)
    assert s3.keys("results", "out/") == sorted([f"out/{name}.json" for name in CARDS] + ["out/manifest.json"])
    for name, text in CARDS.items():
        assert squash(text) in squash(s3.json("results", f"out/{name}.json")["text"])
    manifest = s3.json("results", "out/manifest.json")
    assert [entry["custom_id"] for entry in manifest["lines"]] == list(CARDS)
