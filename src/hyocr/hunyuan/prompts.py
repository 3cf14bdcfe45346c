"""Task <-> prompt mapping for HunyuanOCR.

The model was trained on a fixed set of prompts (docs/HUNYUANOCR.md), so we send them verbatim, and
when a chat client sends one of them itself we recognise it and post-process the output as that task
would be (boxes for spotting, JSON for extraction) instead of treating it as a free-form question.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from hyocr.errors import InvalidRequest
from hyocr.types import Task

__all__ = [
    "MAX_FIELDS",
    "MAX_FIELD_LENGTH",
    "PROMPTS",
    "PROMPTS_15",
    "SINGLE_KEY_PROMPTS",
    "TASK_DESCRIPTIONS",
    "TRANSLATION_TARGETS",
    "V15_TASKS",
    "PromptMatch",
    "build_prompt",
    "build_single_key_prompt",
    "match_prompt",
    "parse_task",
]

MAX_FIELDS = 50
MAX_FIELD_LENGTH = 100

# Templated entries use str.format placeholders: {fields} (extract), {language} (translate) and
# {question} (VQA, which has no official prompt: the question is the prompt).
PROMPTS: Mapping[Task, Mapping[str, str]] = MappingProxyType(
    {
        Task.SPOTTING: {
            "zh": "检测并识别图片中的文字，将文本坐标格式化输出。",
            "en": "Detect and recognize text in the image, "
            "and output the text coordinates in a formatted manner.",
        },
        Task.TEXT: {
            "zh": "提取图中的文字。",
            "en": "Extract the text in the image.",
        },
        Task.DOCUMENT: {
            "zh": "提取文档图片中正文的所有信息用 markdown 格式表示，"
            "其中页眉、页脚部分忽略，表格用 html 格式表达，"
            "文档中公式用 latex 格式表示，按照阅读顺序组织进行解析。",
            "en": "Extract all information from the main body of the document image and represent it in "
            "markdown format, ignoring headers and footers. Tables should be expressed in HTML format, "
            "formulas in the document should be represented using LaTeX format, and the parsing should be "
            "organized according to the reading order.",
        },
        Task.FORMULA: {
            "zh": "识别图片中的公式，用 LaTeX 格式表示。",
            "en": "Identify the formula in the image and represent it using LaTeX format.",
        },
        Task.TABLE: {
            "zh": "把图中的表格解析为 HTML。",
            "en": "Parse the table in the image into HTML.",
        },
        Task.CHART: {
            "zh": "解析图中的图表，对于流程图使用 Mermaid 格式表示，其他图表使用 Markdown 格式表示。",
            "en": "Parse the chart in the image; "
            "use Mermaid format for flowcharts and Markdown for other charts.",
        },
        Task.EXTRACT: {
            "zh": "提取图片中的: {fields} 的字段内容，并按照 JSON 格式返回。",
            "en": "Extract the content of the fields: {fields} from the image and return it in JSON format.",
        },
        Task.SUBTITLES: {
            "zh": "提取图片中的字幕。",
            "en": "Extract the subtitles from the image.",
        },
        Task.TRANSLATE: {
            "zh": "先提取文字，再将文字内容翻译为{language}。若是文档，则其中页眉、页脚忽略。"
            "公式用latex格式表示，表格用html格式表示。",
            "en": "First extract the text, then translate the text content into {language}. "
            "If it is a document, ignore the header and footer. Formulas should be represented in LaTeX "
            "format, and tables should be represented in HTML format.",
        },
        Task.VQA: {"zh": "{question}", "en": "{question}"},
        # HunyuanOCR 1.5's task-locked prompts (its client, inference/utils/tasks.py): Chinese only, sent as
        # they are whatever the prompt language.
        Task.SPOTTING_JSON: dict.fromkeys(("zh", "en"), "检测并识别图中所有的文字行，请按从上到下、从左到右的阅读顺序进行识别。 "
                                          "输出格式为 JSON 数组，每个元素必须包含："
                                          '"box": [xmin, ymin, xmax, ymax]（坐标需归一化到 [0, 1000] 范围内）；'
                                          '"text": "识别出的文字内容"。 '
                                          "注意：请直接输出 JSON 数组，不要包含任何多余的描述性文字。"),
        Task.LAYOUT: dict.fromkeys(("zh", "en"), "按照阅读顺序解析图中的版式信息。"),
    }
)

# The tasks only HunyuanOCR 1.5 was trained on.
V15_TASKS = frozenset({Task.SPOTTING_JSON, Task.LAYOUT})

# HunyuanOCR 1.5's own wording of 1.0's Chinese prompts (the same instructions, written without spaces; its
# translation prompts read in reading order and write tables as markdown). Keyed by task, translation by target.
PROMPTS_15: Mapping[Task, str] = MappingProxyType({
    Task.DOCUMENT: "提取文档图片中正文的所有信息用markdown格式表示，其中页眉、页脚部分忽略，表格用html格式表达，"
                   "文档中公式用latex格式表示，按照阅读顺序组织进行解析。",
    Task.CHART: "解析图中的图表，对于流程图使用Mermaid格式表示，其他图表使用Markdown格式表示。",
    Task.FORMULA: "识别图片中的公式，用LaTeX格式表示。",
    Task.TABLE: "把图中的表格解析为HTML。",
})
TRANSLATE_15: Mapping[str, str] = MappingProxyType({
    "en": "按照阅读顺序，提取图中文字，公式用latex格式表示，表格用markdown格式表示，再将文字内容翻译为英文。",
    "zh": "按照阅读顺序，提取图中文字，公式用latex格式表示，表格用markdown格式表示，再将文字内容翻译为中文。",
})

# One key, answered as a bare value rather than JSON.
SINGLE_KEY_PROMPTS: Mapping[str, str] = MappingProxyType(
    {"zh": "输出 {key} 的值。", "en": "Output the value of {key}."}
)

# Target language code -> (word used in the Chinese prompt, word used in the English prompt).
TRANSLATION_TARGETS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {"en": ("英文", "English"), "zh": ("中文", "Chinese")}
)

TASK_DESCRIPTIONS: dict[Task, str] = {
    Task.SPOTTING: "Text lines with their bounding boxes.",
    Task.TEXT: "Plain text of the image, in reading order.",
    Task.DOCUMENT: "Document parsed to Markdown (tables as HTML, formulas as LaTeX), no headers/footers.",
    Task.FORMULA: "A formula in LaTeX.",
    Task.TABLE: "A table as HTML.",
    Task.CHART: "A chart as Markdown, or a flowchart as Mermaid.",
    Task.EXTRACT: "Named fields extracted as JSON.",
    Task.SUBTITLES: "Subtitles of a video frame.",
    Task.TRANSLATE: "Text extracted and translated into English or Chinese.",
    Task.VQA: "A free-form question about the image.",
    Task.SPOTTING_JSON: "Text lines with their bounding boxes, written by the model as JSON (HunyuanOCR 1.5).",
    Task.LAYOUT: "Layout regions in reading order: category, box and text (HunyuanOCR 1.5).",
}

_ALIASES: Mapping[str, Task] = MappingProxyType(
    {
        "ocr": Task.TEXT,
        "parse": Task.DOCUMENT,
        "parsing": Task.DOCUMENT,
        "markdown": Task.DOCUMENT,
        "extraction": Task.EXTRACT,
        "translation": Task.TRANSLATE,
        "question": Task.VQA,
        "qa": Task.VQA,
        "detect": Task.SPOTTING,
        "boxes": Task.SPOTTING,
    }
)

_FORBIDDEN_FIELD_CHARS = frozenset("\n\r'\"[]{}")


@dataclass(frozen=True, slots=True)
class PromptMatch:
    """What a user-supplied prompt asks for. ``single_key`` marks the one-key prompt, whose answer is a bare
    value rather than JSON."""

    task: Task
    fields: tuple[str, ...] = ()
    target_language: str | None = None
    prompt_language: str | None = None
    single_key: bool = False


# HunyuanOCR's special tokens are all of this family (placeholders, role markers, begin/end of sentence). Text a
# client sends is tokenized with the template, so such a string in it would become the token itself: a forged
# turn, or an image placeholder that breaks the prompt (the transformers processor counts them against images).
RESERVED_TOKEN = re.compile(r"<｜hy_[^｜<>\n]{1,64}｜>")


def refuse_reserved_tokens(texts: Sequence[tuple[str, str | None]]) -> None:
    """InvalidRequest naming the first (param, text) pair that holds one of the model's special tokens."""
    for param, text in texts:
        found = RESERVED_TOKEN.search(text) if text else None
        if found:
            raise InvalidRequest(f"{param}: the text holds {found.group()[:72]}, one of the model's reserved tokens; "
                                 "it cannot be sent as text", param=param, code="reserved_token")


