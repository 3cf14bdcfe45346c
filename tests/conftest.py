"""Shared fixtures: real HTTP servers on loopback around the real app factory."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

sys.path.insert(0, str(Path(__file__).parent))  # tests/imaging.py, tests/fixtures

from hyocr.api.app import build_app  # noqa: E402
from hyocr.config import Settings, load_settings  # noqa: E402
from hyocr.engines.base import Engine  # noqa: E402


class LiveServer:
    """The app from ``build_app`` served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        self.app = build_app(settings, engine)
        self.engine = self.app.state.service.engine
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
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


def serve(instance: Engine | None = None, **settings: object) -> LiveServer:
    """A started server; ``instance`` overrides the engine that ``settings.engine`` names."""
    return LiveServer(load_settings(**settings), instance).start()


@pytest.fixture(scope="session")
def rapid_server() -> Iterator[LiveServer]:
    """One real rapidocr server for the session (loading ONNX models once)."""
    server = serve(engine="rapidocr", max_body_bytes=4 * 1024 * 1024, max_image_pixels=12_000_000)
    yield server
    server.stop()


@pytest.fixture
def fake_server_factory() -> Iterator:
    """Build fake-engine servers with custom settings; all stopped after the test."""
    servers: list[LiveServer] = []

    def make(instance: Engine | None = None, **settings: object) -> LiveServer:
        settings.setdefault("engine", "fake")
        server = serve(instance, **settings)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()
