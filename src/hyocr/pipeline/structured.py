"""Structured outputs: a caller's JSON Schema (or json_object / choice) checked, bounded and turned into a
``StructuredOutput`` for the engine, and the output checked against it before it is returned.

A schema becomes a grammar that the engine compiles before it can decode (xgrammar, in vLLM and in the
transformers engine). Compiling is the attack surface: measured with xgrammar 0.2.8 on a 120k-token vocabulary
(2 cores), a typical invoice schema compiles in 40 ms, but each distinct string length bound costs 0.4-1.2 s
(20 of them: 13-15 s), 2000 properties 8 s and ``maxLength: 100000`` 3 s. The bounds below keep the worst
schema a client can send to a few seconds of compiling, and anything past them is a 400, not a hung compiler.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from ..errors import InvalidRequest
from ..hunyuan.extraction import extract_json
from ..types import StructuredOutput

__all__ = ["JSON_OBJECT", "extraction", "extraction_keys", "from_choice", "from_schema", "parse_output",
           "pattern_size"]

MAX_SCHEMA_BYTES = 32_768  # the schema as compact JSON
MAX_DEPTH = 10  # subschemas nested in subschemas
MAX_SUBSCHEMAS = 500
MAX_ENUM_VALUES = 1000  # enum and const values, all together
MAX_BOUND = 10_000  # minLength / maxLength / minItems / maxItems / minProperties / maxProperties
MAX_LENGTH_BOUNDS = 8  # distinct string length bounds (each costs up to ~1 s of compiling)
MAX_PATTERNS = 16
MAX_PATTERN_CHARS = 256
MAX_PATTERN_REPEAT = 1000  # items a pattern is once its counted repetitions are written out (pattern_size)
MAX_CHOICES = 100
MAX_CHOICE_CHARS = 1000

JSON_OBJECT = StructuredOutput(json_object=True)

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONES = ("additionalProperties", "items", "not", "if", "then", "else", "contains", "propertyNames",
                "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_BOUNDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
# {n}, {m,}, {m,n}, {,n} (whitespace tolerated: counted even where a regex engine reads it as literal text)
_QUANTIFIER = re.compile(r"\{\s*(\d*)\s*(,\s*(\d*)\s*)?\}")
MAX_JSON_DEPTH = 4 * MAX_DEPTH  # the whole document, whatever keywords nest it (a subschema is ~2 levels)


class _Budget:
    def __init__(self, param: str) -> None:
        self.param = param
        self.subschemas = self.enum_values = 0
        self.length_bounds: set[tuple[Any, Any]] = set()
        self.patterns = 0
        self.refs: set[str] = set()

    def refuse(self, message: str) -> InvalidRequest:
        return InvalidRequest(f"{self.param}: {message}", param=self.param, code="invalid_schema")


def _check_pattern(pattern: Any, budget: _Budget) -> None:
    if not isinstance(pattern, str):
        raise budget.refuse("a pattern must be a string")
    budget.patterns += 1
    if budget.patterns > MAX_PATTERNS:
        raise budget.refuse(f"at most {MAX_PATTERNS} patterns")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise budget.refuse(f"a pattern is limited to {MAX_PATTERN_CHARS} characters")
    if pattern_size(pattern) > MAX_PATTERN_REPEAT:
        raise budget.refuse(f"a pattern written out with its counted repetitions ({{n}}, {{m,}}, {{m,n}}; nested ones "
                            f"multiply) may add up to at most {MAX_PATTERN_REPEAT} items")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise budget.refuse(f"invalid pattern {pattern[:40]!r}: {exc}") from None


def pattern_size(pattern: str) -> int:
    """How many items (characters, classes, escapes) ``pattern`` is once its counted repetitions are written
    out, as a grammar compiler expands them: ``a{6}`` is 6, ``a{6,}`` 6 (the rest is a loop), ``a{2,6}`` 6,
    ``(ab){3}`` 6, and nested counts multiply. ``\\{`` and a ``{`` that starts no count are literals; ``*``,
    ``+``, ``?`` and the anchors add nothing. Over-counts a little (group flags), never under-counts. Stops once
    past MAX_PATTERN_REPEAT, so a hostile count costs nothing to add up."""
    sizes = [0]  # each open group's size so far, the pattern's own first
    last = 0  # the size of the item a quantifier here repeats (0 after "(" or "|": nothing to repeat)
    i = 0
    while i < len(pattern) and sizes[-1] <= MAX_PATTERN_REPEAT:
        ch = pattern[i]
        if ch == "{" and (count := _count(pattern, i)) is not None:
            times, i = count
            sizes[-1] += last * (times - 1)  # the item is in once already
            last *= times
            continue
        if ch == "(":
            sizes.append(0)
            last = 0
        elif ch in "|^$":  # an alternative starts; anchors match no character
            last = 0
        elif ch == ")":
            last = sizes.pop() if len(sizes) > 1 else 0  # unbalanced: re.compile refuses it afterwards
            sizes[-1] += last
        elif ch not in "*+?":  # one item: a character, an escape, a class
            last = 1
            sizes[-1] += 1
            if ch == "\\":
                i += 1
            elif ch == "[":
                i = _class_end(pattern, i) - 1
        i += 1
    return max(sizes)


def _count(pattern: str, at: int) -> tuple[int, int] | None:
    """The count of the quantifier at ``pattern[at] == "{"`` and where it ends, or None: a literal brace."""
    match = _QUANTIFIER.match(pattern, at)
    if match is None or not (match[1] or match[3]):
        return None
    digits = match[3] if match[2] and match[3] else match[1]  # {m,n} and {,n}: n; {n} and {m,}: the number given
    count = int(digits) if len(digits) <= 6 else MAX_PATTERN_REPEAT + 1
    return max(count, 1), match.end()


def _class_end(pattern: str, at: int) -> int:
    """Where the character class opened at ``pattern[at] == "["`` ends (a "]" first in it is a literal)."""
    i = at + 1
    if pattern.startswith("^", i):
        i += 1
    if pattern.startswith("]", i):
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _walk(node: Any, depth: int, budget: _Budget) -> None:
    if isinstance(node, bool):  # true / false are schemas too
        return
    if not isinstance(node, dict):
        raise budget.refuse("every subschema must be an object or a boolean")
    budget.subschemas += 1
    if budget.subschemas > MAX_SUBSCHEMAS:
        raise budget.refuse(f"at most {MAX_SUBSCHEMAS} subschemas")
    if depth > MAX_DEPTH:
        raise budget.refuse(f"subschemas nest at most {MAX_DEPTH} deep")
    ref = node.get("$ref")
    if ref is not None and (not isinstance(ref, str) or not ref.startswith("#")):
        raise budget.refuse("only local $ref (#/$defs/...) is allowed: nothing is fetched")
    if ref is not None:
        budget.refs.add(ref)
    for key in _BOUNDS:
        value = node.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_BOUND):
            raise budget.refuse(f"{key} must be an integer from 0 to {MAX_BOUND}")
    if "minLength" in node or "maxLength" in node:
        budget.length_bounds.add((node.get("minLength"), node.get("maxLength")))
        if len(budget.length_bounds) > MAX_LENGTH_BOUNDS:
            raise budget.refuse(f"at most {MAX_LENGTH_BOUNDS} distinct string length bounds (minLength/maxLength)")
    if "pattern" in node:
        _check_pattern(node["pattern"], budget)
    for key in ("enum", "const"):
        if key in node:
            values = node[key] if key == "enum" else [node[key]]
            if not isinstance(values, list):
                raise budget.refuse("enum must be an array")
            budget.enum_values += len(values)
            if budget.enum_values > MAX_ENUM_VALUES:
                raise budget.refuse(f"at most {MAX_ENUM_VALUES} enum values")
    for key in _SCHEMA_MAPS:
        children = node.get(key)
        if children is None:
            continue
        if not isinstance(children, dict):
            raise budget.refuse(f"{key} must be an object")
        for name, child in children.items():
            if key == "patternProperties":
                _check_pattern(name, budget)
            _walk(child, depth + 1, budget)
    for key in _SCHEMA_LISTS:
        children = node.get(key)
        if children is None:
            continue
        if not isinstance(children, list):
            raise budget.refuse(f"{key} must be an array")
        for child in children:
            _walk(child, depth + 1, budget)
    for key in _SCHEMA_ONES:
        child = node.get(key)
        if isinstance(child, list) and key == "items":  # draft-4 tuple form
            for item in child:
                _walk(item, depth + 1, budget)
        elif child is not None:
            _walk(child, depth + 1, budget)


def from_schema(schema: Any, *, param: str = "schema") -> StructuredOutput:
    """A caller's JSON Schema, checked and bounded; a 400 (code ``invalid_schema``) says what is wrong."""
    budget = _Budget(param)
    if isinstance(schema, str):  # a form field, or a client that sends the schema as a JSON string
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError):
            raise budget.refuse("not valid JSON") from None
    if not isinstance(schema, dict):
        raise budget.refuse("a JSON Schema must be an object")
    if _json_depth(schema) > MAX_JSON_DEPTH:
        raise budget.refuse(f"the schema nests more than {MAX_JSON_DEPTH} levels of JSON")
    try:
        text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        size = len(text.encode())
    except (ValueError, RecursionError):  # NaN, a lone surrogate
        raise budget.refuse("not a JSON object") from None
    if size > MAX_SCHEMA_BYTES:
        raise budget.refuse(f"the schema is limited to {MAX_SCHEMA_BYTES} bytes of JSON")
    if "$schema" in schema and schema["$schema"] not in _METASCHEMAS:
        raise budget.refuse("$schema names a JSON Schema draft (2020-12, 2019-09, 7, 6 or 4), or is left out")
    _walk(schema, 0, budget)
    from jsonschema import Draft202012Validator, SchemaError, validators

    try:
        validators.validator_for(schema, default=Draft202012Validator).check_schema(schema)
        _resolve_refs(schema, budget.refs)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise budget.refuse(f"not a valid JSON Schema: {exc.message[:200]}" + (f" (at {where})" if where else "")) from None
    except Exception as exc:  # noqa: BLE001 - a hostile schema must be a 400, whatever the validator trips on
        raise budget.refuse(f"not a usable JSON Schema ({type(exc).__name__})") from None
    return StructuredOutput(json_schema=text)


def _resolve_refs(schema: dict, refs: set[str]) -> None:
    """Every local $ref points somewhere (a dangling one would fail the compiler or the validation later)."""
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012

    resolver = Registry().with_resource("urn:hyocr", DRAFT202012.create_resource(schema)).resolver("urn:hyocr")
    for ref in refs:
        resolver.lookup(ref)


_METASCHEMAS = frozenset({
    "https://json-schema.org/draft/2020-12/schema", "https://json-schema.org/draft/2019-09/schema",
    "http://json-schema.org/draft-07/schema#", "http://json-schema.org/draft-07/schema",
    "http://json-schema.org/draft-06/schema#", "http://json-schema.org/draft-06/schema",
    "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-04/schema",
})


def _json_depth(value: Any) -> int:
    """How deep a parsed JSON value nests (iteratively: a hostile one must not exhaust the stack here)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:
            break
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def from_choice(values: Any, *, param: str = "structured_outputs.choice") -> StructuredOutput:
    budget = _Budget(param)
    if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
        raise budget.refuse("choice must be a non-empty array of non-empty strings")
    if len(values) > MAX_CHOICES or sum(len(v) for v in values) > MAX_CHOICE_CHARS:
        raise budget.refuse(f"at most {MAX_CHOICES} choices of {MAX_CHOICE_CHARS} characters in all")
    return StructuredOutput(choice=tuple(dict.fromkeys(values)))


def extraction_keys(structured: StructuredOutput, *, param: str = "schema") -> tuple[str, ...]:
    """The fields an extraction schema asks for (its top-level properties, in order): the official prompt
    names them. The top level must be an object with properties."""
    schema = json.loads(structured.json_schema or "{}")
    properties = schema.get("properties")
    if schema.get("type", "object") != "object" or not isinstance(properties, dict) or not properties:
        raise InvalidRequest(f"{param}: an extraction schema's top level is an object with properties (the fields)",
                             param=param, code="invalid_schema")
    return tuple(properties)


def extraction(schema: Any, *, param: str = "schema") -> tuple[StructuredOutput, tuple[str, ...]]:
    """A caller's extraction schema (/v1/ocr, the web UI): the constraint, and the fields its prompt names."""
    constraint = from_schema(schema, param=param)
    return constraint, extraction_keys(constraint, param=param)


@lru_cache(maxsize=128)
def _validator(schema_text: str) -> Any:
    from jsonschema import Draft202012Validator, validators

    schema = json.loads(schema_text)
    return validators.validator_for(schema, default=Draft202012Validator)(schema)


def _violation(value: Any, structured: StructuredOutput) -> str | None:
    """Why a parsed JSON value breaks the constraint, or None (a choice is checked by parse_output)."""
    if structured.json_object:
        return None if isinstance(value, dict) else "the output is not a JSON object"
    from jsonschema.exceptions import best_match

    try:
        error = best_match(_validator(structured.json_schema or "{}").iter_errors(value))
    except Exception as exc:  # noqa: BLE001 - e.g. RecursionError on a recursive schema's deep output
        return f"the output could not be validated against the schema ({type(exc).__name__})"
    if error is None:
        return None
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return f"the output does not match the schema at ${where}: {error.message[:200]}"


def _member_ends(text: str) -> list[int]:
    """Where, last first, the text could be cut to leave only complete members: before each comma
    outside a string."""
    ends: list[int] = []
    quoted = escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif quoted:
            escaped, quoted = ch == "\\", ch != '"'
        elif ch == '"':
            quoted = True
        elif ch == ",":
            ends.append(i)
    return ends[::-1]


def _strict(text: str) -> tuple[Any, str | None]:
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"{exc}"[:200]


def parse_output(text: str, structured: StructuredOutput, *, complete: bool = True) -> tuple[Any, str | None]:
    """The output's value checked against the constraint: ``(value, None)`` or ``(None, why)``.

    A constrained engine writes exactly the grammar's JSON, which parses as is; an output that stopped early
    (``complete`` False: max_tokens, the loop guard) is closed at the point it stopped, then validated, so a
    record whose required fields were all written before the cut still comes back."""
    if structured.choice:
        value = text if text in structured.choice else text.strip()
        return (value, None) if value in structured.choice else (None, "the output is not one of the choices")
    if complete:
        value, error = extract_json(text)
    else:  # cut: whole as written, or its complete members; a member cut inside its value is dropped, never
        # repaired into a whole-looking one ({"name": "vtq vt -> "vtq vt" passed as the name)
        value, error = _strict(text)
        for cut in _member_ends(text)[:20] if error is not None else ():
            value, error = extract_json(text[:cut])
            if error is None:
                break
    if error is not None:
        reason = "the output stopped before its JSON was complete" if not complete else "the output is not JSON"
        return None, f"{reason}: {error}"
    violation = _violation(value, structured)
    if violation is not None and not complete:
        violation += " (the output stopped early: raise max_tokens?)"
    return (None, violation) if violation else (value, None)
