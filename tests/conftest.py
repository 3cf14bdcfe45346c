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


# How scripts/test.sh spreads the suite over pytest-xdist workers (-n 2 --dist loadgroup
# --no-loadscope-reorder): a file is one unit, so its module fixtures start once; the files that share the
# session's model servers (vllm_server, hf_server) are one unit, not one start per worker; the Ray files are
# one, not two local clusters at once. Units run slowest directories first, so the last ones are short.
SHARED_UNITS = {
    **dict.fromkeys(("tests/models/test_browser_ui.py", "tests/models/test_capability_checks.py",
                     "tests/models/test_eval_models.py", "tests/models/test_model_engines.py",
                     "tests/models/test_model_versions.py", "tests/models/test_structured_outputs.py"),
                    "model-servers"),
    **dict.fromkeys(("tests/e2e/test_ray_serve.py", "tests/e2e/test_batch_ray.py"), "ray"),
}
SLOWEST_FIRST = ("tests/models/", "tests/e2e/", "tests/integration/", "tests/ui/")


def _unit(item: pytest.Item) -> str:
    path = item.nodeid.split("::", 1)[0]
    return SHARED_UNITS.get(path, path)


def _rank(item: pytest.Item) -> int:
    return next((i for i, top in enumerate(SLOWEST_FIRST) if item.nodeid.startswith(top)), len(SLOWEST_FIRST))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_unit(item)))
    items.sort(key=_rank)  # stable: a file's tests keep their order


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
