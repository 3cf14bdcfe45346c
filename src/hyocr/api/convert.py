"""Wire requests -> ``OcrCall``: the parse step of every route, kept out of the route bodies."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..config import Settings
from ..errors import InvalidRequest
from ..hunyuan.prompts import match_prompt, parse_task
from ..pipeline import structured
from ..pipeline.encoded import check_base64_size
from ..pipeline.media import MediaLimits
from ..types import MediaInput, OcrCall, SamplingParams, StructuredOutput, Task
from .protocol import (
    MAX_TEXT_CHARS,
    ChatCompletionRequest,
    CompletionRequest,
    ImagePart,
    OcrJsonRequest,
    SamplingFields,
    StructuredFields,
    WireModel,
)


def refuse_engine_overrides(req: WireModel) -> None:
    field = req.refused_field()
    if field is not None:
        raise InvalidRequest(f"{field} is not accepted by this server", param=field)


def sampling_from(req: SamplingFields, settings: Settings) -> SamplingParams:
    max_tokens = req.max_completion_tokens or req.max_tokens
    if max_tokens is not None and max_tokens > settings.max_tokens_limit:
        raise InvalidRequest(
            f"max_tokens must be at most {settings.max_tokens_limit}", param="max_tokens"
        )
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        seed=req.seed,
        stop=stop,
        loop_guard=req.loop_guard,
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
    )


def _structured_outputs(value: dict[str, Any]) -> StructuredOutput:
    """vLLM's ``structured_outputs`` body: json, json_object or choice (its whitespace and backend options are
    the server's: compact JSON, xgrammar)."""
    kinds = [k for k in ("json", "json_object", "choice", "regex", "grammar", "structural_tag") if value.get(k)]
    if len(kinds) != 1:
        raise InvalidRequest("structured_outputs takes exactly one of json, json_object, choice",
                             param="structured_outputs")
    if kinds[0] == "json":
        return structured.from_schema(value["json"], param="structured_outputs.json")
    if kinds[0] == "json_object":
        return structured.JSON_OBJECT
    if kinds[0] == "choice":
        return structured.from_choice(value["choice"])
    raise InvalidRequest(f"structured_outputs.{kinds[0]} is not supported: use json (a JSON Schema), json_object "
                         "or choice", param=f"structured_outputs.{kinds[0]}")


def structured_from(req: StructuredFields) -> StructuredOutput | None:
    """The request's output constraint, from whichever spelling it used (at most one)."""
    constraint = _one_constraint(req)
    if constraint is not None:
        _no_forced_length(req)
    return constraint


def _no_forced_length(req: SamplingFields) -> None:
    """A constraint ends where its grammar ends: forcing more tokens (ignore_eos, min_tokens) would leave
    nothing the grammar allows."""
    if req.ignore_eos or req.min_tokens:
        raise InvalidRequest("ignore_eos and min_tokens cannot be combined with an output constraint",
                             param="ignore_eos" if req.ignore_eos else "min_tokens")


def _one_constraint(req: StructuredFields) -> StructuredOutput | None:
    given: list[tuple[str, StructuredOutput | None]] = []
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        given.append(("response_format", structured.JSON_OBJECT))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise InvalidRequest("response_format.json_schema.schema is required for type json_schema",
                                 param="response_format.json_schema")
        given.append(("response_format", structured.from_schema(fmt.json_schema.json_schema,
                                                                param="response_format.json_schema.schema")))
    if req.structured_outputs:
        given.append(("structured_outputs", _structured_outputs(req.structured_outputs)))
    if req.guided_json is not None:
        given.append(("guided_json", structured.from_schema(req.guided_json, param="guided_json")))
    if req.guided_choice is not None:
        given.append(("guided_choice", structured.from_choice(req.guided_choice, param="guided_choice")))
    if len(given) > 1:
        raise InvalidRequest(f"send one output constraint, not {' and '.join(name for name, _ in given)}",
                             param=given[1][0])
    return given[0][1] if given else None


