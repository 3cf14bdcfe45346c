"""Batch lines run below online traffic, as job ranges do: at BACKGROUND priority in the engine, and only
while online requests leave the reserve free. The fake engine records what it received and when it finished."""

from __future__ import annotations

import base64
import json
import threading
import time

import requests
from imaging import Line, render, to_bytes

from hyocr.engines.fake import FakeEngine, FakeScript

PNG = base64.b64encode(to_bytes(render([Line("QUEUE", (10, 10), 30)], size=(200, 60)).image)).decode()


def _batch(url: str, bodies: list[dict]) -> dict:
    lines = "".join(json.dumps({"custom_id": f"l{n}", "method": "POST", "url": "/v1/ocr", "body": body}) + "\n"
                    for n, body in enumerate(bodies))
    file_id = requests.post(f"{url}/v1/files", files={"file": ("in.jsonl", lines.encode())}, data={"purpose": "batch"},
                            timeout=30).json()["id"]
    return requests.post(f"{url}/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/ocr",
                                                    "completion_window": "24h"}, timeout=30).json()


def _ended(url: str, batch_id: str) -> dict:
    deadline = time.monotonic() + 60
    while (batch := requests.get(f"{url}/v1/batches/{batch_id}", timeout=10).json())["status"] != "completed":
        assert time.monotonic() < deadline, batch
        time.sleep(0.05)
    return batch


def test_batch_lines_wait_for_online_requests_and_run_at_background_priority(fake_server_factory):
    engine = FakeEngine(FakeScript())
    # one online request in flight takes the whole share jobs may use (half of 2)
    server = fake_server_factory(engine, ui=False, max_concurrency=2, job_online_reserve=0.5)
    online = threading.Thread(target=requests.post, args=(f"{server.url}/v1/ocr",), kwargs={
        "json": {"image": PNG, "task": "vqa", "question": "[[fake:delay=3]] online"}, "timeout": 30})
    online.start()
    deadline = time.monotonic() + 10
    while not engine.active:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    batch = _batch(server.url, [{"image": PNG, "task": "text"}, {"image": PNG, "task": "text"}])
    while requests.get(f"{server.url}/v1/batches/{batch['id']}", timeout=10).json()["status"] == "validating":
        time.sleep(0.02)
    assert online.is_alive(), "the online request ended before the batch could run: nothing was tested"
    online.join()
    _ended(server.url, batch["id"])
    by_id = {r.request_id: r for r in engine.requests}
    first, *batch_lines = list(engine.completed)
    assert by_id[first].priority == 0 and "online" in by_id[first].prompt  # the online one finished first
    assert len(batch_lines) == 2 and all(by_id[r].priority == 1 for r in batch_lines)
