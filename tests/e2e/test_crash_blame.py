"""A line that takes its server down fails alone: `hyocr serve` killed with SIGKILL each time a batch chunk runs,
past JOB_MAX_ATTEMPTS, and started again on the same data folder. The chunk's lines then run one at a time; the
one running when the server goes down again is answered `crashed_repeatedly` and the lines beside it are answered
as usual (they had all failed with it). The kills stand for a line that crashes the process; the durable state
is read from the jobs database the server writes, to kill it at the moment a claim is held."""

from __future__ import annotations

import base64
import json
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import requests
from imaging import card
from servers import serve_process

IMAGE = base64.b64encode(card().png()).decode()


def _line(custom_id: str, question: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/ocr",
                       "body": {"image": IMAGE, "task": "vqa", "question": question}})


def _state(db: Path) -> tuple[int, int]:
    """(the chunk's claims so far, the batch's lines answered)."""
    with sqlite3.connect(db) as con:
        attempts = con.execute("SELECT max(attempts) FROM hyocr_batch_chunks").fetchone()[0] or 0
        answered = con.execute("SELECT count(*) FROM hyocr_batch_lines WHERE status_code IS NOT NULL").fetchone()[0]
    return attempts, answered


def _until(check, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_line_that_takes_its_server_down_fails_alone(tmp_path):
    env = {"HYOCR_DATA_DIR": str(tmp_path), "HYOCR_JOB_MAX_ATTEMPTS": "1", "HYOCR_JOB_LEASE": "1",
           "HYOCR_JOB_RANGE_PAGES": "3", "HYOCR_JOB_WORKERS": "1", "HYOCR_UI": "false"}
    db = tmp_path / "jobs.db"
    lines = "\n".join([_line("before", "[[fake:delay=3]] q"), _line("crasher", "[[fake:hang]] q"),
                       _line("after", "[[fake:delay=3]] q")]).encode()

    def start() -> tuple[subprocess.Popen, str]:
        return serve_process("--engine", "fake", env=env, stdout=subprocess.DEVNULL)

    def kill(proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    proc, url = start()
    try:
        file_id = requests.post(f"{url}/v1/files", files={"file": ("in.jsonl", lines)}, data={"purpose": "batch"},
                                timeout=30).json()["id"]
        batch_id = requests.post(f"{url}/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/ocr",
                                                            "completion_window": "24h"}, timeout=30).json()["id"]
        # the chunk's first claim: its three lines run together; the server goes down before any is answered
        _until(lambda: _state(db)[0] == 1, "the chunk was not claimed")
        time.sleep(0.5)
        assert _state(db) == (1, 0)
        kill(proc)

        # past the budget: the lines one at a time, "before" answered; down again while "crasher" runs
        proc, url = start()
        _until(lambda: _state(db)[1] == 1, "the first line was not answered alone")
        time.sleep(0.3)
        assert _state(db) == (2, 1)
        kill(proc)

        proc, url = start()
        _until(lambda: requests.get(f"{url}/v1/batches/{batch_id}", timeout=10).json()["status"] == "completed",
               "the batch did not complete")
        batch = requests.get(f"{url}/v1/batches/{batch_id}", timeout=10).json()
        assert batch["request_counts"] == {"total": 3, "completed": 2, "failed": 1}, batch
        output = [json.loads(x) for x in requests.get(f"{url}/v1/files/{batch['output_file_id']}/content",
                                                      timeout=10).text.splitlines()]
        errors = [json.loads(x) for x in requests.get(f"{url}/v1/files/{batch['error_file_id']}/content",
                                                      timeout=10).text.splitlines()]
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
    assert [(x["custom_id"], x["response"]["status_code"]) for x in output] == [("before", 200), ("after", 200)]
    assert [(x["custom_id"], x["error"]["code"]) for x in errors] == [("crasher", "crashed_repeatedly")]
    assert "went down each time it ran (2 times)" in errors[0]["error"]["message"]


def test_a_page_that_takes_its_server_down_fails_alone(tmp_path):
    """The same for a job's range of pages (three images; each would hang until the request deadline, which
    makes it an error page of its own once nothing is retried any more)."""
    env = {"HYOCR_DATA_DIR": str(tmp_path), "HYOCR_JOB_MAX_ATTEMPTS": "1", "HYOCR_JOB_LEASE": "1",
           "HYOCR_JOB_RANGE_PAGES": "3", "HYOCR_JOB_WORKERS": "1", "HYOCR_UI": "false",
           "HYOCR_REQUEST_TIMEOUT": "2", "HYOCR_STALL_TIMEOUT": "0"}
    db = tmp_path / "jobs.db"

    def claims() -> int:
        with sqlite3.connect(db) as con:
            return con.execute("SELECT max(attempts) FROM hyocr_job_ranges").fetchone()[0] or 0

    proc, url = serve_process("--engine", "fake", env=env, stdout=subprocess.DEVNULL)
    try:
        job = requests.post(f"{url}/v1/jobs", json={"images": [IMAGE] * 3, "task": "vqa",
                                                    "question": "[[fake:hang]] q"}, timeout=30).json()
        for claim in (1, 2):  # read together, then one at a time: down each time while the first page is read
            _until(lambda: claims() == claim, f"claim {claim} did not come")
            time.sleep(0.5)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            proc, url = serve_process("--engine", "fake", env=env, stdout=subprocess.DEVNULL)
        _until(lambda: requests.get(f"{url}/v1/jobs/{job['id']}", timeout=10).json()["status"] not in
               ("queued", "running"), "the job did not end")
        pages = requests.get(f"{url}/v1/jobs/{job['id']}/pages", timeout=10).json()["data"]
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
    errors = {p["position"]: p["page"]["error"] for p in pages}
    assert sorted(errors) == [0, 1, 2], pages
    assert "went down each time it read it (2 times)" in errors[0]
    assert all("went down" not in errors[n] for n in (1, 2)), errors  # each read, to its own deadline