def _media_from_url(url: str, param: str, settings: Settings, *, accept_pdf: bool = False) -> MediaInput:
    if url[:7].lower() in ("http://", "https:/"):
        return MediaInput(url, param=param, url=True)  # fetched only if the server allows URLs
    # A data URL, or bare base64 (common in hand-written clients). One over its cap is refused here (413, from
    # its length), before the request waits for an engine slot.
    check_base64_size(url, MediaLimits.from_settings(settings), param=param, accept_pdf=accept_pdf)
    return MediaInput(url, param=param)


def prompt_call(
    text: str, media: list[MediaInput], sampling: SamplingParams, *, system: str = "", model: str | None = None
) -> OcrCall:
    """A free prompt (chat or completions) -> the task it asks for.

    A known official prompt selects its task; other text is a question (VQA). An image with no
    text at all means "read the text". Engines that do not follow prompts run the closest task
    they can (``strict_task=False``) and the response says which.
    """
    text = text.strip()
    if not text:
        return OcrCall(media=tuple(media), task=Task.TEXT, system=system, sampling=sampling, strict_task=False,
                       model=model)
    match = match_prompt(text)
    return OcrCall(
        media=tuple(media),
        task=match.task,
        fields=match.fields,
        single_key=match.single_key,
        target_language=match.target_language or "en",
        question=text if match.task is Task.VQA else None,
        prompt_language=match.prompt_language,
        prompt=text,
        system=system,
        sampling=sampling,
        strict_task=False,
        model=model,
    )


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _cap_text(req: ChatCompletionRequest) -> None:
    """Chat text as completions prompts are capped: each text (a string content or a text part) and all of
    them together at most MAX_TEXT_CHARS characters (the wire models cap a prompt string the same)."""
    total = 0
    for i, message in enumerate(req.messages):
        if isinstance(message.content, str):
            texts = [(f"messages.{i}.content", message.content)]
        else:
            texts = [(f"messages.{i}.content.{j}.text", part.text)
                     for j, part in enumerate(message.content or []) if part.type == "text"]
        for param, text in texts:
            if len(text) > MAX_TEXT_CHARS:
                raise InvalidRequest(f"{param}: the text is longer than {MAX_TEXT_CHARS} characters", param=param,
                                     code="text_too_long")
            if not text.isascii() and not _is_unicode(text):  # a tokenizer would fail on it: a 500 on the GPU
                raise InvalidRequest(f"{param}: the text is not valid Unicode (a lone surrogate escape such as "
                                     "\\ud800)", param=param)
            total += len(text)
    if total > MAX_TEXT_CHARS:
        raise InvalidRequest(f"the messages' text is longer than {MAX_TEXT_CHARS} characters in all",
                             param="messages", code="text_too_long")


