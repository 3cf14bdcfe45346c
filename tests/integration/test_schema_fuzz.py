"""schemathesis over the served OpenAPI schema: whatever a client sends, never a server error.

Runs against a real server on loopback with the fake engine (fast; the engine is not under test here).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from hyocr.config import load_settings
from servers import LiveServer


@pytest.fixture(scope="module")
def fuzz_server():
    server = LiveServer(load_settings(engine="fake", ui=False, max_body_bytes=2 * 1024 * 1024)).start()
    yield server
    server.stop()


def test_no_server_errors(fuzz_server):
    """Every operation in the schema, with generated (valid and invalid) inputs. schemathesis's pytest
    plugin does not load under pytest 9, so its strategies are driven by hypothesis directly."""
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/ocr", "/v1/chat/completions", "/v1/completions"}
    calls = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case) -> None:
            response = case.call(base_url=fuzz_server.url, timeout=30)
            calls.append(response.status_code)
            assert response.status_code < 500, (operation.path, response.status_code, response.text[:300])
            if response.status_code >= 400:
                assert set(response.json()["error"]) >= {"message", "type"}  # the OpenAI error shape, always

        check()
    assert len(calls) >= 5 * len(operations)  # hypothesis really generated cases for every operation
