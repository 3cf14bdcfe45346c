"""Issue 29 on the real engines (transformers with xgrammar, vLLM CPU) and the tiny checkpoint: patterns with
exact counts decode under their constraint end to end, and each engine checks at start that structured outputs
work (one constrained token), reporting them off with the reason when they do not (engines/capabilities.py).

The faults are injected where the real failure was: vLLM validates a constrained request in this process and
imports every structured-output backend to do so (0.26 failed on a missing lm-format-enforcer); the
transformers engine builds xgrammar's compiler in this process too."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import sys

import openai
import requests
from imaging import card
from servers import LiveServer

from hyocr.config import load_settings

CARD_URL = "data:image/png;base64," + base64.b64encode(card().png()).decode()
SIX_DIGITS, CHINESE_ID = "^[0-9]{6}$", r"^\d{17}[\dX]$"
IDS = {"type": "object", "additionalProperties": False, "required": ["postcode", "id_number"],
       "properties": {"postcode": {"type": "string", "pattern": SIX_DIGITS},
                      "id_number": {"type": "string", "pattern": CHINESE_ID}}}
LFE = "vllm.v1.structured_output.backend_lm_format_enforcer"


def _chat(server, **extra) -> requests.Response:
    body = {"max_tokens": 120, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": CARD_URL}}, {"type": "text", "text": "Read the card."}]}], **extra}
    return requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)


def _extract(server, schema) -> requests.Response:
    return requests.post(f"{server.url}/v1/ocr", json={"image": CARD_URL, "task": "extract", "schema": schema,
                                                       "max_tokens": 120}, timeout=300)


def _model(server) -> dict:
    return requests.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["hyocr"]


def _matches(value: dict) -> bool:
    return bool(re.fullmatch(SIX_DIGITS, value["postcode"]) and re.fullmatch(CHINESE_ID, value["id_number"]))


# ---------------------------------------------------------------- section 2: exact counts, end to end


def test_exact_count_patterns_are_kept_on_ocr_and_chat(model_server):
    page = _extract(model_server, IDS)
    assert page.status_code == 200, page.text
    fields = page.json()["pages"][0]["fields"]
    assert fields is not None and _matches(fields), page.json()["pages"][0]
    fmt = {"type": "json_schema", "json_schema": {"name": "ids", "schema": IDS}}
    r = openai.OpenAI(base_url=f"{model_server.url}/v1", api_key="x", max_retries=0, timeout=300).chat.completions \
        .create(model="x", max_tokens=120, response_format=fmt, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": CARD_URL}}, {"type": "text", "text": "Read the card."}]}])
    assert r.choices[0].finish_reason == "stop" and _matches(json.loads(r.choices[0].message.content))


def test_an_oversized_pattern_is_still_refused_before_the_engine(model_server):
    huge = {"type": "object", "properties": {"n": {"type": "string", "pattern": "^([0-9]{100}){11}$"}}}
    for r in (_extract(model_server, huge),
              _chat(model_server, response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": huge}})):
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_schema", r.text


# ---------------------------------------------------------------- section 3: the start-up check


def test_a_healthy_engine_passes_its_check_and_keeps_structured_outputs(model_server):
    info = _model(model_server)
    assert info["structured_outputs"] is True and info["structured_outputs_check"] == "passed"


def _refused_while_the_rest_works(server) -> None:
    for r in (_extract(server, IDS), _chat(server, response_format={"type": "json_object"}),
              _chat(server, guided_json=IDS)):
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["code"] == "structured_outputs_unavailable" and "start-up check failed" in error["message"]
        assert "ModuleNotFoundError" in error["message"] or "ImportError" in error["message"]
    plain = requests.post(f"{server.url}/v1/ocr", json={"image": CARD_URL, "task": "text", "max_tokens": 4},
                          timeout=300)
    assert plain.status_code == 200, plain.text
    assert requests.get(f"{server.url}/ready", timeout=30).status_code == 200


def test_vllm_without_a_backend_it_imports_turns_structured_outputs_off(tiny_checkpoint, vllm_cpu_environment,
                                                                        monkeypatch):
    monkeypatch.setitem(sys.modules, LFE, None)  # "import of ... halted": ModuleNotFoundError, as on the GPU
    settings = load_settings(engine="vllm", model=str(tiny_checkpoint), served_model_name="broken",
                             dtype="bfloat16", max_model_len=4096, max_num_seqs=2, trust_remote_code=True)
    server = LiveServer(settings).start(timeout=300)
    try:
        info = _model(server)
        assert info["structured_outputs"] is False
        assert info["structured_outputs_check"].startswith("failed: vLLM generation failed: EngineGenerateError <- "
                                                           "ModuleNotFoundError: import of " + LFE)
        _refused_while_the_rest_works(server)
    finally:
        server.stop()


def test_transformers_with_a_broken_xgrammar_turns_structured_outputs_off(tiny_checkpoint, monkeypatch):
    import xgrammar

    def broken(*args, **kwargs):  # xgrammar installed, its native part not loadable
        try:
            raise OSError("libxgrammar_bindings.so: cannot open shared object file")
        except OSError as exc:
            raise ImportError("xgrammar's compiler is not available") from exc

    monkeypatch.setattr(xgrammar, "GrammarCompiler", broken)
    os.environ["HF_HUB_OFFLINE"] = "1"
    server = LiveServer(load_settings(engine="transformers", model=str(tiny_checkpoint), max_model_len=4096)).start()
    try:
        info = _model(server)
        assert info["structured_outputs"] is False
        assert info["structured_outputs_check"] == (
            "failed: the grammar compiler could not start: ImportError: xgrammar's compiler is not available <- "
            "OSError: libxgrammar_bindings.so: cannot open shared object file")
        for r in (_extract(server, IDS), _chat(server, response_format={"type": "json_object"})):
            assert r.status_code == 503 and r.json()["error"]["code"] == "structured_outputs_unavailable", r.text
            assert "(OSError)" in r.json()["error"]["message"]
            assert "libxgrammar" not in r.json()["error"]["message"]  # the type, never the message
        monkeypatch.undo()  # the package repaired: the next start (a supervisor's restart) checks again
        supervisor = server.app.state.supervisor
        loop = supervisor._task.get_loop()  # the server's loop, where the engine lives

        def on_server(coro):
            return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=600)

        # Its watch first: it would take the restart's stopped engine for a failed probe and start a second load
        # beside this one (the race a stop and start from this thread lost on a busy machine).
        on_server(supervisor.stop())
        assert on_server(supervisor.restart("xgrammar repaired")) is True
        assert _model(server)["structured_outputs"] is True and _model(server)["structured_outputs_check"] == "passed"
        assert _extract(server, IDS).status_code == 200
    finally:
        server.stop()
