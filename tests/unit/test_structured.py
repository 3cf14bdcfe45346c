"""Structured outputs: a caller's schema bounded before any grammar is compiled, and outputs checked
against it (pipeline/structured.py); the job codec keeps a constraint."""

from __future__ import annotations

import json
import time

import pytest

from hyocr.errors import InvalidRequest
from hyocr.jobs.codec import call_from_json, call_to_json
from hyocr.pipeline import structured
from hyocr.types import OcrCall, SamplingParams, StructuredOutput

INVOICE = {
    "type": "object",
    "properties": {
        "invoice_no": {"type": "string"},
        "currency": {"enum": ["USD", "EUR", "CNY"]},
        "items": {"type": "array", "items": {"$ref": "#/$defs/item"}},
        "total": {"type": "number"},
    },
    "required": ["invoice_no", "items"],
    "$defs": {"item": {"type": "object", "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}},
                       "required": ["name", "qty"]}},
}


def _refused(schema, fragment: str) -> None:
    started = time.perf_counter()
    with pytest.raises(InvalidRequest) as info:
        structured.from_schema(schema)
    assert fragment in info.value.message, info.value.message
    assert info.value.code == "invalid_schema" and info.value.param == "schema"
    assert time.perf_counter() - started < 1.0  # refused before anything is compiled


def test_a_schema_is_canonical_json_and_its_properties_are_the_fields():
    constraint = structured.from_schema(INVOICE)
    assert constraint.kind == "json_schema" and json.loads(constraint.json_schema) == INVOICE
    assert structured.from_schema(json.dumps(INVOICE)) == constraint  # a form field's JSON text: the same key
    assert structured.extraction_keys(constraint) == ("invoice_no", "currency", "items", "total")
    with pytest.raises(InvalidRequest, match="top level is an object with properties"):
        structured.extraction_keys(structured.from_schema({"type": "array", "items": {"type": "string"}}))


@pytest.mark.parametrize(("schema", "fragment"), [
    ("{not json", "not valid JSON"),
    (["a"], "must be an object"),
    ({"type": "object", "properties": {f"k{i}": {"type": "string", "description": "x" * 40} for i in range(900)}},
     "limited to 32768 bytes"),
    ({"type": "string", "maxLength": 100_000}, "maxLength must be an integer from 0 to 10000"),
    ({"type": "array", "minItems": -1}, "minItems must be an integer"),
    ({"type": "object", "properties": {f"k{i}": {"type": "string", "minLength": 100 + i} for i in range(9)}},
     "at most 8 distinct string length bounds"),
    ({"type": "string", "pattern": "^(a{5000})$"}, "add up to at most 1000"),
    ({"type": "string", "pattern": "("}, "invalid pattern"),
    ({"$ref": "https://example.com/schema.json"}, "only local $ref"),
    ({"enum": list(range(1001))}, "at most 1000 enum values"),
    ({"type": "object", "properties": {"a": {"type": "nonsense"}}}, "not a valid JSON Schema"),
])
def test_a_hostile_or_broken_schema_is_a_400_at_once(schema, fragment):
    _refused(schema, fragment)


def test_nesting_and_subschema_counts_are_bounded():
    deep: dict = {"type": "string"}
    for _ in range(12):
        deep = {"type": "object", "properties": {"x": deep}}
    _refused(deep, "nest at most 10 deep")
    wide = {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}} for _ in range(300)]}
    _refused(wide, "at most 500 subschemas")


def test_choices_are_bounded():
    assert structured.from_choice(["yes", "no", "yes"]).choice == ("yes", "no")
    for bad in ([], ["ok", ""], [1], ["x" * 1001]):
        with pytest.raises(InvalidRequest):
            structured.from_choice(bad)


def test_an_output_is_validated_and_a_mismatch_says_where():
    constraint = structured.from_schema(INVOICE)
    good = '{"invoice_no":"A-1","items":[{"name":"pen","qty":2}],"total":3.5}'
    assert structured.parse_output(good, constraint) == (json.loads(good), None)
    value, error = structured.parse_output('{"invoice_no":"A-1","items":[{"name":"pen","qty":"two"}]}', constraint)
    assert value is None and "at $.items[0].qty" in error and "not of type 'integer'" in error
    value, error = structured.parse_output("no json here", constraint)
    assert value is None and error.startswith("the output is not JSON")


