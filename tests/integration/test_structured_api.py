"""Output constraints through the HTTP API: /v1/ocr's ``schema``, the chat route's ``response_format`` and
vLLM's spellings, the 400s a bad or hostile one gets, and the openai engine forwarding them. The fake engine
records the constraint it was given; the real engines keeping it are tests/models/test_structured_outputs.py."""

from __future__ import annotations

import base64
import json

import pytest
import requests
from imaging import card

from hyocr.engines.fake import FakeEngine, FakeScript
from hyocr.types import StructuredOutput

IMAGE = base64.b64encode(card().png()).decode()
URL = "data:image/png;base64," + IMAGE
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "id": {"type": "string"}},
          "required": ["name", "id"]}


@pytest.fixture
def fake(fake_server_factory):
    engine = FakeEngine(FakeScript())
    return fake_server_factory(engine), engine


def _chat(server, text: str = "提取图中的文字。", **extra) -> requests.Response:
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": URL}},
                                                      {"type": "text", "text": text}]}], **extra}
    return requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=30)


def _error(r: requests.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_a_schema_sets_the_fields_the_prompt_names_and_the_constraint(fake):
    server, engine = fake
    r = requests.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "extract", "schema": SCHEMA}, timeout=30)
    assert r.status_code == 200, r.text
    page = r.json()["pages"][0]
    assert page["fields"] == {"name": "fake name", "id": "fake id"} and page.get("error") is None
    seen = engine.requests[-1]
    assert "['name','id']" in seen.prompt  # the official extraction prompt, from the schema's properties
    assert seen.sampling.structured == StructuredOutput(json_schema=json.dumps(SCHEMA, separators=(",", ":")))


def test_a_page_that_does_not_match_the_schema_says_where(fake):
    server, _ = fake
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}}}
    r = requests.post(f"{server.url}/v1/ocr", json={"image": IMAGE, "task": "extract", "schema": schema}, timeout=30)
    page = r.json()["pages"][0]
    assert page.get("fields") is None and "at $.qty" in page["error"] and "not of type 'integer'" in page["error"]


def test_a_schema_in_a_multipart_form_is_json_text(fake):
    server, engine = fake
    r = requests.post(f"{server.url}/v1/ocr", files={"file": ("card.png", card().png(), "image/png")},
                      data={"task": "extract", "schema": json.dumps(SCHEMA)}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["pages"][0]["fields"] == {"name": "fake name", "id": "fake id"}
    assert engine.requests[-1].sampling.structured.kind == "json_schema"


@pytest.mark.parametrize(("body", "param", "fragment"), [
    ({"task": "text", "schema": SCHEMA}, "schema", "schema is for task=extract"),
    ({"task": "extract", "schema": SCHEMA, "fields": ["name"]}, "fields", "not both"),
    ({"task": "extract", "schema": {"type": "string", "maxLength": 10**6}}, "schema", "maxLength"),
    ({"task": "extract", "schema": {"type": "array", "items": {}}}, "schema", "top level is an object"),
    ({"task": "extract", "schema": {"type": "object", "properties": {"a'b": {}}}}, "fields", "quote"),
])
def test_bad_schemas_are_400s_in_the_openai_shape(fake, body, param, fragment):
    server, engine = fake
    before = len(engine.requests)
    error = _error(requests.post(f"{server.url}/v1/ocr", json={"image": IMAGE, **body}, timeout=30))
    assert error["param"] == param and fragment in error["message"] and error["type"] == "invalid_request_error"
    assert len(engine.requests) == before  # nothing reached the engine


def test_chat_constraints_in_openai_and_vllm_spellings(fake):
    server, engine = fake
    spellings = {
        "response_format": ({"type": "json_schema", "json_schema": {"name": "card", "schema": SCHEMA}}, "json_schema"),
        "structured_outputs": ({"json": SCHEMA}, "json_schema"),
        "guided_json": (SCHEMA, "json_schema"),
        "guided_choice": (["yes", "no"], "choice"),
    }
    for name, (value, kind) in spellings.items():
        r = _chat(server, **{name: value})
        assert r.status_code == 200, (name, r.text)
        assert engine.requests[-1].sampling.structured.kind == kind, name
    assert _chat(server, response_format={"type": "json_object"}).status_code == 200
    assert engine.requests[-1].sampling.structured == StructuredOutput(json_object=True)
    assert _chat(server, response_format={"type": "text"}).status_code == 200
    assert engine.requests[-1].sampling.structured is None


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_object"}, "guided_json": SCHEMA}, "guided_json"),
    ({"structured_outputs": {"regex": "a+"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"json": SCHEMA, "choice": ["a"]}}, "structured_outputs"),
    ({"guided_grammar": "root ::= 'a'"}, "guided_grammar"),
    ({"guided_regex": "a+"}, "guided_regex"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "http://x/s"}}}},
     "response_format.json_schema.schema"),
])
def test_chat_constraints_that_are_refused(fake, extra, param):
    server, _ = fake
    assert _error(_chat(server, **extra))["param"] == param


def test_an_engine_that_cannot_constrain_says_so(rapid_server):
    error = _error(requests.post(f"{rapid_server.url}/v1/ocr",
                                 json={"image": IMAGE, "task": "extract", "schema": SCHEMA}, timeout=60))
    assert error["code"] == "structured_outputs_unsupported" and "rapidocr" in error["message"]
    error = _error(_chat(rapid_server, response_format={"type": "json_object"}))
    assert error["code"] == "structured_outputs_unsupported" and error["param"] == "response_format"


def test_the_openai_engine_forwards_the_constraint(fake_server_factory):
    upstream_engine = FakeEngine(FakeScript(), model="tencent/HunyuanOCR")
    upstream = fake_server_factory(upstream_engine)
    front = fake_server_factory(engine="openai", upstream_url=upstream.url)
    r = requests.post(f"{front.url}/v1/ocr", json={"image": IMAGE, "task": "extract", "schema": SCHEMA}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["pages"][0]["fields"] == {"name": "fake name", "id": "fake id"}
    forwarded = upstream_engine.requests[-1].sampling.structured
    assert forwarded is not None and json.loads(forwarded.json_schema) == SCHEMA
    assert _chat(front, guided_choice=["yes", "no"]).status_code == 200
    assert upstream_engine.requests[-1].sampling.structured.choice == ("yes", "no")


def test_a_constraint_cannot_be_forced_past_its_end(fake):
    server, _ = fake
    body = {"image": IMAGE, "task": "extract", "schema": SCHEMA, "ignore_eos": True}
    assert _error(requests.post(f"{server.url}/v1/ocr", json=body, timeout=30))["param"] == "ignore_eos"
    assert _error(_chat(server, response_format={"type": "json_object"}, min_tokens=5))["param"] == "min_tokens"
    # and min_tokens past the (default) max_tokens is a 400, not an engine failure
    assert _error(_chat(server, min_tokens=100_000))["param"] in ("min_tokens", "max_tokens")
