"""The web UI on the HunyuanOCR engines (transformers, vLLM) with the tiny random-weight checkpoint,
in a real browser: every task is offered, a run streams and reports its tokens. (Random weights
write noise, so the assertions are on the flow, not the text.)

The file name sorts before test_model_engines.py, whose last test kills the session's vLLM engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import choose_task, chromium, open_ui, shot, status, upload
from imaging import card


@pytest.fixture(scope="module")
def browser() -> Iterator:
    with chromium() as b:
        yield b


def test_document_parsing_streams_and_counts_tokens(browser, model_server, tmp_path):
    with open_ui(browser, model_server) as page:
        assert "Not available" not in page.locator("#hy-task-note").inner_text()
        upload(page, tmp_path, {"card.png": card().png()})
        page.get_by_text("image ready").wait_for()
        choose_task(page, "Document parsing")
        assert "needs HunyuanOCR" not in page.locator("#hy-task input").input_value()
        slider = page.get_by_label("Max new tokens per page", exact=False).first
        slider.fill("32")
        slider.press("Enter")
        page.locator("#hy-run").click()
        page.get_by_text("Done").wait_for()
        stats = page.locator("#hy-stats").inner_text()
        assert "· document" in stats and " in · 32 out" in stats, stats
        shot(page, f"model-{model_server.engine.info.name}")
        assert "error" not in status(page).lower()


def test_extraction_with_a_schema_shows_fields_that_validate(browser, model_server, tmp_path):
    import json

    import jsonschema

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                               "kind": {"enum": ["card", "receipt"]}},
              "required": ["name", "kind"], "additionalProperties": False}
    with open_ui(browser, model_server) as page:
        upload(page, tmp_path, {"card.png": card().png()})
        page.get_by_text("image ready").wait_for()
        choose_task(page, "Field extraction")
        box = page.locator("#hy-schema textarea")
        box.fill('{"type": "string", "maxLength": 999999}')  # refused as the API refuses it
        page.locator("#hy-run").click()
        page.get_by_text("maxLength must be an integer").wait_for()
        box.fill(json.dumps(schema))
        page.locator("#hy-run").click()
        page.get_by_text("Done").wait_for()
        page.get_by_role("tab", name="Fields").click()
        shown = page.locator("#hy-fields").inner_text()
        assert "kind" in shown and "name" in shown, shown
        with page.expect_download() as download:
            page.locator("#hy-download").click()
        body = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
        jsonschema.validate(body["pages"][0]["fields"], schema)  # random weights: only the constraint did it
        assert "error" not in status(page).lower()
