"""The web UI's upload route under the API's rules, over real HTTP against real servers with the UI on.

Gradio's ``POST /ui/gradio_api/upload`` stores what it is sent in Gradio's folder (``GRADIO_TEMP_DIR``),
served again at ``/ui/gradio_api/file=<path>``. Each test's servers get a folder of their own, so that
"nothing was stored" is a fact about that folder.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pdfs
import pytest
from imaging import card
from servers import LiveServer

from hyocr.config import load_settings

UPLOAD = "/ui/gradio_api/upload"
MiB = 1024 * 1024
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def ui(monkeypatch, tmp_path) -> Iterator:
    """Fake-engine servers with the UI on, storing uploads under tmp_path/gradio; (factory, that folder)."""
    folder = tmp_path / "gradio"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(folder))
    servers = []

    def make(**settings):
        server = LiveServer(load_settings(engine="fake", **settings)).start()
        servers.append(server)
        return server

    yield make, folder
    for server in servers:
        server.stop()


def stored(folder: Path) -> dict[str, int]:
    """Every file in Gradio's folder but the UI's examples: path -> bytes. A file the server deletes
    between the listing and its stat (a hung-up upload's temporary file being cleaned) is gone: skipped."""
    files = {}
    for root, _dirs, names in os.walk(folder):  # os.walk skips a folder that vanishes mid-walk
        for name in names:
            if name in ("id-card.png", "invoice.png"):
                continue
            try:
                files[os.path.join(root, name)] = os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return files


def upload(server, *files: tuple[str, bytes], **kwargs) -> httpx.Response:
    return httpx.post(server.url + UPLOAD, files=[("files", f) for f in files], timeout=60, **kwargs)


def refused(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, response.text[:300])
    assert response.headers["content-type"] == "application/json"
    return response.json()["error"]


def test_bytes_that_are_not_an_image_or_pdf_are_refused_and_not_stored(ui):
    make, folder = ui
    server = make()
    before = stored(folder)
    t = time.perf_counter()
    error = refused(upload(server, ("photo.png", os.urandom(20 * MiB))), 400)  # the name says PNG: not the bytes
    assert time.perf_counter() - t < 5
    assert error["message"] == "photo.png: file is not a recognised image or PDF (PNG, JPEG, WebP, BMP, TIFF, PDF)"
    assert (error["param"], error["code"]) == ("photo.png", "invalid_image")
    svg = b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"></svg>'
    error = refused(upload(server, ("drawing.png", svg)), 415)
    assert error["message"].startswith("drawing.png: SVG files are not accepted; allowed: PNG, JPEG")
    gif = b"GIF89a" + os.urandom(2000)  # a real format, outside the default IMAGE_FORMATS
    assert refused(upload(server, ("anim.gif", gif)), 415)["code"] == "unsupported_media_type"
    assert refused(upload(server, ("empty.png", b"")), 400)["message"] == "empty.png: the file is empty"
    # A good file beside a bad one: the whole upload is refused, the good one not kept either.
    assert refused(upload(server, ("a.png", card().png()), ("b.png", b"not an image")), 400)["param"] == "b.png"
    assert stored(folder) == before
    assert server.app.state.ui_uploads.used() == 0


def test_an_allowed_format_outside_the_defaults_is_accepted_when_configured(ui):
    make, _ = ui
    server = make(image_formats="PNG,GIF")
    assert upload(server, ("anim.gif", b"GIF89a" + os.urandom(2000))).status_code == 200
    error = refused(upload(server, ("photo.jpg", b"\xff\xd8\xff\xe0" + os.urandom(2000))), 415)
    assert error["message"] == "photo.jpg: JPEG files are not accepted; allowed: PNG, GIF, PDF"


def test_a_png_and_a_pdf_are_stored_and_served_back_as_sent(ui):
    make, folder = ui
    server = make()
    png, pdf = card().png(), pdfs.text_pdf([["HELLO PDF 1"]])
    for name, data in (("card.png", png), ("letter.pdf", pdf)):
        response = upload(server, (name, data))
        assert response.status_code == 200, response.text
        [path] = response.json()
        assert Path(path).is_relative_to(folder) and Path(path).name == name
        served = httpx.get(f"{server.url}/ui/gradio_api/file={path}", timeout=30)
        assert served.status_code == 200 and served.content == data
    several = upload(server, ("a.png", png), ("b.png", card().png()))
    assert several.status_code == 200 and len(several.json()) == 2


def test_an_oversize_upload_is_refused_without_the_server_storing_it(ui):
    make, folder = ui
    server = make(max_image_bytes=1 * MiB, max_pdf_bytes=2 * MiB, max_images_per_request=2)
    before = stored(folder)
    # An image over MAX_IMAGE_BYTES (Gradio's own max_file_size is the PDF cap: it would keep it).
    big_png = PNG_MAGIC + os.urandom(MiB + 100)
    error = refused(upload(server, ("big.png", big_png)), 413)
    assert error["message"] == f"big.png: the image is larger than the {MiB} byte limit"
    error = refused(upload(server, ("big.pdf", b"%PDF-1.7\n" + os.urandom(2 * MiB))), 413)
    assert error["message"] == f"big.pdf: the PDF is larger than the {2 * MiB} byte limit"
    # The same image as a chunked body (no Content-Length): refused as it streams.
    boundary = "b0undary"
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="big.png"\r\n'
            "Content-Type: image/png\r\n\r\n").encode()

    def chunked():
        yield head + PNG_MAGIC
        for _ in range(4):
            yield os.urandom(MiB // 2)
        yield f"\r\n--{boundary}--\r\n".encode()

    response = httpx.post(server.url + UPLOAD, content=chunked(), timeout=60,
                          headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert refused(response, 413)["param"] == "big.png"
    # A declared body larger than any upload may be: refused before a byte is read.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(f"POST {UPLOAD} HTTP/1.1\r\nHost: x\r\nContent-Length: {40 * MiB}\r\n"
                     f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n".encode())
        answer = sock.recv(65536).decode()
    assert answer.startswith("HTTP/1.1 413") and '"code": "payload_too_large"' in answer
    assert stored(folder) == before


def test_malformed_uploads_are_refused(ui):
    make, folder = ui
    server = make(max_images_per_request=2)
    png = card().png()
    error = refused(upload(server, ("a.png", png), ("b.png", png), ("c.png", png)), 400)
    assert error["message"] == "at most 2 files per upload"
    # A file in another form field would be parsed into Gradio's folder and never deleted.
    response = httpx.post(server.url + UPLOAD, files={"other": ("a.png", png)}, timeout=30)
    assert refused(response, 400)["message"] == "files are uploaded in the 'files' field"
    boundary = "zz"
    truncated = (f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="a.png"\r\n\r\n'
                 ).encode() + png[:5000]  # no closing boundary: Gradio would keep the first 5000 bytes
    response = httpx.post(server.url + UPLOAD, content=truncated, timeout=30,
                          headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert refused(response, 400)["message"] == "the upload's multipart body is incomplete"
    response = httpx.post(server.url + UPLOAD, content=png, timeout=30, headers={"content-type": "image/png"})
    assert refused(response, 400)["message"] == "uploads are multipart/form-data with a boundary"
    assert stored(folder) == {}


def test_a_client_that_hangs_up_mid_upload_leaves_nothing(ui):
    make, folder = ui
    server = make()
    body = (b'--zz\r\nContent-Disposition: form-data; name="files"; filename="a.png"\r\n\r\n'
            + card().png())
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(f"POST {UPLOAD} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body) + 100000}\r\n"
                     "Content-Type: multipart/form-data; boundary=zz\r\n\r\n".encode() + body)
        time.sleep(0.5)  # Gradio has begun its temporary file
    deadline = time.monotonic() + 10
    while stored(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stored(folder) == {}


def test_the_upload_space_is_capped_evicting_the_least_recently_used(ui):
    make, folder = ui
    server = make(ui_upload_cache_bytes=1 * MiB)
    cache = server.app.state.ui_uploads
    paths = []
    for i in range(3):
        response = upload(server, (f"page-{i}.png", PNG_MAGIC + os.urandom(400_000)))
        assert response.status_code == 200, response.text
        paths.append(response.json()[0])
        time.sleep(0.05)  # distinct ctimes
    assert not Path(paths[0]).exists() and Path(paths[1]).exists() and Path(paths[2]).exists()
    assert cache.used() <= 1 * MiB and sum(stored(folder).values()) <= 1 * MiB
    # A file used again (the UI touches what it reads) outlives an older one.
    os.utime(paths[1])
    time.sleep(0.05)
    assert upload(server, ("page-3.png", PNG_MAGIC + os.urandom(400_000))).status_code == 200
    assert Path(paths[1]).exists() and not Path(paths[2]).exists()
    # Larger than the whole space: refused, nothing evicted.
    error = refused(upload(server, ("huge.png", PNG_MAGIC + os.urandom(int(1.2 * MiB)))), 413)
    assert error["code"] == "ui_upload_cache_too_small" and Path(paths[1]).exists()
    # The examples are never evicted.
    examples = [p for p in folder.rglob("*.png") if p.name in ("id-card.png", "invoice.png")]
    assert len(examples) == 2


def test_uploads_expire_after_the_ttl_and_the_examples_stay(ui):
    make, folder = ui
    server = make(ui_upload_ttl=1)
    [path] = upload(server, ("card.png", card().png())).json()
    deadline = time.monotonic() + 15
    while Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(path).exists()
    examples = [p for p in folder.rglob("*.png") if p.name in ("id-card.png", "invoice.png")]
    assert len(examples) == 2  # Gradio's expiry deleted them before (their keep-list was on copies)
    for example in examples:  # and the page can still show them
        assert httpx.get(f"{server.url}/ui/gradio_api/file={example}", timeout=30).status_code == 200


def test_with_api_keys_upload_and_download_need_credentials(ui):
    make, _ = ui
    server = make(api_keys="k-one", jwt_secret="s" * 32)
    png = card().png()
    error = refused(upload(server, ("card.png", png)), 401)
    assert error["code"] == "missing_api_key"
    response = upload(server, ("card.png", png))
    assert response.headers["www-authenticate"] == 'Basic realm="hyocr"'
    assert refused(upload(server, ("card.png", png), auth=("me", "wrong")), 401)["code"] == "invalid_api_key"
    response = upload(server, ("card.png", png), auth=("me", "k-one"))  # the browser's login
    assert response.status_code == 200, response.text
    [path] = response.json()
    assert upload(server, ("card.png", png), headers={"x-api-key": "k-one"}).status_code == 200
    import jwt

    token = jwt.encode({"sub": "alice", "exp": int(time.time()) + 60}, "s" * 32, algorithm="HS256")
    assert upload(server, ("card.png", png), headers={"authorization": f"Bearer {token}"}).status_code == 200
    # Refusals on content come after auth: an unknown caller learns nothing about the rules.
    assert refused(upload(server, ("x.png", b"junk")), 401)["code"] == "missing_api_key"
    file_url = f"{server.url}/ui/gradio_api/file={path}"
    assert refused(httpx.get(file_url, timeout=30), 401)["code"] == "missing_api_key"
    served = httpx.get(file_url, auth=("me", "k-one"), timeout=30)
    assert served.status_code == 200 and served.content == png


def test_the_api_rate_limit_covers_uploads(ui):
    make, _ = ui
    server = make(rate_limit="2/minute")
    png = card().png()
    assert [upload(server, ("card.png", png)).status_code for _ in range(2)] == [200, 200]
    response = upload(server, ("card.png", png))
    assert refused(response, 429)["code"] == "rate_limit_exceeded" and int(response.headers["retry-after"]) >= 1
    # The page itself (its HTML, config, scripts: ~90 GETs a load) is not work and loads however limited.
    for path in ("/ui/", "/ui/config", "/ui/gradio_api/info"):
        assert httpx.get(server.url + path, timeout=30, follow_redirects=True).status_code == 200, path


def test_gradios_screen_recording_route_is_closed(ui, tmp_path):
    make, _ = ui
    server = make()
    payload = os.urandom(300_000)  # Gradio echoed it back and kept a copy in the temporary folder for ever
    response = httpx.post(server.url + "/ui/gradio_api/process_recording",
                          files={"video": ("v.mp4", payload)}, timeout=30)
    assert refused(response, 404)["type"] == "not_found_error"


def test_gradios_url_fetching_is_closed_and_its_errors_are_the_apis(ui):
    """``file=<URL>`` made the server fetch any public URL for any caller (loopback and private addresses were
    Gradio's 403): 404 here, before Gradio, for every spelling of a URL; Gradio's own {"detail"} errors
    leave in the API's error shape."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    hits = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    target = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=target.serve_forever, daemon=True).start()
    make, _ = ui
    server = make()
    try:
        port = target.server_address[1]
        for url in (f"http://127.0.0.1:{port}/x.png", f"HTTPS://127.0.0.1:{port}/x.png", f"//127.0.0.1:{port}/x",
                    "http://93.184.215.14/index.html", "ftp://example.org/a"):
            for path in ("/ui/gradio_api/file=", "/ui/gradio_api/proxy=", "/ui/gradio_api/file/"):
                response = httpx.get(server.url + path + url, timeout=30)
                assert refused(response, 404)["code"] == "not_found", (path, url, response.text)
    finally:
        target.shutdown()
    assert hits == []
    for method, path, status in (("GET", "/ui/gradio_api/file=/etc/passwd", 403), ("GET", "/ui/nope", 404),
                                 ("POST", "/ui/gradio_api/queue/join", 422)):
        response = httpx.request(method, server.url + path, json={} if method == "POST" else None, timeout=30)
        error = refused(response, status)
        assert error["message"] and error["code"] == f"ui_http_{status}", (path, error)
        assert "detail" in response.json()  # what Gradio's own page shows
    assert httpx.get(server.url + "/ui/config", timeout=30).status_code == 200  # the page still loads


def test_no_ui_folder_or_cached_file_is_left_once_the_app_stops(ui):
    make, folder = ui
    server = make()
    workdir = server.app.state.ui_workdir
    assert workdir.name.startswith("hyocr-ui-") and (workdir / "examples" / "id-card.png").is_file()
    assert upload(server, ("card.png", card().png())).status_code == 200
    assert stored(folder)
    server.stop()
    assert not workdir.exists()
    assert [p for p in folder.rglob("*") if p.is_file() or (p.is_dir() and not any(p.iterdir()))] == []


def test_an_app_built_but_never_started_leaves_no_ui_folder_once_collected(monkeypatch, tmp_path):
    from hyocr.api.app import build_app

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    app = build_app(load_settings(engine="fake"))
    workdir = app.state.ui_workdir
    assert workdir.is_dir()
    del app
    gc.collect()
    assert not workdir.exists()


def test_upload_errors_are_the_apis_json_shape(ui):
    make, _ = ui
    server = make()
    response = upload(server, ("notes.txt", b"hello"))
    body = json.loads(response.text)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert response.headers["x-request-id"]
