"""The web UI in a real browser: Debian's Chromium, headless, driven by Playwright, against a real
hyocr server (the rapidocr engine, real OCR on rendered images).

Screenshots land in test-artifacts/ui/ (look at them: they are the UI's visual check).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import requests
from browser import choose_task, open_ui, shot, status, upload
from imaging import card, chinese_card, squash
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from hyocr.ui.display import BOX_COLOUR


def test_spotting_a_card_streams_text_draws_boxes_and_downloads_json(page, tmp_path):
    page.get_by_role("heading", name="hyocr").wait_for()
    upload(page, tmp_path, {"card.png": card().png()})
    page.get_by_text("1024×640 image ready").wait_for()
    choose_task(page, "Text spotting")
    page.locator("#hy-run").click()
    page.get_by_text("Done:").wait_for()

    text = squash(page.locator("#hy-text textarea").input_value())
    assert "JOHNSMITH" in text and "420106198805" in text, text
    shot(page, "spotting")

    # The page image now carries the boxes: fetch what the browser shows and look for their colour.
    img = page.locator("#hy-image img")
    assert img.evaluate("el => el.complete && el.naturalWidth") == 1024
    shown = Image.open(io.BytesIO(page.request.get(img.get_attribute("src")).body())).convert("RGB")
    edge = int((np.abs(np.asarray(shown, dtype=int) - BOX_COLOUR).max(axis=2) < 40).sum())
    assert edge > 1000, f"only {edge} box-coloured pixels"
    stats = page.locator("#hy-stats").inner_text()
    assert "rapidocr" in stats and "total" in stats, stats

    with page.expect_download() as download:
        page.locator("#hy-download").click()
    body = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
    assert body["object"] == "ocr.result" and body["task"] == "spotting"
    assert "JOHNSMITH" in squash(body["text"]) and len(body["pages"][0]["blocks"]) >= 5


def test_a_file_that_is_no_image_is_refused_on_upload_with_a_clear_error(page, tmp_path):
    # Refused by the upload route (ui/uploads.py), so never stored; Gradio's error toast shows the API's
    # message, naming the file.
    upload(page, tmp_path, {"notes.png": b"these are my notes, not a picture\n"})
    toast = page.get_by_test_id("toast-body")
    toast.get_by_text("notes.png: file is not a recognised image or PDF").wait_for()
    assert "{" not in toast.inner_text() and "HTTP 400" not in toast.inner_text(), toast.inner_text()
    shot(page, "bad-file-refused")
    page.locator("#hy-run").click()  # nothing was uploaded: running says so
    page.locator("#hy-status .hy-error").wait_for()
    assert "Upload an image first" in status(page)
    upload(page, tmp_path, {"card.png": card().png()})  # and the next upload is read as usual
    page.get_by_text("1024×640 image ready").wait_for()


def test_a_broken_image_shows_a_clear_error(page, tmp_path):
    # A PNG by its first bytes, so stored; the UI's check (the API's decoder) explains.
    upload(page, tmp_path, {"notes.png": b"\x89PNG\r\n\x1a\n these are my notes, not a picture\n"})
    error = page.locator("#hy-status .hy-error")
    error.wait_for()
    assert "notes.png: could not read the PNG image header" in error.inner_text()
    page.locator("#hy-run").click()  # running anyway says the same, and nothing else
    page.wait_for_timeout(500)
    error.wait_for()
    assert "could not read the PNG image header" in status(page) and "Traceback" not in page.content()
    shot(page, "bad-file")


def test_a_task_rapidocr_cannot_run_is_explained(page, tmp_path):
    choose_task(page, "Document parsing")
    note = page.locator("#hy-task-note")
    note.get_by_text("Not available on this server").wait_for()
    assert "HunyuanOCR vision-language model" in note.inner_text()
    assert "--engine vllm" in note.inner_text()
    upload(page, tmp_path, {"card.png": card().png()})
    page.get_by_text("image ready").wait_for()
    page.locator("#hy-run").click()
    page.locator("#hy-status .hy-error").wait_for()
    assert "needs a vision-language engine" in status(page)
    shot(page, "unsupported-task")


def test_several_files_are_pages_with_navigation(page, tmp_path):
    upload(page, tmp_path, {"a-card.png": card().png(), "b-chinese.png": chinese_card().png()})
    page.get_by_text("2 pages ready").wait_for()
    choose_task(page, "Plain text")
    page.locator("#hy-run").click()
    page.get_by_text("Done:").wait_for()
    assert "on 2 pages" in status(page)
    assert "JOHNSMITH" in squash(page.locator("#hy-text textarea").input_value())
    page.locator("#hy-pages").get_by_text("Page 2").click()
    page.wait_for_function("() => document.querySelector('#hy-text textarea').value.includes('张三')")
    assert "北京市海淀区" in squash(page.locator("#hy-text textarea").input_value())
    shot(page, "pages")


def test_stop_cancels_the_run_and_aborts_the_engine(browser, fake_server_factory, tmp_path):
    # The fake engine (serving-layer tests only) streams one word every half second.
    server = fake_server_factory(model="token_delay=0.5")
    with open_ui(browser, server) as page:
        upload(page, tmp_path, {"card.png": card().png()})
        page.get_by_text("image ready").wait_for()
        choose_task(page, "Plain text")
        page.locator("#hy-run").click()
        page.wait_for_function("() => document.querySelector('#hy-text textarea').value.includes('fake')")
        page.get_by_role("button", name="Stop").click()
        page.get_by_text("Stopped.").wait_for()
        page.wait_for_timeout(1500)
        assert "Done" not in status(page)
        shot(page, "stopped")
    assert server.engine.aborted and not server.engine.completed and not server.engine.active


def test_run_clicked_again_while_running_reads_once(browser, fake_server_factory, tmp_path):
    # A double click (or an impatient second one) had started a second full read that replaced the first
    server = fake_server_factory(model="token_delay=0.2")
    with open_ui(browser, server) as page:
        upload(page, tmp_path, {"card.png": card().png()})
        page.get_by_text("image ready").wait_for()
        choose_task(page, "Plain text")
        page.locator("#hy-run").dblclick()
        page.wait_for_function("() => document.querySelector('#hy-text textarea').value.includes('fake')")
        page.locator("#hy-run").click()
        page.locator("#hy-status", has_text="Done").wait_for()
        page.wait_for_timeout(2000)
        assert "Done" in status(page)
    assert len(server.engine.completed) == 1 and not server.engine.active, server.engine.completed


def test_a_ui_read_is_counted_in_the_metrics(browser, fake_server_factory, tmp_path):
    # An operator's dashboard saw none of the UI's reads: they run in Gradio's tasks, past the access log
    server = fake_server_factory()
    with open_ui(browser, server) as page:
        upload(page, tmp_path, {"a.png": card().png(), "b.png": card().png()})
        page.get_by_text("2 pages ready").wait_for()
        choose_task(page, "Plain text")
        page.locator("#hy-run").click()
        page.locator("#hy-status", has_text="Done").wait_for()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(requests.get(f"{server.url}/metrics", timeout=10).text)
               for s in family.samples}
    assert samples[("hyocr_pages_total", ())] == 2
    assert samples[("hyocr_requests_total", (("route", "/ui"), ("status", "200")))] == 1
    assert samples[("hyocr_stage_duration_seconds_count", (("stage", "engine"),))] >= 1


def test_the_example_card_drawn_at_start_up_is_read(page):
    page.get_by_text("ID card", exact=True).click()
    page.get_by_text("960×600 image ready").wait_for()
    page.locator("#hy-run").click()
    page.get_by_text("Done:").wait_for()
    text = squash(page.locator("#hy-text textarea").input_value())
    assert "JOHNSMITH" in text and "张伟" in text, text
    shot(page, "example-card")  # the README's screenshot (docs/ui.png)


def test_with_api_keys_the_browser_signs_in_with_a_key_and_runs(browser, fake_server_factory, tmp_path):
    server = fake_server_factory(api_keys="k-one")  # (refusals without a key: test_ui_app.py)
    context = browser.new_context(http_credentials={"username": "me", "password": "k-one"})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        page.goto(server.url + "/ui/")
        upload(page, tmp_path, {"card.png": card().png()})
        page.get_by_text("image ready").wait_for()
        page.locator("#hy-run").click()
        page.get_by_text("Done:").wait_for()
        assert "HYOCR FAKE" in page.locator("#hy-text textarea").input_value()
    finally:
        context.close()


def test_an_upload_that_has_expired_asks_to_be_uploaded_again(browser, fake_server_factory, tmp_path):
    server = fake_server_factory(ui_upload_ttl=1)  # uploads deleted a second after their last use
    with open_ui(browser, server) as page:
        upload(page, tmp_path, {"card.png": card().png()})
        page.get_by_text("image ready").wait_for()
        page.wait_for_timeout(3500)
        page.locator("#hy-run").click()
        page.locator("#hy-status .hy-error").wait_for()
        assert "no longer on the server" in status(page) and "upload it again" in status(page)
        page.locator("#hy-files").get_by_role("button", name="Clear").click()
        upload(page, tmp_path, {"card.png": card().png()})  # as it says
        page.get_by_text("image ready").wait_for()
        page.locator("#hy-run").click()
        page.get_by_text("Done:").wait_for()
