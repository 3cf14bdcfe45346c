"""Real HTTP servers on loopback around the real app factory (used by the conftests)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import requests
import uvicorn

from hyocr.api.app import build_app
from hyocr.config import Settings
from hyocr.engines.base import Engine


def free_port() -> int:
    """A loopback port nothing listens on now (for a server a test starts as a subprocess)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_group(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Stop a server started with ``start_new_session=True`` as a user's Ctrl-C would (SIGTERM to its process
    group, so its engine processes too), killing the group if it has not exited within ``timeout``."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = 120, log: pathlib.Path | None = None) -> None:
    """Until ``url``'s /ready answers 200; fails with the process's output (its pipe, or the end of ``log``
    where its output goes to a file) if it exits first."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            out = proc.stdout or proc.stderr
            if out is not None:
                raise AssertionError(out.read())
            tail = log.read_text(errors="replace")[-6000:] if log is not None and log.exists() else ""
            raise AssertionError(f"the server exited with {proc.returncode}\n{tail}")
        # A slow answer is not an answer yet: a 2-core machine starting an engine may hold one up for seconds.
        with contextlib.suppress(requests.ConnectionError, requests.Timeout):
            if requests.get(f"{url}/ready", timeout=5).status_code == 200:
                return
        assert time.monotonic() < deadline, "server never became ready"
        time.sleep(0.1)


def serve_process(*args: str, env: dict[str, str] | None = None, ready_timeout: float = 120,
                  **popen) -> tuple[subprocess.Popen, str]:
    """``hyocr serve ARGS`` as a user starts it, on a free port, ready; output on ``proc.stdout`` (text)
    unless ``popen`` says otherwise."""
    port = free_port()
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.STDOUT)
    proc = subprocess.Popen([sys.executable, "-m", "hyocr", "serve", "--port", str(port), *args], text=True,
                            env={**os.environ, **(env or {})}, **popen)
    url = f"http://127.0.0.1:{port}"
    wait_ready(proc, url, ready_timeout)
    return proc, url


class LiveServer:
    """The app from ``build_app`` served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        if settings.data_dir == os.environ.get("HYOCR_DATA_DIR"):  # not chosen by the test: a jobs database
            # of its own, so that no other server in this process runs its jobs
            settings = settings.model_copy(update={"data_dir": tempfile.mkdtemp(dir=settings.data_dir)})
        self.app = build_app(settings, engine)
        self.engine = self.app.state.service.engine
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5,
                                proxy_headers=False)  # as `hyocr serve`: hyocr judges proxies itself
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def start(self, timeout: float = 120.0) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()


# ---------------------------------------------------------------- raw HTTP, for peers that misbehave on purpose


class RawHttpServer:
    """A socket server on loopback that reads each request whole (head and body) and sends what
    ``answer(head, body)`` returns: raw HTTP bytes, or None to close the connection without a word."""

    def __init__(self, answer: Callable[[bytes, bytes], bytes | None]) -> None:
        self.answer = answer
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length")), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                self.connections += 1
                reply = self.answer(head, body)
                if reply:
                    conn.sendall(reply)

    def close(self) -> None:
        self.sock.close()


def http_response(status: int, body: bytes, headers: str = "Content-Type: application/json\r\n") -> bytes:
    return f"HTTP/1.1 {status} X\r\n{headers}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body


def raw_exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` as it is and read until the server closes (or goes quiet for 10 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        out = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := sock.recv(65536):
                out += chunk
        return out
