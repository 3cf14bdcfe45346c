"""Field extraction output -> values: lenient JSON parsing and key matching.

HunyuanOCR's extraction output is JSON text, sometimes wrapped in ```json fences, cut off at
max_tokens or slightly malformed (single quotes, Python literals, trailing commas). Parse leniently,
and report what failed instead of raising.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["extract_json", "fields_from_json"]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n?(.*?)(?:```|\Z)", re.DOTALL)

_CLOSERS = {"{": "}", "[": "]"}
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_BARE_WORD = re.compile(r"[A-Za-z_\u4e00-\u9fff][\w\u4e00-\u9fff-]*")
_KEY_COLON = re.compile(r"\s*[:：]")
_MAX_STARTS = 20  # bracket positions tried as the start of the value
_MAX_REPAIRS = 3  # of which this many are also tried repaired (the repair pass is pure Python)


def _strip_fences(text: str) -> str:
    m = _FENCE.search(text)
    return m.group(2) if m else text


def _balanced(text: str, start: int) -> str:
    """The bracketed value starting at ``start``; a truncated one is closed (output hit max_tokens)."""
    stack: list[str] = []
    quote: str | None = None
    i = start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in _CLOSERS:
            stack.append(_CLOSERS[ch])
        elif ch in "]}":
            if stack and stack[-1] == ch:
                stack.pop()
            if not stack:
                return text[start : i + 1]
        i += 1
    return text[start:] + (quote or "") + "".join(reversed(stack))


def _repair(text: str) -> str:
    """Python-ish / sloppy JSON -> JSON: single-quoted strings, True/False/None, trailing commas,
    full-width ``：``/``，`` between tokens, bare keys. Strings are copied untouched except re-quoting."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            j, buf = i + 1, []
            while j < n and text[j] != ch:
                if text[j] == "\\" and j + 1 < n:
                    nxt = text[j + 1]
                    buf.append("'" if nxt == "'" else "\\" + nxt)
                    j += 2
                    continue
                buf.append('\\"' if text[j] == '"' else text[j])
                j += 1
            out.append('"' + "".join(buf) + '"')
            i = j + 1
            continue
        if ch in "：，":
            out.append(":" if ch == "：" else ",")
        elif ch in "]}":
            while out and out[-1].strip() in ("", ","):
                if out.pop().strip() == ",":
                    break
            out.append(ch)
        else:
            m = _BARE_WORD.match(text, i)
            if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] in "._")):
                word = m.group(0)
                if word in _PY_LITERALS:
                    out.append(_PY_LITERALS[word])
                elif word in ("true", "false", "null"):
                    out.append(word)
                elif _KEY_COLON.match(text, m.end()):
                    out.append(json.dumps(word, ensure_ascii=False))
                else:
                    out.append(word)
                i = m.end()
                continue
            out.append(ch)
        i += 1
    return "".join(out)


def _loads(text: str) -> tuple[Any, str | None]:
    try:
        return json.loads(text, strict=False), None
    except json.JSONDecodeError as exc:
        return None, f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
    except (RecursionError, ValueError) as exc:
        return None, f"invalid JSON: {type(exc).__name__}"


def extract_json(text: str) -> tuple[Any | None, str | None]:
    """Lenient JSON out of model output: ``(value, None)`` or ``(None, reason)``; never raises.

    Order: the whole text, then fenced content, then the first bracketed value that parses (as is, then
    repaired). Extraction output is often fenced, wrapped in prose, Python-quoted or cut off at max_tokens.
    A bare JSON scalar is returned as is, so the output ``null`` gives ``(None, None)``.
    """
    if not isinstance(text, str) or not text.strip():
        return None, "empty output"
    try:
        body = text.strip()
        value, error = _loads(body)
        if error is None:
            return value, None
        body = _strip_fences(body).strip()
        starts = [i for i, ch in enumerate(body) if ch in "{["][:_MAX_STARTS]
        if not starts:
            return None, "no JSON object or array found"
        first_error: str | None = None
        candidates: list[str] = []
        covered = -1  # skip brackets nested inside a complete value that already failed
        for start in starts:
            if start < covered:
                continue
            candidate = _balanced(body, start)
            if body.startswith(candidate, start):
                covered = start + len(candidate)
            value, error = _loads(candidate)
            if error is None:
                return value, None
            first_error = first_error or error
            candidates.append(candidate)
        for candidate in candidates[:_MAX_REPAIRS]:
            value, error = _loads(_repair(candidate))
            if error is None:
                return value, None
        return None, first_error
    except Exception as exc:  # noqa: BLE001 - a parser of untrusted text must not fail the request
        return None, f"could not parse JSON: {type(exc).__name__}"


def _norm_key(key: Any) -> str:
    return re.sub(r"\s+", "", str(key)).casefold()


def fields_from_json(value: Any, fields: Sequence[str]) -> dict[str, Any]:
    """Exactly the requested keys, in order; missing ones are None.

    Keys match exactly first, then ignoring case and whitespace ("Invoice No" for "invoice no").
    A list of objects is merged, the first non-null value winning. With no fields requested, all keys
    of the object(s) are returned, since the caller has nothing better to select by.
    """
    if isinstance(value, list):
        merged: dict[str, Any] = {}
        for item in value:
            if isinstance(item, dict):
                for k, v in item.items():
                    if merged.get(str(k)) is None:
                        merged[str(k)] = v
        value = merged
    if not isinstance(value, dict):
        return {k: None for k in fields}
    if not fields:
        return {str(k): v for k, v in value.items()}
    loose: dict[str, Any] = {}
    for k, v in value.items():
        loose.setdefault(_norm_key(k), v)
    return {k: value[k] if k in value else loose.get(_norm_key(k)) for k in fields}
