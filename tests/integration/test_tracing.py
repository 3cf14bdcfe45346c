"""OpenTelemetry spans per request stage, captured with the SDK's in-memory exporter."""

from __future__ import annotations

import base64
import logging

import requests
from imaging import card
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXPORTER = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(_provider)  # once per process: the SDK keeps the first provider


def test_a_request_is_one_trace_with_a_span_per_stage(fake_server_factory):
    server = fake_server_factory()
    EXPORTER.clear()
    image = base64.b64encode(card().png()).decode()
    r = requests.post(f"{server.url}/v1/ocr", json={"image": image, "task": "text"},
                      headers={"X-Request-ID": "trace-me"}, timeout=30)
    assert r.status_code == 200
    spans = {s.name: s for s in EXPORTER.get_finished_spans()}
    assert {"hyocr.request", "hyocr.decode", "hyocr.engine", "hyocr.postprocess"} <= set(spans)
    root = spans["hyocr.request"]
    assert root.attributes["hyocr.request_id"] == "trace-me"
    for name in ("hyocr.decode", "hyocr.engine", "hyocr.postprocess"):
        assert spans[name].context.trace_id == root.context.trace_id  # one trace per request
    assert spans["hyocr.engine"].attributes["hyocr.task"] == "text"


def test_a_web_ui_read_is_traced_without_context_errors(fake_server_factory, tmp_path, caplog):
    # The UI steps the read's stream from a task per step: a span made current around the engine's yields was
    # detached in another task than it was attached in, and OpenTelemetry logged an error for every page
    from browser import choose_task, chromium, open_ui, upload

    server = fake_server_factory()
    EXPORTER.clear()
    with caplog.at_level(logging.ERROR), chromium() as browser, open_ui(browser, server) as page:
        upload(page, tmp_path, {"card.png": card().png()})
        page.get_by_text("image ready").wait_for()
        choose_task(page, "Plain text")
        page.locator("#hy-run").click()
        page.locator("#hy-status", has_text="Done").wait_for()
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    spans = {s.name: s for s in EXPORTER.get_finished_spans()}
    assert spans["hyocr.engine"].attributes["hyocr.task"] == "text"
