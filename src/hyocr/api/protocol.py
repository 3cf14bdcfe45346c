"""Wire models: the OpenAI-compatible request shapes, the /v1/ocr request and response.

Pydantic lives here only; the routes convert these into ``hyocr.types`` values at once.
Unknown fields are ignored for compatibility with generic clients, except the ones that would let a
client reach into the engine (chat templates, processor kwargs): those are refused.
"""

from __future__ import annotations

import re
import sys
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    WithJsonSchema,
    WrapValidator,
    field_validator,
    model_serializer,
    model_validator,
)

from ..jobs.webhooks import reserved_header

# Fields some OpenAI-compatible servers accept that would let a client change the prompt template
# or the image processor. Never passed on (SECURITY.md).
REFUSED_FIELDS = (
    "chat_template",
    "chat_template_kwargs",
    "mm_processor_kwargs",
    "processor_kwargs",
    "tools",
    "tool_choice",
    "functions",
    "logits_processors",
    # Grammars and regular expressions compile without a bound this server can check (structured outputs take
    # a JSON Schema, json_object or a choice: pipeline/structured.py)
    "guided_grammar",
    "guided_regex",
    "guided_decoding_backend",
)


# The longest text a request may carry, in characters: any string field (a completions prompt), a chat
# message's text part, and all of a chat request's text together (those two: api/convert.py). 1 M characters is hundreds of pages of text, far past any
# model's context; more is a mistake or an attack, refused (400) before it reaches the engine.
MAX_TEXT_CHARS = 1_000_000


# An image or a PDF as base64 or a data URL: not held to MAX_TEXT_CHARS (a 1.5 MB scan is 2 M characters).
# The body cap (MAX_BODY_BYTES) bounds it; the media caps (MAX_IMAGE_BYTES, MAX_PDF_BYTES) apply to its
# decoded size, known from its length before anything is decoded (pipeline/encoded.py check_base64_size: 413).
MediaStr = Annotated[str, Field(max_length=sys.maxsize), WithJsonSchema({"type": "string"})]


class WireModel(BaseModel):
    model_config = ConfigDict(extra="allow", str_max_length=MAX_TEXT_CHARS, allow_inf_nan=False)
    # OpenAI's spec makes these nullable and some client libraries send explicit nulls: null is the default.
    null_means_default: ClassVar[frozenset[str]] = frozenset({"stream", "n", "echo", "ignore_eos"})

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(data.get(k, 0) is None for k in cls.null_means_default):
            return {k: v for k, v in data.items() if not (v is None and k in cls.null_means_default)}
        return data

    def refused_field(self) -> str | None:
        extra = self.model_extra or {}
        return next((f for f in REFUSED_FIELDS if extra.get(f) not in (None, [], {})), None)


class SamplingFields(WireModel):
    """Sampling options shared by the OpenAI routes and /v1/ocr (vLLM's extensions included)."""

    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=1, description="only 1 is supported")
    loop_guard: bool | None = Field(None, description="hyocr: stop when the output repeats (server default)")
    ignore_eos: bool = Field(False, description="vLLM extension: generate max_tokens whatever the model says")
    min_tokens: int | None = Field(None, ge=0, description="vLLM extension: no end of sequence before this")

    @field_validator("max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
                     "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "n", "min_tokens",
                     mode="before")
    @classmethod
    def _numbers_are_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        """JSON numbers only, as OpenAI takes them: pydantic's lax mode would read "5" as 5 and true as 1. A
        multipart form's fields are text, so /v1/ocr's form path (context "form") keeps the conversion."""
        if isinstance(v, bool) or (isinstance(v, str) and not (info.context or {}).get("form")):
            raise ValueError("must be a number, not " + ("a boolean" if isinstance(v, bool) else "a string"))
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        items = [v] if isinstance(v, str) else (v or [])
        if len(items) > 8 or any(len(s) > 200 for s in items):
            raise ValueError("at most 8 stop strings of at most 200 characters")
        return v


# ---------------------------------------------------------------- chat completions


