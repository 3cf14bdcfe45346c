"""Internal values passed along the request path.

Plain slotted dataclasses: pydantic lives only at the wire boundary (``hyocr.api.protocol``).
Everything here is immutable once built, so one request's options never leak into another's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

from PIL import Image


class Task(str, enum.Enum):
    """What the user wants from a page. Each task has an official HunyuanOCR prompt (hunyuan.prompts)."""

    SPOTTING = "spotting"  # text lines with boxes
    SPOTTING_JSON = "spotting_json"  # HunyuanOCR 1.5: text lines with boxes, written as a JSON array
    LAYOUT = "layout"  # HunyuanOCR 1.5: the page's layout regions (category, box, text) in reading order
    TEXT = "text"  # plain text
    DOCUMENT = "document"  # document parsing to markdown (tables as HTML, formulas as LaTeX)
    FORMULA = "formula"
    TABLE = "table"
    CHART = "chart"
    EXTRACT = "extract"  # field extraction to JSON
    SUBTITLES = "subtitles"
    TRANSLATE = "translate"
    VQA = "vqa"  # a free-form question about the image


class FinishReason(str, enum.Enum):
    STOP = "stop"  # the engine ended the output itself
    LENGTH = "length"  # max_tokens reached
    REPETITION = "repetition"  # the loop guard stopped a repeating tail
    ABORT = "abort"  # cancelled (client gone, deadline)
    ERROR = "error"  # this page failed; see the page's error


@dataclass(frozen=True, slots=True)
class PageImage:
    """One decoded, validated page: RGB pixels plus where they came from.

    A page of a PDF also says how it was read: rendered at ``dpi``, or (``source="text_layer"``) taken
    from the document's own text, or not readable (``error``). The last two carry no image and never
    reach an engine; their ``size`` is the page at ``dpi``.
    """

    image: Image.Image | None
    index: int = 0  # the page's position in its source: the image in the request, the page of the PDF
    source_format: str = ""  # PNG, JPEG, ..., PDF
    source_bytes: int = 0
    dpi: int | None = None  # PDF pages: the resolution the page was rendered at (or sized at)
    source: str | None = None  # PDF pages: "render" | "text_layer"; a TIFF document's pages: "image"
    text: str | None = None  # the PDF's own text for this page, used instead of the engine
    error: str | None = None  # the PDF page could not be rendered
    # The page's width and height in pixels of the upload (boxes and the response use them): set for a page
    # without an image, and for one whose ``image`` was reduced to what the engine reads (pipeline/memory.py;
    # an engine that reports boxes in the pixels of ``image`` scales them by ``width / image.width``).
    # (0, 0): the image's own size.
    size: tuple[int, int] = (0, 0)

    @property
    def width(self) -> int:
        return self.size[0] if self.size[0] or self.image is None else self.image.width

    @property
    def height(self) -> int:
        return self.size[1] if self.size[1] or self.image is None else self.image.height

    @property
    def needs_engine(self) -> bool:
        return self.image is not None and self.text is None and self.error is None


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A constraint on the output's shape: the engine decodes only text that matches it (vLLM's structured
    outputs, xgrammar on the transformers engine). Exactly one of the three is set. Built and bounded by
    ``pipeline.structured``; ``json_schema`` is canonical JSON text, so equal schemas share one grammar."""

    json_schema: str | None = None  # a JSON Schema
    json_object: bool = False  # any JSON object
    choice: tuple[str, ...] = ()  # exactly one of these strings

    @property
    def kind(self) -> str:
        return "json_schema" if self.json_schema is not None else "json_object" if self.json_object else "choice"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Generation options. ``None`` means "engine/task default"."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None  # keep tokens at least this fraction of the likeliest one's probability
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    loop_guard: bool | None = None  # None: the server's setting
    ignore_eos: bool = False  # benchmarks: exactly max_tokens per request
    min_tokens: int | None = None
    structured: StructuredOutput | None = None  # constrained decoding (schema extraction, response_format)


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """What an engine receives: one prompt about one or more already-validated images.

    ``system`` is the system message text (HunyuanOCR wants one, even empty) and ``prompt`` the
    user text that follows the images.
    """

    request_id: str
    task: Task
    prompt: str
    images: tuple[PageImage, ...] = ()
    system: str = ""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    adapter: str | None = None  # a LoRA adapter the engine serves, selected by the request's model name
    # 0: a caller waiting (online); higher: background work (jobs), which an engine with a queue of its own
    # serves after every waiting online request (rapidocr; vLLM with scheduling_policy=priority)
    priority: int = 0


@dataclass(frozen=True, slots=True)
class TextBlock:
    """A piece of recognised text. ``box`` is [x1, y1, x2, y2] in pixels of the original image."""

    text: str
    box: tuple[float, float, float, float] | None = None
    score: float | None = None
    polygon: tuple[tuple[float, float], ...] | None = None  # 4 corners when the engine gives a quad
    category: str | None = None  # layout: paragraph, table, figure, section_title, header, ...


@dataclass(frozen=True, slots=True)
class EngineChunk:
    """One step of an engine's output stream.

    ``text`` is the new text since the previous chunk. Engines that detect text directly
    (rapidocr) also hand over structured ``blocks``; model engines leave it empty and the
    post-processor parses the text. The last chunk carries ``finish_reason``.
    Token counts are cumulative for the request.
    """

    text: str = ""
    blocks: tuple[TextBlock, ...] = ()
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        )


