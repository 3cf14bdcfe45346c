"""An engine failure's cause over real HTTP (issue 29): the log line names the whole exception chain, the
client's JSON 500 names the root cause's type and nothing of its message, streamed or not. The engine fails as
the vLLM engine did on the GPU: vLLM's ``EngineGenerateError()`` from an ImportError, through
``engine_failure``."""

from __future__ import annotations

import base64
import json
import logging
import re

import requests
from imaging import card

from hyocr.engines.fake import FakeEngine, FakeScript
from hyocr.errors import engine_failure
from hyocr.types import EngineChunk

IMAGE = "data:image/png;base64," + base64.b64encode(card().png()).decode()
CHAIN = "EngineGenerateError <- ModuleNotFoundError: No module named 'lmformatenforcer'"


class EngineGenerateError(Exception):  # vLLM's: raised with no message, from the real error
    pass


class _ChainedFailure(FakeEngine):
    """Writes ``before`` chunks, then fails as VllmEngine.generate does around AsyncLLM.generate."""

    def __init__(self, before: int = 0) -> None:
        super().__init__(FakeScript())
        self.before = before

    async def generate(self, request):
        for _ in range(self.before):
            yield EngineChunk(text="tok ", completion_tokens=1)
        try:
            try:
                raise ModuleNotFoundError("No module named 'lmformatenforcer'", name="lmformatenforcer")
            except ImportError as exc:
                raise EngineGenerateError() from exc
        except Exception as exc:
            raise engine_failure(exc, "vLLM generation failed") from exc


def _chat(url: str, stream: bool = False) -> requests.Response:
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE}},
                                             {"type": "text", "text": "read"}]}]
    return requests.post(f"{url}/v1/chat/completions", json={"messages": messages, "stream": stream}, timeout=30,
                         stream=stream)


def _logged(caplog, request_id: str) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and request_id in r.getMessage())


def test_the_log_names_the_chain_and_the_client_the_root_type(fake_server_factory, caplog):
    server = fake_server_factory(_ChainedFailure())
    with caplog.at_level(logging.INFO):
        responses = [_chat(server.url),
                     requests.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "text"}, timeout=30)]
    for r in responses:
        assert r.status_code == 500 and r.headers["content-type"] == "application/json", r.text
        error = r.json()["error"]
        rid = r.headers["x-request-id"]
        assert error["type"] == "engine_error" and rid in error["message"]
        assert error["message"].endswith(": ModuleNotFoundError")
        assert "lmformatenforcer" not in error["message"]  # a message may hold internals: never sent
        assert f"vLLM generation failed: {CHAIN}" in _logged(caplog, rid)


def test_a_stream_that_fails_logs_the_chain_and_ends_with_an_error_event(fake_server_factory, caplog):
    server = fake_server_factory(_ChainedFailure(before=2))
    with caplog.at_level(logging.INFO):
        r = _chat(server.url, stream=True)
        lines = [line.removeprefix("data: ") for line in r.iter_lines(decode_unicode=True) if line]
    assert r.status_code == 200 and lines[-1] == "[DONE]"
    error = json.loads(lines[-2])["error"]
    assert error["type"] == "engine_error" and error["message"].endswith(": ModuleNotFoundError")
    quoted = re.search(r"request id (\S+)\)", error["message"])[1]  # the id the client was told to quote
    assert CHAIN in _logged(caplog, quoted)  # before: a failed stream logged nothing


def test_a_stream_that_fails_before_its_first_token_is_an_http_error(fake_server_factory, caplog):
    # No status line goes out before the engine's first event: a client (and its retry logic) sees the 500
    server = fake_server_factory(_ChainedFailure(before=0))
    with caplog.at_level(logging.INFO):
        r = _chat(server.url, stream=True)
    assert r.status_code == 500 and r.headers["content-type"] == "application/json", r.text
    error = r.json()["error"]
    assert error["type"] == "engine_error" and error["message"].endswith(": ModuleNotFoundError")
    assert CHAIN in _logged(caplog, r.headers["x-request-id"])


def test_the_traceback_is_logged_at_debug_level(fake_server_factory, caplog):
    server = fake_server_factory(_ChainedFailure())
    with caplog.at_level(logging.DEBUG, logger="hyocr.engines"):
        assert _chat(server.url).status_code == 500
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and r.name == "hyocr.engines"]
    assert any("Traceback (most recent call last)" in m and "ModuleNotFoundError" in m for m in debug)
