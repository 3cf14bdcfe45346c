"""What a job stores, as JSON: the call to make (without its media, kept as blobs beside it) and each page's
result. Internal values only; the wire bodies are built from them by api/bodies.py, as for /v1/ocr."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, fields, replace
from typing import Any

from ..types import (
    FinishReason,
    OcrCall,
    PageResult,
    SamplingParams,
    StructuredOutput,
    Task,
    TextBlock,
    Usage,
)

# document_range is set where a job's range is read (runner.py), not by the client: out of the stored call
# and its digest, so the digests of jobs stored before it stay valid.
_CALL_FIELDS = tuple(f.name for f in fields(OcrCall) if f.name not in ("media", "document_range"))


# Sampling options added after jobs were first stored: left out of a call's JSON while unset (a digest of an
# Idempotency-Key submitted before the upgrade still matches the same request after it).
_LATER_SAMPLING = ("min_p",)


def call_to_json(call: OcrCall) -> dict[str, Any]:
    out = {name: getattr(call, name) for name in _CALL_FIELDS}
    out["task"] = call.task.value
    out["fields"] = list(call.fields)
    out["sampling"] = asdict(call.sampling)
    out["sampling"]["stop"] = list(call.sampling.stop)
    for late in _LATER_SAMPLING:  # unset, as every call stored before it was: those calls keep their digest
        if out["sampling"][late] is None:
            del out["sampling"][late]
    if call.sampling.structured is not None:  # asdict made it a dict; its choice tuple a list
        out["sampling"]["structured"]["choice"] = list(call.sampling.structured.choice)
    return out


def request_digest(call: OcrCall, callback: tuple[str, dict | None] | None, limits,
                   output_uri: str | None = None) -> str:
    """What makes two submits the same request: the call's options, callback and output URI, and each
    document's content (decoded, so base64, a data URL and an upload of one file are one request; an image
    URL or an object URI by its text, since it is read only after this check). An Idempotency-Key reused with
    another digest is refused."""
    from ..pipeline.encoded import decode_base64
    from ..pipeline.objects import is_object_uri

    whole = hashlib.sha256()
    options = {"call": call_to_json(call), "callback": list(callback) if callback else None}
    if output_uri is not None:  # only when given: digests of jobs stored before output URIs stay valid
        options["output_uri"] = output_uri
    whole.update(json.dumps(options, sort_keys=True, ensure_ascii=True, default=str).encode())
    for m in call.media:
        if m.url or is_object_uri(m.data):
            content = b"url:" + str(m.data).encode("utf-8", "surrogatepass")
        else:
            raw = m.data if isinstance(m.data, bytes) else decode_base64(
                m.data, limits, param=m.param, max_bytes=max(limits.max_image_bytes, limits.max_pdf_bytes))
            content = b"bytes:" + hashlib.sha256(raw).digest()
        whole.update(hashlib.sha256(content).digest())
    return whole.hexdigest()


def call_from_json(data: dict[str, Any]) -> OcrCall:
    sampling = dict(data["sampling"])
    sampling["stop"] = tuple(sampling.get("stop") or ())
    if sampling.get("structured"):
        constraint = dict(sampling["structured"])
        sampling["structured"] = StructuredOutput(**{**constraint, "choice": tuple(constraint.get("choice") or ())})
    values = {name: data[name] for name in _CALL_FIELDS if name in data}
    values.update(task=Task(data["task"]), fields=tuple(data.get("fields") or ()),
                  sampling=SamplingParams(**sampling))
    return OcrCall(media=(), **values)


def page_to_json(page: PageResult) -> dict[str, Any]:
    out = asdict(page)
    out["finish_reason"] = page.finish_reason.value
    out["blocks"] = [_block_json(b) for b in page.blocks]
    return out


def page_from_json(data: dict[str, Any]) -> PageResult:
    values = dict(data)
    values["finish_reason"] = FinishReason(values["finish_reason"])
    values["usage"] = Usage(**values["usage"])
    values["blocks"] = tuple(_block(b) for b in values["blocks"])
    return PageResult(**values)


def at_position(page: PageResult, position: int, pdf: bool) -> PageResult:
    """A job's images are numbered through the job (each range is a request of its own, where an image's
    index is its place in that request); a PDF's pages keep their page index."""
    return page if pdf else replace(page, index=position)


def json_text(value: Any, **kwargs: Any) -> str:
    """``value`` as JSON text that encodes to UTF-8: non-ASCII kept as it is, unless a string UTF-8 cannot hold
    is in it (a lone surrogate, which JSON's \\ud800 escapes carry in, or a file name that is not UTF-8: PEP
    383): then all escaped, which ``json.loads`` reads back to the same strings, instead of failing the file."""
    text = json.dumps(value, ensure_ascii=False, **kwargs)
    try:
        text.encode()
    except UnicodeEncodeError:
        return json.dumps(value, **kwargs)
    return text


def json_bytes(value: Any) -> bytes:
    return json_text(value).encode()


def _block_json(block: TextBlock) -> dict[str, Any]:
    return {"text": block.text, "box": list(block.box) if block.box else None, "score": block.score,
            "polygon": [list(p) for p in block.polygon] if block.polygon else None, "category": block.category}


def _block(data: dict[str, Any]) -> TextBlock:
    return TextBlock(data["text"], tuple(data["box"]) if data.get("box") else None, data.get("score"),
                     tuple(tuple(p) for p in data["polygon"]) if data.get("polygon") else None, data.get("category"))
