"""Shared fixtures: real HTTP servers on loopback around the real app factory."""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/imaging.py, tests/servers.py
# Jobs databases and webhook secrets of every server the tests start (processes included) stay out of the
# user's data folder; each in-process LiveServer takes a folder of its own below this one (servers.py).
os.environ.setdefault("HYOCR_DATA_DIR", tempfile.mkdtemp(prefix="hyocr-test-data-"))

from servers import LiveServer  # noqa: E402

from hyocr.config import load_settings  # noqa: E402
from hyocr.engines.base import Engine  # noqa: E402


def pytest_unconfigure(config: pytest.Config) -> None:
    # vLLM's finalizers log at interpreter exit, after pytest has closed the streams it captured: without
    # this, each such line prints a "--- Logging error ---" traceback after the summary.
    logging.raiseExceptions = False


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
