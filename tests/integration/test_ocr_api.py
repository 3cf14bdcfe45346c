"""/v1/ocr over real HTTP with the real rapidocr engine on rendered images."""

from __future__ import annotations

import base64
import re

import pytest
import requests
from imaging import Line, card, chinese_card, overlap, render, squash, to_bytes
from PIL import Image


def _post_file(server, data: bytes, filename="card.png", mime="image/png", **form):
    return requests.post(
        f"{server.url}/v1/ocr", files={"file": (filename, data, mime)}, data=form, timeout=60
    )


def _assert_card_read(body: dict, rendered) -> None:
    page = body["pages"][0]
    assert (page["width"], page["height"]) == rendered.image.size
    text = squash(body["text"])
    for line in rendered.lines:
        assert squash(line.text) in text, f"{line.text!r} not in {body['text']!r}"
    # every drawn line has a recognised block sitting on it
    for line, drawn in zip(rendered.lines, rendered.boxes, strict=True):
        hits = [b for b in page["blocks"] if overlap(b["box"], drawn) > 0.6]
        assert hits, f"no box on {line.text!r} at {drawn}: {page['blocks']}"
        assert squash(line.text) in squash(" ".join(b["text"] for b in hits))


def test_multipart_upload_spotting_reads_card_with_pixel_boxes(rapid_server):
    rendered = card()
    r = _post_file(rapid_server, rendered.png(), task="spotting")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["task"] == "spotting" and body["engine"] == "rapidocr"
    assert body["pages"][0]["finish_reason"] == "stop"
    _assert_card_read(body, rendered)
    for block in body["pages"][0]["blocks"]:
        assert 0 <= block["score"] <= 1
        assert len(block["polygon"]) == 4
    assert set(body["timings"]) >= {"decode_ms", "engine_ms", "postprocess_ms", "total_ms"}


def test_json_base64_and_data_url_give_same_text(rapid_server):
    rendered = card()
    raw = base64.b64encode(to_bytes(rendered.image, "JPEG", quality=92)).decode()
    a = requests.post(f"{rapid_server.url}/v1/ocr", json={"image": raw, "task": "text"}, timeout=60)
    b = requests.post(
        f"{rapid_server.url}/v1/ocr",
        json={"image": "data:image/jpeg;base64," + raw, "task": "text"},
        timeout=60,
    )
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    assert a.json()["text"] == b.json()["text"]
    _assert_card_read(a.json(), rendered)


def test_chinese_text_is_recognised(rapid_server):
    rendered = chinese_card()
    r = _post_file(rapid_server, rendered.png(), task="text")
    assert r.status_code == 200, r.text
    text = squash(r.json()["text"])
    for expected in ("张三", "北京市海淀区", "128.50"):
        assert expected in text, text


def test_exif_rotated_photo_boxes_are_in_upright_coordinates(rapid_server):
    # A phone photo: pixels stored sideways, EXIF says "rotate 90° clockwise to display".
    upright = render([Line("ROTATED RECEIPT 42", (40, 60), 40)], size=(640, 200))
    stored = upright.image.transpose(Image.Transpose.ROTATE_90)  # 200x640 on disk
    exif = Image.Exif()
    exif[0x0112] = 6
    data = to_bytes(stored, "JPEG", quality=95, exif=exif.tobytes())
    r = _post_file(rapid_server, data, "photo.jpg", "image/jpeg", task="spotting")
    assert r.status_code == 200, r.text
    page = r.json()["pages"][0]
    assert (page["width"], page["height"]) == (640, 200)
    assert "ROTATEDRECEIPT42" in squash(page["text"])
    assert any(overlap(b["box"], upright.boxes[0]) > 0.6 for b in page["blocks"])


def test_several_images_come_back_as_pages_in_order(rapid_server):
    first = render([Line("FIRST PAGE", (40, 40))], size=(500, 160))
    second = render([Line("SECOND PAGE", (40, 40))], size=(520, 170))
    body = {
        "images": [base64.b64encode(x.png()).decode() for x in (first, second)],
        "task": "text",
    }
    r = requests.post(f"{rapid_server.url}/v1/ocr", json=body, timeout=60)
    assert r.status_code == 200, r.text
    pages = r.json()["pages"]
    assert [p["index"] for p in pages] == [0, 1]
    assert "FIRSTPAGE" in squash(pages[0]["text"]) and "SECONDPAGE" in squash(pages[1]["text"])
    assert pages[1]["width"] == 520


def test_blank_image_gives_empty_text_not_an_error(rapid_server):
    blank = Image.new("RGB", (300, 200), "white")
    r = _post_file(rapid_server, to_bytes(blank), task="spotting")
    assert r.status_code == 200, r.text
    assert r.json()["text"] == "" and r.json()["pages"][0]["blocks"] == []


@pytest.mark.parametrize("task", ["document", "extract", "translate", "vqa", "formula"])
def test_tasks_the_cpu_engine_cannot_run_get_a_clear_400(rapid_server, task):
    r = _post_file(rapid_server, card().png(), task=task, fields="name")
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "unsupported_task" and err["param"] == "task"
    assert "rapidocr" in err["message"] and "spotting" in err["message"]


