"""Jobs in PostgreSQL, shared by two replicas: a real server on loopback (.ci/run installs postgresql; the
test starts its own cluster in a temporary folder), two app instances reading one job's ranges."""

from __future__ import annotations

import base64
import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests
from imaging import Line, render, squash, to_bytes
from servers import LiveServer, free_port

from hyocr.config import load_settings
from hyocr.engines.fake import FakeEngine, FakeScript


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)),
                                       None)
    assert found, f"{name} is not installed (.ci/run installs postgresql)"
    return found


@pytest.fixture(scope="module")
def postgres_url():
    """A PostgreSQL cluster of its own on a free loopback port; as root, it runs as the postgres user (in
    a folder that user can reach: pytest's own temporary folders are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="hyocr-pg-"))
    data, port = folder / "data", free_port()
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(folder, "postgres")
    subprocess.run([*as_user, _pg_bin("initdb"), "-D", str(data), "-U", "hyocr", "--auth=trust", "-E", "UTF8"],
                   check=True, capture_output=True)
    server = subprocess.Popen([*as_user, _pg_bin("postgres"), "-D", str(data), "-p", str(port), "-k", str(folder),
                               "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while subprocess.run([_pg_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                         capture_output=True).returncode != 0:
        assert server.poll() is None and time.monotonic() < deadline, "postgres did not start"
        time.sleep(0.2)
    yield f"postgresql+asyncpg://hyocr@127.0.0.1:{port}/postgres"
    server.terminate()
    server.wait(timeout=30)
    shutil.rmtree(folder, ignore_errors=True)


def test_two_replicas_share_a_job_and_store_each_page_once(postgres_url, tmp_path):
    images = [base64.b64encode(to_bytes(render([Line(f"SHARED {i}", (20, 20), 30)], size=(320, 96)).image)).decode()
              for i in range(8)]
    engines = [FakeEngine(FakeScript(latency=0.2)), FakeEngine(FakeScript(latency=0.2))]
    replicas = [LiveServer(load_settings(engine="fake", ui=False, jobs_database_url=postgres_url, job_workers=1,
                                         job_range_pages=1, data_dir=str(tmp_path / f"r{n}")), engine).start()
                for n, engine in enumerate(engines)]
    try:
        job = requests.post(f"{replicas[0].url}/v1/jobs", json={"images": images, "task": "text"}, timeout=30).json()
        deadline = time.monotonic() + 60
        while (status := requests.get(f"{replicas[1].url}/v1/jobs/{job['id']}", timeout=10).json())["status"] \
                != "succeeded":
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
        stored = requests.get(f"{replicas[1].url}/v1/jobs/{job['id']}/pages", timeout=10).json()["data"]
    finally:
        for replica in replicas:
            replica.stop()
    assert status["pages"] == {"total": 8, "done": 8, "failed": 0}
    assert sorted(p["position"] for p in stored) == list(range(8))
    assert all(p["page"]["index"] == p["position"] for p in stored)
    # both replicas read pages of it (ranges claimed, never the same one twice)
    read = [len(e.completed) for e in engines]
    assert all(n > 0 for n in read) and sum(read) == 8, read
    assert {squash(p["page"]["text"]) for p in stored}  # the fake engine's text, stored
