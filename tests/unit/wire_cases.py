"""Results covering every shape of the /v1/ocr body, for tests/unit/test_wire_bodies.py."""

from __future__ import annotations

from hyocr.types import FinishReason, OcrResult, PageResult, Task, TextBlock, Usage

SPOTTING = OcrResult(
    id="ocr-spot", model="rapidocr-pp-ocrv6", engine="rapidocr", task=Task.SPOTTING, requested_task=Task.SPOTTING,
    pages=(PageResult(
        index=0, width=1024, height=640, text="IDENTITY CARD\nNAME: 张三",
        blocks=(
            TextBlock("IDENTITY CARD", box=(58.0, 20.5, 1024, 60.25), score=0.9981,
                      polygon=((58.0, 20.5), (1024.0, 20.5), (1024.0, 60.25), (58.0, 60.25))),
            TextBlock("NAME: 张三", box=(58.0, 168.0, 402.0, 208.0), score=1.0, polygon=()),
            TextBlock("no box"),
            TextBlock("box, no score", box=(0.0, 0.0, 10.0, 10.0)),
        ),
        raw_text="raw", usage=Usage(0, 0)),),
    usage=Usage(), timings={"decode_ms": 4.1, "engine_ms": 480.25, "postprocess_ms": 0.1, "total_ms": 484.45},
)

DOCUMENT = OcrResult(
    id="ocr-doc", model="tencent/HunyuanOCR", engine="vllm", task=Task.DOCUMENT, requested_task=Task.DOCUMENT,
    pages=(
        PageResult(index=0, width=800, height=1000, text="# Title\n\n<table><tr><td>1</td></tr></table>",
                   markdown="# Title\n\n<table><tr><td>1</td></tr></table>", usage=Usage(1200, 40)),
        PageResult(index=1, width=800, height=1000, text="", markdown="", finish_reason=FinishReason.LENGTH,
                   usage=Usage(1200, 4096)),
        PageResult(index=2, width=800, height=1000, text="$$x^2$$", markdown=None,
                   finish_reason=FinishReason.REPETITION),
    ),
    usage=Usage(2400, 4136), timings={"decode_ms": 3, "engine_ms": 1500.5, "postprocess_ms": 0, "total_ms": 1503.5},
)

EXTRACT = OcrResult(
    id="ocr-ext", model="tencent/HunyuanOCR", engine="transformers", task=Task.EXTRACT, requested_task=Task.EXTRACT,
    pages=(
        PageResult(index=0, width=640, height=400, text='{"name": "JOHN", "id": null}',
                   fields={"name": "JOHN", "id": None, "items": [{"qty": 2, "price": 1.5}], "ok": True, "n": 7},
                   usage=Usage(300, 20)),
        PageResult(index=1, width=640, height=400, text="not json", fields={}, error="the output was not JSON",
                   usage=Usage(300, 3)),
        PageResult(index=2, width=640, height=400, text="still not json", error="the output was not JSON"),
    ),
    usage=Usage(600, 23), timings={"decode_ms": 2.0, "engine_ms": 91.0, "postprocess_ms": 0.02, "total_ms": 93.02},
)

PDF = OcrResult(
    id="ocr-pdf", model="rapidocr-pp-ocrv6", engine="rapidocr", task=Task.TEXT, requested_task=Task.TEXT,
    pages=(
        PageResult(index=3, width=1240, height=1754, text="rendered page", dpi=150, source="render",
                   blocks=(TextBlock("rendered page", box=(10.0, 10.0, 300.5, 40.0), score=0.97),)),
        PageResult(index=4, width=1240, height=1754, text="the PDF's own text", dpi=150, source="text_layer"),
        PageResult(index=7, width=1719, height=2433, text="", finish_reason=FinishReason.ERROR,
                   error="pdf_render_timeout: page 8 took too long", dpi=208),
    ),
    usage=Usage(), timings={"decode_ms": 120.5, "engine_ms": 300.0, "postprocess_ms": 0.5, "total_ms": 421.0,
                            "fetch_ms": 0.0},
)

ERROR = OcrResult(
    id="ocr-err", model="tencent/HunyuanOCR", engine="openai", task=Task.TEXT, requested_task=Task.SPOTTING,
    pages=(
        PageResult(index=0, width=10, height=10, text="", finish_reason=FinishReason.ERROR,
                   error="engine failure (request ocr-err)"),
        PageResult(index=1, width=10, height=10, text="ok", finish_reason=FinishReason.ABORT, usage=Usage(5, 1)),
    ),
    usage=Usage(5, 1), timings={"decode_ms": 0.3, "engine_ms": 12.0, "postprocess_ms": 0.0, "total_ms": 12.3},
)

# The web UI's result: its timings carry the time to first text, None when no text came.
VIEWER = OcrResult(
    id="ocr-ui", model="rapidocr-pp-ocrv6", engine="rapidocr", task=Task.TEXT, requested_task=Task.TEXT,
    pages=(PageResult(index=0, width=100, height=50, text=""),),
    usage=Usage(), timings={"decode_ms": 1.5, "first_text_ms": None, "engine_ms": 2, "postprocess_ms": 0.0,
                            "total_ms": 3.5},
)

CASES = {"spotting": SPOTTING, "document": DOCUMENT, "extract": EXTRACT, "pdf": PDF, "error": ERROR,
         "viewer": VIEWER}
# FastAPI refuses today's body where a timing is None (the viewer's), so the HTTP rendering skips it.
HTTP_CASES = {k: v for k, v in CASES.items() if k != "viewer"}
