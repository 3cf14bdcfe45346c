"""Constrained decoding on the real engines (transformers with xgrammar, vLLM's structured outputs) with the
tiny random-weight checkpoint. Random weights are the strongest test of the guarantee: nothing but the
constraint makes their output valid JSON, let alone JSON that matches the schema."""

from __future__ import annotations

import base64
import json

import jsonschema
import openai
import requests
from imaging import Line, card, render

CARD_URL = "data:image/png;base64," + base64.b64encode(card().png()).decode()
RECEIPT = render([Line("TOTAL 12.50", (20, 20)), Line("PAID", (20, 80))], size=(600, 800))
RECEIPT_B64 = base64.b64encode(RECEIPT.png()).decode()

# Nested objects, arrays of line items, enums, integers, booleans, and required keys everywhere. Strings and
# arrays are bounded so that every output ends well inside max_tokens whatever the weights write.
SCHEMA = {
    "type": "object",
    "properties": {
        "merchant": {"type": "string", "maxLength": 16},
        "kind": {"enum": ["invoice", "receipt", "ticket"]},
        "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
            "type": "object",
            "properties": {"desc": {"type": "string", "maxLength": 8},
                           "qty": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["desc", "qty"], "additionalProperties": False}},
        "payment": {"type": "object", "properties": {"paid": {"type": "boolean"},
                                                     "method": {"enum": ["cash", "card"]}},
                    "required": ["paid", "method"], "additionalProperties": False},
    },
    "required": ["merchant", "kind", "items", "payment"],
    "additionalProperties": False,
}


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)


def _metric(server, name: str) -> float:
    text = requests.get(f"{server.url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_extraction_with_a_schema_returns_fields_that_validate_on_every_page(model_server):
    body = {"images": [CARD_URL, RECEIPT_B64], "task": "extract", "schema": SCHEMA, "max_tokens": 400}
    misses = _metric(model_server, 'hyocr_grammar_cache_total{result="miss"}')
    r = requests.post(f"{model_server.url}/v1/ocr", json=body, timeout=300)
    assert r.status_code == 200, r.text
    for page in r.json()["pages"]:
        assert page["error"] is None and page["finish_reason"] == "stop", page
        jsonschema.validate(page["fields"], SCHEMA)
        assert "\n" not in page["text"]  # compact JSON: no whitespace to loop in
    # the schema compiled once (the second page and the next request hit the cache), and the time was measured
    requests.post(f"{model_server.url}/v1/ocr", json=body, timeout=300).raise_for_status()
    assert _metric(model_server, 'hyocr_grammar_cache_total{result="miss"}') <= misses + 1
    assert _metric(model_server, 'hyocr_grammar_cache_total{result="hit"}') >= 1
    assert _metric(model_server, "hyocr_grammar_compile_seconds_count") >= 1


def test_chat_response_format_json_schema_is_kept(model_server):
    r = _client(model_server).chat.completions.create(
        model="x", max_tokens=400, temperature=0,
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": CARD_URL}},
                                               {"type": "text", "text": "What is on this receipt?"}]}],
        response_format={"type": "json_schema", "json_schema": {"name": "receipt", "schema": SCHEMA}},
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_chat_choice_constraint(model_server):
    r = _client(model_server).chat.completions.create(
        model="x", max_tokens=20,
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": CARD_URL}},
                                               {"type": "text", "text": "Is this a card?"}]}],
        extra_body={"structured_outputs": {"choice": ["yes, a card", "no"]}},
    )
    assert r.choices[0].message.content in ("yes, a card", "no")


def test_without_a_constraint_the_same_prompt_is_not_json(model_server):
    """The control: the random weights do not write this JSON by themselves."""
    body = {"image": CARD_URL, "task": "extract", "fields": list(SCHEMA["properties"]), "max_tokens": 60}
    page = requests.post(f"{model_server.url}/v1/ocr", json=body, timeout=300).json()["pages"][0]
    assert page["error"] is not None
