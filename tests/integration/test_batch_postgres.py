"""A batch in PostgreSQL, shared by two replicas (the cluster test_jobs_postgres.py starts): its file uploaded
to one, its chunks read by both, each line run and answered exactly once, its output read from the other."""

from __future__ import annotations

import base64
import json
import time

import requests
from imaging import Line, render, to_bytes
from servers import LiveServer
from test_jobs_postgres import postgres_url  # noqa: F401 - the fixture

from hyocr.config import load_settings
from hyocr.engines.fake import FakeEngine, FakeScript


def test_two_replicas_share_a_batch_and_run_each_line_once(postgres_url, tmp_path):  # noqa: F811
    png = base64.b64encode(to_bytes(render([Line("SHARED", (20, 20), 30)], size=(320, 96)).image)).decode()
    lines = "".join(json.dumps({"custom_id": f"line-{n}", "method": "POST", "url": "/v1/ocr",
                                "body": {"image": png, "task": "text"}}) + "\n" for n in range(8))
    # what PostgreSQL's text cannot hold (a NUL) is an error line, not a failed validation
    lines += json.dumps({"custom_id": "nul\u0000", "method": "POST", "url": "/v1/ocr", "body": {}}) + "\n"
    engines = [FakeEngine(FakeScript(latency=0.2)), FakeEngine(FakeScript(latency=0.2))]
    replicas = [LiveServer(load_settings(engine="fake", ui=False, jobs_database_url=postgres_url, job_workers=1,
                                         job_range_pages=1, data_dir=str(tmp_path / f"r{n}")), engine).start()
                for n, engine in enumerate(engines)]
    try:
        uploaded = requests.post(f"{replicas[0].url}/v1/files", files={"file": ("in\x00.jsonl", lines.encode())},
                                 data={"purpose": "batch"}, timeout=30).json()
        assert requests.get(f"{replicas[0].url}/v1/files/file-%00", timeout=10).status_code == 404
        batch = requests.post(f"{replicas[1].url}/v1/batches", json={
            "input_file_id": uploaded["id"], "endpoint": "/v1/ocr", "completion_window": "24h"}, timeout=30).json()
        deadline = time.monotonic() + 60
        while (status := requests.get(f"{replicas[0].url}/v1/batches/{batch['id']}", timeout=10).json())["status"] \
                != "completed":
            assert status["status"] in ("validating", "in_progress", "finalizing") and time.monotonic() < deadline, \
                status
            time.sleep(0.1)
        output = requests.get(f"{replicas[1].url}/v1/files/{status['output_file_id']}/content", timeout=10).text
    finally:
        for replica in replicas:
            replica.stop()
    assert status["request_counts"] == {"total": 9, "completed": 8, "failed": 1}
    assert [json.loads(line)["custom_id"] for line in output.splitlines()] == [f"line-{n}" for n in range(8)]
    read = [len(e.completed) for e in engines]
    assert all(n > 0 for n in read) and sum(read) == 8, read  # both replicas ran lines, none twice