class ImageURL(BaseModel):
    url: MediaStr
    detail: str | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str  # capped at MAX_TEXT_CHARS by api/convert.py (here the message would name a union branch)


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL | MediaStr


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str | None = Field(None, max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredFields(WireModel):
    """Constrained decoding, in OpenAI's and vLLM's spellings (at most one of them per request)."""

    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = Field(
        None, description="vLLM: {json: schema} | {json_object: true} | {choice: [...]}")
    guided_json: dict[str, Any] | str | None = Field(None, description="vLLM's older spelling of structured_outputs.json")
    guided_choice: list[str] | None = Field(None, description="vLLM's older spelling of structured_outputs.choice")


class ChatCompletionRequest(SamplingFields, StructuredFields):
    model: str | None = None
    messages: list[ChatMessage] = Field(..., min_length=1, max_length=64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None


# ---------------------------------------------------------------- completions


class CompletionRequest(SamplingFields, StructuredFields):
    """OpenAI completions, plus the reference article's ``image`` (base64) field."""

    model: str | None = None
    prompt: str | list[str] = ""
    image: MediaStr | None = Field(None, description="base64 or data URL (the reference article's shape)")
    images: list[MediaStr] | None = Field(None, max_length=64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _text_prompt(cls, value: Any) -> Any:
        # OpenAI's completions also take token ids ([1, 2] or [[1, 2]]): the model's prompt is hyocr's to build
        if isinstance(value, list) and value and all(isinstance(v, int | list) for v in value):
            raise ValueError("token-id prompts are not supported: send the prompt as text")
        return value


# ---------------------------------------------------------------- /v1/ocr


class OcrJsonRequest(SamplingFields):
    model_config = ConfigDict(populate_by_name=True)
    # Fields a multipart form sends as JSON text (api/routes/ocr.py read_body parses them).
    form_json: ClassVar[frozenset[str]] = frozenset()

    image: MediaStr | None = Field(None, description="base64 or data URL: an image or a PDF")
    images: list[MediaStr] | None = Field(None, max_length=64, description="several pages (images)")
    task: str = "spotting"
    fields: list[str] | str | None = Field(None, description="field names for task=extract")
    extraction_schema: dict[str, Any] | str | None = Field(
        None, alias="schema", description="task=extract: a JSON Schema object (its top-level properties are the "
        "fields); decoding is constrained to it and every page's fields are validated against it")
    language: str = Field("en", description="target language for task=translate: en | zh")
    question: str | None = Field(None, description="the question for task=vqa")
    prompt_language: Literal["zh", "en"] | None = None
    model: str | None = Field(None, description="a LoRA adapter name to use (the base model otherwise)")
    pages: str | None = Field(None, max_length=1000, description="PDF pages to read, 1-based: 2-5,8 (default all)")
    prefer_text_layer: bool = Field(False, description="task text: take a PDF page's own text when it is "
                                    "reliable instead of OCR (the page's source says which)")
    stream: bool = Field(False, description="server-sent events: one per page as it finishes, then the result")


_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,64}")
# RFC 9110 field-value in ASCII: visible characters, inner spaces and tabs. obs-text (bytes 0x80-0xFF) is only
# tolerated by HTTP, read as ISO-8859-1 if at all, and the webhook sender cannot write it: refused too.
_HEADER_VALUE = re.compile(r"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?")


class JobJsonRequest(OcrJsonRequest):
    """POST /v1/jobs: the /v1/ocr request, read in the background, with an optional webhook."""

    form_json = frozenset({"callback_headers"})

    callback_url: str | None = Field(None, min_length=1, max_length=2048, description="POSTed (signed, Standard Webhooks) "
                                     "when the job ends: succeeded, failed or cancelled")
    callback_headers: dict[str, str] | None = Field(None, max_length=16, description="extra headers sent with "
                                                    "the webhook (e.g. your own authorization)")
    output_uri: str | None = Field(
        None, max_length=2048, description="s3://bucket/prefix/ or gs://...: where the result (result.json) "
        "and a manifest.json are written when the job ends (OBJECT_STORE_ALLOWED_BUCKETS); image may be an "
        "object URI too")

    @field_validator("callback_headers")
    @classmethod
    def _http_headers(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        """Headers the webhook can send as given: checked here, where a 400 can say so, not at delivery. The
        whitespace around a value is not part of it in HTTP (RFC 9110 5.5), so it is taken off."""
        headers = {}
        for name, value in (v or {}).items():
            value = value.strip(" \t")
            if not _HEADER_NAME.fullmatch(name):
                raise ValueError(f"{name[:64]!r} is not an HTTP header name (a token, at most 64 characters)")
            if reserved_header(name):
                raise ValueError(f"{name}: set by hyocr on every webhook (Content-Type, Content-Length, Host, "
                                 "Connection, User-Agent, Transfer-Encoding, webhook-*), not by a caller")
            if len(value) > 4096:
                raise ValueError(f"{name}: the value is longer than 4096 characters")
            if not value.isascii():
                raise ValueError(f"{name}: HTTP header values are ASCII (ISO-8859-1 at most, which receivers "
                                 "seldom decode as sent): encode other text first (percent-encoding, base64)")
            if not _HEADER_VALUE.fullmatch(value):
                raise ValueError(f"{name}: an HTTP header value cannot hold control characters (CR, LF, ...)")
            headers[name] = value
        return headers if v is not None else None


# ---------------------------------------------------------------- the OpenAI Batch API


class ExpiresAfter(BaseModel):
    anchor: Literal["created_at"]
    seconds: int = Field(ge=3600, le=2_592_000)


class BatchCreateRequest(WireModel):
    """POST /v1/batches, as OpenAI's SDK sends it; ``output_uri`` is hyocr's (``extra_body`` in the SDK)."""

    input_file_id: str = Field(..., min_length=1, max_length=2048, description="a file id (POST /v1/files, "
                               "purpose batch), or an s3:// or gs:// URI of a JSONL file")
    endpoint: str = Field(..., max_length=64, description="/v1/chat/completions, /v1/completions or /v1/ocr")
    completion_window: str = Field(..., max_length=16, description="24h (the only window)")
    metadata: dict[str, str] | None = Field(None, description="at most 16 pairs: keys up to 64 characters, "
                                            "values up to 512")
    output_expires_after: ExpiresAfter | None = None
    output_uri: str | None = Field(None, max_length=2048, description="hyocr: s3://bucket/prefix/ or gs://..."
                                   ": each line's result as <custom_id>.json, and a manifest.json")


# ---------------------------------------------------------------- the /v1/ocr result

# A number as the engine gave it: FastAPI's ``response_model`` rendering (mode="json") writes it as a float,
# as the schema says; ``api.bodies`` (mode="python": SSE, the CLI, the UI's download) keeps an int an int.
Number = Annotated[float, WrapValidator(lambda v, handler: v if type(v) is int else handler(v))]


class ResultModel(BaseModel):
    """A part of the /v1/ocr result. ``omit_when_absent`` fields are left out of the body ``api.bodies``
    builds (context ``{"omit_absent": True}``) when None or an empty list; rendered without that context
    (FastAPI's ``response_model``), every field is there, null when absent."""

    omit_when_absent: ClassVar[tuple[str, ...]] = ()

    # No return annotation: pydantic would take it as the serialization schema (OpenAPI's response schema).
    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo):
        data = handler(self)
        if info.context and info.context.get("omit_absent"):
            for name in self.omit_when_absent:
                if data.get(name) in (None, []):
                    data.pop(name, None)
        return data


class Block(ResultModel):
    omit_when_absent = ("polygon", "category")

    text: str
    box: list[Number] | None = Field(None, description="[x1, y1, x2, y2] in pixels of the original image")
    score: Number | None = None
    polygon: list[list[Number]] | None = None
    category: str | None = Field(None, description="task layout: paragraph, table, figure, section_title, ...")


class Page(ResultModel):
    omit_when_absent = ("markdown", "fields", "error", "dpi", "source")

    index: int
    width: int
    height: int
    text: str
    blocks: list[Block]
    finish_reason: str
    markdown: str | None = None
    fields: dict[str, Any] | None = None
    error: str | None = None
    dpi: int | None = Field(None, description="PDF pages: the resolution the page was read at")
    source: Literal["render", "text_layer", "image"] | None = Field(
        None, description="document pages: OCR of the rendered PDF page, the PDF's own text, or a page of a TIFF "
        "document (image)")


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class OcrResponse(ResultModel):
    """The /v1/ocr body; with stream=true, each page first comes as ``{"id", "object": "ocr.page", "page",
    "completed", "total"}`` (pages in the order they finish), then this."""

    omit_when_absent = ("markdown",)

    id: str
    object: Literal["ocr.result"] = "ocr.result"
    created: int
    model: str
    engine: str
    task: str
    requested_task: str
    text: str
    markdown: str | None = Field(None, description="document parsing: the pages' markdown joined")
    pages: list[Page]
    usage: UsageInfo
    timings: dict[str, Number | None] = Field(description="stage -> milliseconds (the web UI's first_text_ms: "
                                              "null when no text came)")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