def parse_task(name: str) -> Task:
    """Accept the enum values and a few common aliases, case-insensitively."""
    key = name.strip().lower().replace("-", "_") if isinstance(name, str) else ""
    try:
        return Task(key)
    except ValueError:
        pass
    if key in _ALIASES:
        return _ALIASES[key]
    valid = ", ".join(t.value for t in Task)
    raise InvalidRequest(f"unknown task {str(name)[:64]!r}; valid tasks: {valid}", param="task")


def _language(value: str, param: str) -> str:
    """'EN', 'en-US', 'zh_CN' -> 'en' / 'zh'; anything else is a client error."""
    code = value.strip().lower().replace("_", "-").split("-")[0] if isinstance(value, str) else ""
    if code not in TRANSLATION_TARGETS:
        raise InvalidRequest(f"unsupported language {str(value)[:64]!r}; use 'zh' or 'en'", param=param)
    return code


def _clean_fields(fields: Sequence[str] | str) -> tuple[str, ...]:
    """Strip, validate and de-duplicate field names; the ones the prompt cannot quote safely are refused."""
    if isinstance(fields, str):
        fields = (fields,)
    cleaned: list[str] = []
    for raw in fields:
        if not isinstance(raw, str):
            raise InvalidRequest("field names must be strings", param="fields")
        name = raw.strip()
        if not name:
            raise InvalidRequest("field names must not be empty", param="fields")
        if len(name) > MAX_FIELD_LENGTH:
            raise InvalidRequest(f"field names are limited to {MAX_FIELD_LENGTH} characters", param="fields")
        if _FORBIDDEN_FIELD_CHARS.intersection(name):
            raise InvalidRequest(
                f"field name {name[:40]!r} contains a newline, quote or bracket", param="fields"
            )
        if name not in cleaned:
            cleaned.append(name)
    if len(cleaned) > MAX_FIELDS:
        raise InvalidRequest(f"at most {MAX_FIELDS} fields may be extracted at once", param="fields")
    return tuple(cleaned)


