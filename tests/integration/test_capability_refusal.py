"""A capability the engine reports but cannot deliver (issue 29): the start-up check of structured outputs
(engines/capabilities.py) turns them off, /v1/models says false and why, and every spelling of a constrained
request is a JSON 503 naming it, while the rest of the service works; a healthy engine passes and keeps them.
By fault injection in a fake engine whose constrained decoding fails as vLLM's did on the GPU; the real
engines are tests/models/test_capability_checks.py."""

from __future__ import annotations

import base64

import pytest
import requests
from imaging import card

from hyocr.engines.capabilities import check_structured
from hyocr.engines.fake import FakeEngine, FakeScript
from hyocr.errors import engine_failure

IMAGE = base64.b64encode(card().png()).decode()
URL = "data:image/png;base64," + IMAGE
SCHEMA = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[0-9]{6}$"}}, "required": ["id"]}


class EngineGenerateError(Exception):  # vLLM's
    pass


class _CheckedEngine(FakeEngine):
    """Checks its structured outputs at start, as the vLLM and transformers engines do; ``broken``: its
    constrained requests fail in the engine (a backend it imports is missing)."""

    def __init__(self, broken: bool) -> None:
        super().__init__(FakeScript())
        self.broken = broken

    async def start(self) -> None:
        await super().start()
        await check_structured(self)

    async def generate(self, request):
        if self.broken and request.sampling.structured is not None:
            try:
                try:
                    raise ModuleNotFoundError("No module named 'lmformatenforcer'", name="lmformatenforcer")
                except ImportError as exc:
                    raise EngineGenerateError() from exc
            except Exception as exc:
                raise engine_failure(exc, "vLLM generation failed") from exc
        async for chunk in super().generate(request):
            yield chunk


def _chat(server, **extra) -> requests.Response:
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": URL}},
                                                      {"type": "text", "text": "read"}]}], **extra}
    return requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)


def _model(server) -> dict:
    return requests.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["hyocr"]


CONSTRAINED = {
    "ocr schema": lambda s: requests.post(f"{s.url}/v1/ocr", json={"image": IMAGE, "task": "extract",
                                                                   "schema": SCHEMA}, timeout=30),
    "json_schema": lambda s: _chat(s, response_format={"type": "json_schema",
                                                       "json_schema": {"name": "x", "schema": SCHEMA}}),
    "json_object": lambda s: _chat(s, response_format={"type": "json_object"}),
    "guided_json": lambda s: _chat(s, guided_json=SCHEMA),
    "structured_outputs": lambda s: _chat(s, structured_outputs={"choice": ["yes", "no"]}),
}


@pytest.fixture
def broken(fake_server_factory):
    return fake_server_factory(_CheckedEngine(broken=True))


def test_a_failed_check_turns_structured_outputs_off_with_the_reason(broken):
    info = _model(broken)
    assert info["structured_outputs"] is False
    assert info["structured_outputs_check"] == ("failed: vLLM generation failed: EngineGenerateError <- "
                                                "ModuleNotFoundError: No module named 'lmformatenforcer'")


@pytest.mark.parametrize("kind", list(CONSTRAINED))
def test_constrained_requests_are_a_503_naming_it(broken, kind):
    r = CONSTRAINED[kind](broken)
    assert r.status_code == 503 and r.headers["retry-after"], r.text
    error = r.json()["error"]
    assert error["code"] == "structured_outputs_unavailable" and error["type"] == "service_unavailable"
    assert "start-up check failed (ModuleNotFoundError)" in error["message"]
    assert "lmformatenforcer" not in error["message"]  # the details are /v1/models' and the log's


def test_the_rest_of_the_service_works(broken):
    assert requests.get(f"{broken.url}/ready", timeout=10).status_code == 200
    assert _chat(broken).status_code == 200
    assert requests.post(f"{broken.url}/v1/ocr", json={"image": IMAGE, "task": "text"}, timeout=30).status_code == 200


def test_a_healthy_engine_passes_and_keeps_them(fake_server_factory):
    server = fake_server_factory(_CheckedEngine(broken=False))
    info = _model(server)
    assert info["structured_outputs"] is True and info["structured_outputs_check"] == "passed"
    assert CONSTRAINED["ocr schema"](server).status_code == 200
    assert server.engine.requests[0].request_id == "hyocr-structured-check"  # one request, one token
    assert server.engine.requests[0].sampling.max_tokens == 1


def test_an_engine_without_the_capability_is_still_a_400(fake_server_factory):
    server = fake_server_factory(FakeEngine(FakeScript(), structured=False))
    r = CONSTRAINED["ocr schema"](server)
    assert r.status_code == 400 and r.json()["error"]["code"] == "structured_outputs_unsupported"
