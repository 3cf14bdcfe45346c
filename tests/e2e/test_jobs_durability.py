"""A job survives its server: `hyocr serve` (rapidocr, a rendered multi-page scan) killed with SIGKILL
mid-job and started again on the same data folder finishes the job, every page present exactly once."""

from __future__ import annotations

import base64
import signal
import subprocess
import time

import pdfs
import requests
from imaging import squash
from servers import serve_process

PAGES = 6


def test_a_job_killed_mid_way_resumes_and_every_page_is_there_once(tmp_path):
    scan = pdfs.scanned_pdf([[f"SHEET {n} OF SIX"] for n in range(1, PAGES + 1)])
    # one page per range, one range at a time: the kill lands between stored pages; a short lease lets the
    # restarted server take over the range the dead one held
    env = {"HYOCR_DATA_DIR": str(tmp_path / "data"), "HYOCR_JOB_RANGE_PAGES": "1", "HYOCR_JOB_WORKERS": "1",
           "HYOCR_JOB_LEASE": "2", "HYOCR_UI": "false"}
    proc, url = serve_process("--engine", "rapidocr", env=env, stdout=subprocess.DEVNULL)
    try:
        job = requests.post(f"{url}/v1/jobs", json={"image": base64.b64encode(scan).decode(), "task": "text"},
                            timeout=60).json()
        deadline = time.monotonic() + 120
        while (done := requests.get(f"{url}/v1/jobs/{job['id']}", timeout=10).json()["pages"]["done"]) < 2:
            assert time.monotonic() < deadline, "the job made no progress"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert done < PAGES, "the job finished before the kill: nothing was tested"

    proc, url = serve_process("--engine", "rapidocr", env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while (status := requests.get(f"{url}/v1/jobs/{job['id']}", timeout=10).json())["status"] != "succeeded":
            assert status["status"] in ("queued", "running") and time.monotonic() < deadline, status
            time.sleep(0.2)
        assert status["pages"] == {"total": PAGES, "done": PAGES, "failed": 0}
        stored = requests.get(f"{url}/v1/jobs/{job['id']}/pages?limit=1000", timeout=10).json()["data"]
        result = requests.get(f"{url}/v1/jobs/{job['id']}/result", timeout=10).json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert sorted(p["position"] for p in stored) == list(range(PAGES))  # each page stored once
    assert [p["index"] for p in result["pages"]] == list(range(PAGES))
    for n, page in enumerate(result["pages"], 1):
        assert f"SHEET{n}OFSIX" in squash(page["text"]), page["text"]