def build_prompt(
    task: Task,
    *,
    fields: Sequence[str] = (),
    target_language: str = "en",
    question: str | None = None,
    prompt_language: str = "zh",
    version: str = "1.0",
) -> str:
    """The official prompt for ``task``, verbatim, in ``prompt_language`` (Chinese unless asked otherwise); a
    HunyuanOCR 1.5 checkpoint (``version``) gets 1.5's own Chinese wording where it has one."""
    task = parse_task(task) if not isinstance(task, Task) else task
    lang = _language(prompt_language, "prompt_language")
    if version == "1.5" and lang == "zh" and task in PROMPTS_15:
        return PROMPTS_15[task]
    if version == "1.5" and lang == "zh" and task is Task.TRANSLATE:
        return TRANSLATE_15[_language(target_language, "target_language")]
    template = PROMPTS[task][lang]
    if task is Task.EXTRACT:
        names = _clean_fields(fields)
        if not names:
            raise InvalidRequest("extraction needs at least one field name", param="fields")
        return template.format(fields="['" + "','".join(names) + "']")
    if task is Task.TRANSLATE:
        target = _language(target_language, "target_language")
        return template.format(language=TRANSLATION_TARGETS[target][0 if lang == "zh" else 1])
    if task is Task.VQA:
        if question is None or not question.strip():
            raise InvalidRequest("a question is required for the vqa task", param="question")
        return question.strip()
    return template


