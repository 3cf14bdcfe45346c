"""Extraction: the fields a page's output gives against the reference's.

Nested values are flattened to paths (``items[0].name``), so a receipt's line items are fields too. A value
is compared as text, normalised as ``text.normalize`` does; two values that both read as numbers compare as
numbers ("12.50" equals 12.5). Per field: exact match and similarity (1 - NED). Field-level precision, recall
and F1 count (path, value) pairs with a non-empty value, as key-information-extraction benchmarks (CORD,
FUNSD) do: a field left empty where the reference is empty is right, but it is no found field. With a JSON
Schema, whether the output validates against it (jsonschema, a hyocr dependency).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .text import normalize, similarity


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [2]}`` -> ``{"a.b": 1, "c[0]": 2}``; an empty object or list is one empty value."""
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for i, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{i}]"))
        return out
    return {prefix: None if isinstance(value, Mapping | list) else value}


def value_text(value: Any, *, fold_case: bool = False) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False)
    return normalize(value, fold_case=fold_case)


def _number(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def same_value(a: str, b: str) -> bool:
    if a == b:
        return True
    x, y = _number(a), _number(b)
    return x is not None and y is not None and x == y


@dataclass(slots=True)
class FieldScore:
    """One page's counts; sums of them give the micro averages."""

    fields: int  # reference fields (paths)
    exact: int  # reference fields the output matches exactly
    similarity_sum: float
    reference_found: int  # (path, value) pairs with a value, in the reference
    output_found: int  # in the output
    correct: int  # pairs in both
    schema_valid: bool | None = None  # None: no schema given
    per_field: dict[str, tuple[bool, float]] = field(default_factory=dict)  # path: (exact, similarity)

    @property
    def precision(self) -> float | None:
        return self.correct / self.output_found if self.output_found else None

    @property
    def recall(self) -> float | None:
        return self.correct / self.reference_found if self.reference_found else None

    def as_dict(self) -> dict:
        from .boxes import f1

        return {"fields": self.fields, "exact": self.exact, "similarity_sum": self.similarity_sum,
                "reference_found": self.reference_found, "output_found": self.output_found,
                "correct": self.correct, "schema_valid": self.schema_valid, "precision": self.precision,
                "recall": self.recall, "f1": f1(self.correct, self.output_found, self.reference_found),
                "per_field": {k: {"exact": e, "similarity": s} for k, (e, s) in self.per_field.items()}}


def schema_valid(output: Any, schema: Mapping[str, Any]) -> bool:
    import jsonschema

    if output is None:
        return False
    try:
        jsonschema.validate(output, schema)
    except jsonschema.ValidationError:
        return False
    return True


def score_fields(reference: Mapping[str, Any], output: Mapping[str, Any] | None, *,
                 schema: Mapping[str, Any] | None = None, fold_case: bool = False) -> FieldScore:
    want = {k: value_text(v, fold_case=fold_case) for k, v in flatten(dict(reference)).items()}
    got = {k: value_text(v, fold_case=fold_case) for k, v in flatten(dict(output or {})).items()} if output else {}
    per_field = {}
    for path, text in want.items():
        found = got.get(path, "")
        exact = same_value(text, found)  # numbers as numbers: "9.50" is "9.5", and so fully similar
        per_field[path] = (exact, 1.0 if exact else similarity(text, found))
    found_pairs = {k: v for k, v in got.items() if v}
    correct = sum(1 for k, v in want.items() if v and k in found_pairs and same_value(v, found_pairs[k]))
    return FieldScore(len(want), sum(e for e, _ in per_field.values()), sum(s for _, s in per_field.values()),
                      sum(1 for v in want.values() if v), len(found_pairs), correct,
                      None if schema is None else schema_valid(output, schema), per_field)