def test_an_output_cut_short_keeps_its_complete_members_when_they_still_validate():
    constraint = structured.from_schema(INVOICE)
    # the cut may be inside the last value ("total":3 of 3999): the members before it are what was written whole
    cut = '{"invoice_no":"A-1","items":[{"name":"pen","qty":2}],"total":3'
    assert structured.parse_output(cut, constraint, complete=False) == (
        {"invoice_no": "A-1", "items": [{"name": "pen", "qty": 2}]}, None)
    whole = '{"invoice_no":"A-1","items":[]}'  # the object ended exactly at max_tokens
    assert structured.parse_output(whole, constraint, complete=False) == ({"invoice_no": "A-1", "items": []}, None)
    value, error = structured.parse_output('{"invoice_no":"A-1","ite', constraint, complete=False)
    assert value is None and "required property" in error and "stopped early" in error
    # a string cut inside its value is not repaired into a whole-looking one (a helper round got the cut text
    # back as the field's value, with no error)
    name = structured.from_schema({"type": "object", "properties": {"name": {"type": "string"}},
                                   "required": ["name"]})
    value, error = structured.parse_output('{"name":" vtq vtq vtq', name, complete=False)
    assert value is None and "stopped before its JSON was complete" in error


def test_json_object_and_choice_outputs():
    assert structured.parse_output('{"a":1}', structured.JSON_OBJECT) == ({"a": 1}, None)
    assert structured.parse_output("[1]", structured.JSON_OBJECT)[1] == "the output is not a JSON object"
    yes_no = structured.from_choice(["yes", "no"])
    assert structured.parse_output("no", yes_no) == ("no", None)
    assert structured.parse_output("maybe", yes_no)[0] is None


def test_a_job_keeps_its_constraint():
    for constraint in (structured.from_schema(INVOICE), structured.JSON_OBJECT, structured.from_choice(["a", "b"])):
        call = OcrCall(media=(), sampling=SamplingParams(max_tokens=9, structured=constraint))
        restored = call_from_json(json.loads(json.dumps(call_to_json(call))))
        assert restored.sampling == call.sampling and isinstance(restored.sampling.structured, StructuredOutput)
    plain = OcrCall(media=())
    assert call_from_json(json.loads(json.dumps(call_to_json(plain)))).sampling.structured is None


@pytest.mark.parametrize(("schema", "fragment"), [
    ({"$schema": 5, "type": "object"}, "$schema names a JSON Schema draft"),
    ({"$schema": "http://[x", "type": "object"}, "$schema names a JSON Schema draft"),
    ('{"type": "string", "enum": ["\\ud800"]}', "not a JSON object"),  # a lone surrogate in JSON text
    ({"type": "string", "pattern": "^((a{400}){400})$"}, "add up to at most 1000"),
    ({"type": "string", "pattern": "^a{,100000}$"}, "add up to at most 1000"),
    ({"$defs": {"a": {"$ref": "#/$defs/missing"}}, "$ref": "#/$defs/a"}, "not a usable JSON Schema"),
])
def test_schemas_that_would_trip_the_validator_or_the_compiler_are_400s(schema, fragment):
    _refused(schema, fragment)


def test_nesting_through_any_keyword_is_bounded():
    deep: dict = {"type": "string"}
    for _ in range(60):  # contentSchema is not a keyword the walk follows; the JSON depth bound still holds
        deep = {"contentSchema": deep}
    _refused(deep, "nests more than 40 levels")


def test_a_recursive_schema_is_allowed_and_its_deep_output_never_raises():
    tree = structured.from_schema({"type": "object", "properties": {"x": {"$ref": "#"}}})
    value = {}
    for _ in range(3000):
        value = {"x": value}
    text = json.dumps({"x": {"x": {}}})
    assert structured.parse_output(text, tree) == ({"x": {"x": {}}}, None)
    assert structured._violation(value, tree) in (None, "the output could not be validated against the schema "
                                                        "(RecursionError)")


def test_a_choice_is_compared_as_written():
    spaced = structured.from_choice([" a", "b"])
    assert structured.parse_output(" a", spaced) == (" a", None)
    assert structured.parse_output("b\n", spaced) == ("b", None)