def build_single_key_prompt(key: str, *, prompt_language: str = "zh") -> str:
    """The one-key extraction prompt ("输出 Key 的值。"), whose answer is the bare value."""
    lang = _language(prompt_language, "prompt_language")
    (name,) = _clean_fields((key,))
    return SINGLE_KEY_PROMPTS[lang].format(key=name)


# ---- recognising prompts -------------------------------------------------------------------------

_CANON_TABLE = str.maketrans(
    {"，": ",", "：": ":", "；": ";", "。": ".", "．": ".", "（": "(", "）": ")", "！": "!", "？": "?"}
)
_WS = re.compile(r"\s+")


def _canon(text: str) -> str:
    """Comparison key: no whitespace, ascii punctuation, case-folded, no final full stop.

    Clients re-type prompts with or without the space in "markdown 格式" and with either full stop.
    """
    return _WS.sub("", text.translate(_CANON_TABLE)).casefold().rstrip(".!")


_FIXED: dict[str, tuple[Task, str]] = {}
for _task, _by_lang in PROMPTS.items():
    if _task not in (Task.EXTRACT, Task.TRANSLATE, Task.VQA):
        for _lang, _prompt in _by_lang.items():
            _FIXED.setdefault(_canon(_prompt), (_task, _lang))  # 1.5's Chinese-only prompts: zh
_FIXED.update({_canon(prompt): (task, "zh") for task, prompt in PROMPTS_15.items()})
_FIXED_TRANSLATE_15 = {_canon(prompt): target for target, prompt in TRANSLATE_15.items()}

# Regexes stay linear on hostile input: no two adjacent optional whitespace runs, no lazy group
# followed by a whitespace run (a prompt is user text and can be long).
_END = r"\s*[.。．]?"
_COLON = r"\s*(?:[:：]\s*)?"
_COMMA = r"\s*(?:[,，]\s*)?"
_ZH_EXTRACT = re.compile(
    r"提取图片中的"
    + _COLON
    + r"\[(?P<fields>.*)\]\s*的字段内容"
    + _COMMA
    + r"并按照\s*JSON\s*格式返回"
    + _END,
    re.DOTALL | re.IGNORECASE,
)
_EN_EXTRACT = re.compile(
    r"Extract\s+the\s+content\s+of\s+the\s+fields" + _COLON + r"\[(?P<fields>.*)\]\s*from\s+the\s+image\s+"
    r"and\s+return\s+it\s+in\s+JSON\s+format" + _END,
    re.DOTALL | re.IGNORECASE,
)
_ZH_SINGLE = re.compile(r"输出(?P<key>[^\n]+)的值" + _END)
_EN_SINGLE = re.compile(r"Output\s+the\s+value\s+of\s(?P<key>[^\n]+)", re.IGNORECASE)  # key keeps its "."
_ZH_TRANSLATE = re.compile(
    r"先提取文字\s*[,，]\s*再将文字内容翻译为\s*(?P<lang>[^\s。.．,，]{1,20}?)\s*[。.．](?P<rest>.*)",
    re.DOTALL,
)
_EN_TRANSLATE = re.compile(
    r"First\s+extract\s+the\s+text\s*,\s*then\s+translate\s+the\s+text\s+content\s+into\s+"
    r"(?P<lang>[A-Za-z][A-Za-z ()-]{0,40}?)\s*\.(?P<rest>.*)",
    re.DOTALL | re.IGNORECASE,
)
# What follows "{language}" and its full stop in the official translation prompt.
_TRANSLATE_TAIL = {
    lang: _canon(PROMPTS[Task.TRANSLATE][lang].split("{language}", 1)[1][1:]) for lang in ("zh", "en")
}
# fmt: off
_LANGUAGE_WORDS: Mapping[str, str] = MappingProxyType(
    {
        "英文": "en", "英语": "en", "english": "en",
        "中文": "zh", "汉语": "zh", "简体中文": "zh", "chinese": "zh", "simplified chinese": "zh",
        "日文": "ja", "日语": "ja", "japanese": "ja",
        "韩文": "ko", "韩语": "ko", "korean": "ko",
        "法文": "fr", "法语": "fr", "french": "fr",
        "德文": "de", "德语": "de", "german": "de",
        "西班牙文": "es", "西班牙语": "es", "spanish": "es",
        "俄文": "ru", "俄语": "ru", "russian": "ru",
    }
)
# fmt: on
_QUOTED = re.compile(r"'([^']*)'|\"([^\"]*)\"|“([^”]*)”|‘([^’]*)’")
_QUOTE_PAIRS = {"'": "'", '"': '"', "“": "”", "‘": "’", "「": "」", "《": "》"}