def _error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in r.text and not re.search(r"0x[0-9a-fA-F]{6,}", r.text)
    return body["error"]


def test_bad_inputs_get_clean_json_errors(rapid_server):
    url = f"{rapid_server.url}/v1/ocr"
    png = card().png()
    assert "base64" in _error(requests.post(url, json={"image": "%%%not-base64%%%"}), 400)["message"]
    assert _error(_post_file(rapid_server, b"hello, I am text"), 400)["code"] == "invalid_image"
    assert _error(_post_file(rapid_server, png[: len(png) // 2]), 400)["code"] == "invalid_image"
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>'
    assert "SVG" in _error(_post_file(rapid_server, svg, "x.svg", "image/svg+xml"), 415)["message"]
    assert _error(_post_file(rapid_server, png, task="nonsense"), 400)["param"] == "task"
    _error(requests.post(url, data="{not json", headers={"content-type": "application/json"}), 400)
    _error(requests.post(url, data=b"raw", headers={"content-type": "text/plain"}), 415)
    _error(requests.post(url, json={"task": "text"}), 400)  # no image
    _error(requests.post(url, json={"image": base64.b64encode(png).decode(), "max_tokens": 0}), 400)
    _error(requests.post(url, files={"other": ("a.png", png)}), 400)
    assert _error(requests.post(url, json={"image": ""}), 400)["code"] == "missing_image"
    # a value quoted in the message is quoted short: 100 kB of task was echoed whole
    b64 = base64.b64encode(png).decode()
    for body in ({"task": "x" * 100_000}, {"task": "translate", "language": "y" * 100_000}):
        assert len(_error(requests.post(url, json={"image": b64, **body}), 400)["message"]) < 300
    # the server still works afterwards
    assert _post_file(rapid_server, png, task="text").status_code == 200


def test_a_multipart_body_cut_short_is_refused_not_read_as_fewer_pages(rapid_server):
    """Starlette's parser drops a part the body cuts off: two pages cut in the second read as one, 200."""
    png = card().png()
    part = (b'--zz\r\nContent-Disposition: form-data; name="file"; filename="p.png"\r\n'
            b"Content-Type: image/png\r\n\r\n" + png + b"\r\n")
    headers = {"content-type": "multipart/form-data; boundary=zz"}
    whole = requests.post(f"{rapid_server.url}/v1/ocr", data=part + part + b"--zz--\r\n", headers=headers,
                          timeout=60)
    assert whole.status_code == 200 and len(whole.json()["pages"]) == 2, whole.text[:300]
    for cut in (part + part[:300], part + part, part[:-2]):
        error = _error(requests.post(f"{rapid_server.url}/v1/ocr", data=cut, headers=headers, timeout=60), 400)
        assert "closing boundary" in error["message"] and error["param"] == "file", error


def test_size_limits(rapid_server):
    url = f"{rapid_server.url}/v1/ocr"
    # 4 MiB body cap on this server: declared Content-Length over it -> 413 before reading
    big = b"\0" * (5 * 1024 * 1024)
    assert _error(requests.post(url, data=big, headers={"content-type": "application/json"}), 413)
    # chunked body (no Content-Length) that grows past the cap -> 413 mid-stream
    chunks = (b"x" * 65536 for _ in range(100))
    _error(requests.post(url, data=chunks, headers={"content-type": "application/json"}), 413)
    # 12 MP pixel cap, checked from the header: a 4000x4000 PNG compresses to a few KB
    huge = to_bytes(Image.new("L", (4000, 4000), 255))
    assert len(huge) < 100_000
    assert "4000x4000" in _error(_post_file(rapid_server, huge), 413)["message"]


@pytest.mark.parametrize("size", [(1, 300), (100000, 1), (1, 100000)])
def test_extreme_strips_are_read_in_bounded_time_not_failed(rapid_server, size):
    # Unpadded, RapidOCR's detector blew a 1x300 PNG up to 736x220800 (minutes of CPU) and failed its
    # resize on 100000x1 with a 500 (engines/rapidocr.py, detector_view).
    r = _post_file(rapid_server, to_bytes(Image.new("RGB", size, "white")), task="spotting")
    assert r.status_code == 200, r.text
    page = r.json()["pages"][0]
    assert (page["width"], page["height"]) == size and page["blocks"] == []


def test_a_tall_text_strip_is_read_with_boxes_in_its_own_pixels(rapid_server):
    rendered = render([Line("INVOICE 2026-12-01 TOTAL 42.00", (10, 4), 28)], size=(900, 40))
    tall = rendered.image.rotate(90, expand=True)  # 40x900: padded to 113x900 for the detector
    r = _post_file(rapid_server, to_bytes(tall), task="spotting")
    assert r.status_code == 200, r.text
    page = r.json()["pages"][0]
    assert squash("INVOICE 2026-12-01 TOTAL 42.00") in squash(r.json()["text"])
    for block in page["blocks"]:
        x0, y0, x1, y1 = block["box"]
        assert 0 <= x0 < x1 <= 40 and 0 <= y0 < y1 <= 900