def chat_call(req: ChatCompletionRequest, settings: Settings) -> OcrCall:
    refuse_engine_overrides(req)
    _cap_text(req)
    if req.logprobs:
        raise InvalidRequest("logprobs are not supported", param="logprobs")
    system_parts: list[str] = []
    users = []
    for i, message in enumerate(req.messages):
        if message.role in ("system", "developer"):
            if isinstance(message.content, list):
                for j, part in enumerate(message.content):
                    if isinstance(part, ImagePart):  # dropped, it left "an image is required" unexplained
                        raise InvalidRequest(f"images go in the user message, not the {message.role} message",
                                             param=f"messages.{i}.content.{j}")
                system_parts += [p.text for p in message.content if p.type == "text"]
            elif message.content:
                system_parts.append(message.content)
        elif message.role == "user":
            users.append((i, message))
        else:
            raise InvalidRequest(
                "multi-turn conversations are not supported: send one user message with the "
                "image(s) and the instruction",
                param=f"messages.{i}.role",
            )
    if len(users) != 1:
        raise InvalidRequest(
            f"expected exactly one user message, got {len(users)}", param="messages"
        )
    index, user = users[0]
    texts: list[str] = []
    media: list[MediaInput] = []
    if isinstance(user.content, str):
        texts.append(user.content)
    else:
        for j, part in enumerate(user.content or []):
            if isinstance(part, ImagePart):
                url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
                media.append(_media_from_url(url, f"messages.{index}.content.{j}.image_url", settings))
            else:
                texts.append(part.text)
    if not media:  # the service's own check would name /v1/ocr's field, which chat has not
        raise InvalidRequest("an image is required: an image_url part in the user message", param="messages")
    if len(media) > settings.max_images_per_request:
        raise InvalidRequest(f"{len(media)} images given; at most {settings.max_images_per_request} per request",
                             param="messages")
    if (req.model_extra or {}).get("top_logprobs") is not None and not req.logprobs:  # as OpenAI answers it
        raise InvalidRequest("top_logprobs needs logprobs", param="top_logprobs")
    sampling = replace(sampling_from(req, settings), structured=structured_from(req))
    return prompt_call("\n".join(texts), media, sampling, system="\n".join(system_parts), model=req.model)


def completion_call(req: CompletionRequest, settings: Settings) -> OcrCall:
    refuse_engine_overrides(req)
    if isinstance(req.prompt, list):
        if len(req.prompt) > 1:
            raise InvalidRequest("only one prompt per request is supported", param="prompt")
        prompt = req.prompt[0] if req.prompt else ""
    else:
        prompt = req.prompt
    if req.echo:
        raise InvalidRequest("echo is not supported", param="echo")
    if req.logprobs:
        raise InvalidRequest("logprobs are not supported", param="logprobs")
    if req.suffix:
        raise InvalidRequest("suffix is not supported", param="suffix")
    images = ([req.image] if req.image else []) + list(req.images or [])
    media = [_media_from_url(img, "image" if i == 0 and req.image else f"images.{i}", settings)
             for i, img in enumerate(images)]
    return prompt_call(prompt, media, replace(sampling_from(req, settings), structured=structured_from(req)),
                       model=req.model)


def ocr_call(
    req: OcrJsonRequest,
    settings: Settings,
    *,
    uploads: list[MediaInput] | None = None,
) -> OcrCall:
    """/v1/ocr (JSON body, or multipart form fields validated into the same model)."""
    refuse_engine_overrides(req)
    sent = [(req.image, "image")] if req.image else []
    sent += [(img, f"images.{i}") for i, img in enumerate(req.images or [])]
    one = len(sent) + len(uploads or []) == 1  # a PDF is read on its own (pipeline/inputs.py)
    media = list(uploads or [])
    media += [_media_from_url(data, param, settings, accept_pdf=one) for data, param in sent]
    fields = req.fields
    if isinstance(fields, str):  # form field "name,date" or a JSON list in a string
        fields = [f for f in (s.strip().strip("'\"[]") for s in fields.split(",")) if f]
    task = parse_task(req.task)
    sampling = sampling_from(req, settings)
    if req.extraction_schema is not None:
        if task is not Task.EXTRACT:
            raise InvalidRequest("schema is for task=extract", param="schema")
        if fields:
            raise InvalidRequest("send fields or a schema, not both (a schema's properties are its fields)",
                                 param="fields")
        _no_forced_length(req)
        schema, keys = structured.extraction(req.extraction_schema)
        fields = list(keys)
        sampling = replace(sampling, structured=schema)
    return OcrCall(
        media=tuple(media),
        task=task,
        fields=tuple(fields or ()),
        target_language=req.language,
        question=req.question,
        prompt_language=req.prompt_language,
        sampling=sampling,
        strict_task=True,
        model=req.model,
        accept_pdf=True,
        pages=req.pages.strip() if req.pages and req.pages.strip() else None,
        prefer_text_layer=req.prefer_text_layer,
    )