def _parse_field_list(inner: str) -> tuple[str, ...]:
    """``'a','b'`` or ``"a", "b"`` (or bare ``a, b``) -> names; the doc's literal ``...`` is dropped."""
    if _QUOTED.search(inner):
        items = ["".join(m.groups(default="")) for m in _QUOTED.finditer(inner)]
    else:
        items = re.split(r"[,，]", inner)
    names: list[str] = []
    for item in items:
        name = item.strip()
        if name and name not in ("...", "…", "……") and name not in names:
            names.append(name)
    return tuple(names)


def _unquote(key: str) -> str:
    key = key.strip()
    if len(key) >= 2 and _QUOTE_PAIRS.get(key[0]) == key[-1]:
        key = key[1:-1].strip()
    return key


def _target_code(word: str) -> str:
    word = word.strip()
    return _LANGUAGE_WORDS.get(word.casefold(), word)


def match_prompt(text: str) -> PromptMatch:
    """Which task a user prompt asks for; anything unrecognised is a free-form question (VQA)."""
    if not isinstance(text, str):
        return PromptMatch(Task.VQA)
    stripped = text.strip()
    if not stripped:
        return PromptMatch(Task.VQA)
    fixed = _FIXED.get(_canon(stripped))
    if fixed is not None:
        return PromptMatch(fixed[0], prompt_language=fixed[1])
    if _canon(stripped) in _FIXED_TRANSLATE_15:
        return PromptMatch(Task.TRANSLATE, target_language=_FIXED_TRANSLATE_15[_canon(stripped)], prompt_language="zh")
    for lang, pattern in (("zh", _ZH_EXTRACT), ("en", _EN_EXTRACT)):
        m = pattern.fullmatch(stripped)
        if m:
            return PromptMatch(Task.EXTRACT, fields=_parse_field_list(m["fields"]), prompt_language=lang)
    for lang, pattern in (("zh", _ZH_TRANSLATE), ("en", _EN_TRANSLATE)):
        m = pattern.fullmatch(stripped)
        if m and _canon(m["rest"]) in ("", _TRANSLATE_TAIL[lang]):
            return PromptMatch(Task.TRANSLATE, target_language=_target_code(m["lang"]), prompt_language=lang)
    for lang, pattern in (("zh", _ZH_SINGLE), ("en", _EN_SINGLE)):
        m = pattern.fullmatch(stripped)
        if m:
            key = _unquote(m["key"].strip().removesuffix(".").removesuffix("。").removesuffix("．"))
            if key and len(key) <= MAX_FIELD_LENGTH:
                return PromptMatch(Task.EXTRACT, fields=(key,), prompt_language=lang, single_key=True)
    return PromptMatch(Task.VQA)