@dataclass(frozen=True, slots=True)
class PageResult:
    index: int
    width: int
    height: int
    text: str
    blocks: tuple[TextBlock, ...] = ()
    finish_reason: FinishReason = FinishReason.STOP
    markdown: str | None = None  # document parsing
    fields: dict[str, Any] | None = None  # extraction, parsed JSON
    error: str | None = None  # a per-page problem (unparseable JSON, failed page)
    raw_text: str = ""  # what the engine produced, before clean-up
    usage: Usage = field(default_factory=Usage)
    dpi: int | None = None  # PDF pages: the resolution the page was read at
    source: str | None = None  # PDF pages: "render" (OCR of the rendered page) | "text_layer"; "image": a
    # page of a TIFF document

    def read_from(self, page: PageImage) -> PageResult:
        """This result stamped with how its PDF page was read (a no-op for images)."""
        if page.dpi is None and page.source is None:
            return self
        return replace(self, dpi=page.dpi, source=page.source)


@dataclass(frozen=True, slots=True)
class OcrResult:
    id: str
    model: str
    engine: str
    task: Task
    requested_task: Task
    pages: tuple[PageResult, ...]
    usage: Usage
    timings: dict[str, float]  # stage -> milliseconds

    @property
    def text(self) -> str:
        return "\n\n".join(p.text for p in self.pages if p.text)

    @property
    def markdown(self) -> str | None:
        """The pages' markdown joined (document parsing); None when no page has any."""
        if all(p.markdown is None for p in self.pages):
            return None
        return "\n\n".join(p.markdown for p in self.pages if p.markdown)


# ------------------------------------------------------------------ a call to the service, and what it yields


@dataclass(frozen=True, slots=True)
class MediaInput:
    """One image or document as it arrived: raw bytes (upload) or a base64 / data-URL string."""

    data: bytes | str
    param: str = "image"  # where it came from, for error messages
    url: bool = False  # data is an http(s) URL to fetch (only when the server allows URLs)


@dataclass(frozen=True, slots=True)
class OcrCall:
    """Everything one request asks for. Immutable; built by a route (api/convert.py), the UI or the CLI."""

    media: tuple[MediaInput, ...]
    task: Task = Task.TEXT
    fields: tuple[str, ...] = ()
    single_key: bool = False  # "输出 Key 的值。": the model answers with the bare value, not JSON
    target_language: str = "en"
    question: str | None = None
    prompt_language: str | None = None
    # Chat clients send their own prompt text: an engine that follows prompts gets it verbatim.
    prompt: str | None = None
    system: str = ""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    model: str | None = None  # the client's model name: selects a LoRA adapter when it names one
    # /v1/ocr asks for a task explicitly (unsupported -> 400); chat clients get the closest task
    # the engine can run (text) and are told which one ran.
    strict_task: bool = True
    # PDF documents, where the caller takes them (/v1/ocr, the UI, the CLI; chat routes take images)
    accept_pdf: bool = False
    pages: str | None = None  # "2-5,8": the PDF pages to read (1-based); None: all
    prefer_text_layer: bool = False  # task text: a PDF page's own text, when reliable, instead of OCR
    priority: int = 0  # EngineRequest.priority: jobs read at 1, below online requests
    # A range of a document that jobs and hyocr batch read piece by piece: a page that cannot be rendered is an
    # error page even when every page of the range fails (one request of such pages is a 4xx: nothing to read)
    document_range: bool = False


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated call: the task that will run, its prompt, and the decoded pages."""

    request_id: str
    task: Task
    requested_task: Task
    prompt: str
    pages: tuple[PageImage, ...]
    call: OcrCall
    model: str  # the name responses carry (the adapter's when the call selected one)
    decode_ms: float
    fetch_ms: float = 0.0  # image URLs fetched (before decoding)


@dataclass(frozen=True, slots=True)
class Started:
    """First event of a read or a chat: the call was admitted and its pages are ready."""

    prep: Prepared


@dataclass(frozen=True, slots=True)
class PageText:
    """Text of the page being read, as the engine writes it (``OcrService.read(..., deltas=True)``)."""

    position: int  # in ``prep.pages``
    text: str
    blocks: tuple[TextBlock, ...] = ()  # a detector hands its blocks with their text


@dataclass(frozen=True, slots=True)
class PageRead:
    """A page finished (pages finish in any order unless read with deltas)."""

    position: int  # in ``prep.pages``
    page: PageResult
    completed: int  # pages finished so far
    total: int


@dataclass(frozen=True, slots=True)
class ReadDone:
    """The last event of a read: the whole result, pages in page order."""

    result: OcrResult


@dataclass(frozen=True, slots=True)
class ChatText:
    """A chat's text as the engine writes it (all images in one prompt, or one after another)."""

    text: str


@dataclass(frozen=True, slots=True)
class ChatDone:
    """The last event of a chat. ``text`` is the whole answer with a looping tail cut (filled for a
    whole-answer chat only); ``finish_reason`` what the engine (or the loop guard) ended with."""

    finish_reason: FinishReason
    prompt_tokens: int = 0
    completion_tokens: int = 0
    text: str = ""


ReadEvent = Started | PageText | PageRead | ReadDone
ChatEvent = Started | ChatText | ChatDone
