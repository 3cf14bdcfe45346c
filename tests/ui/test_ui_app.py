"""The UI's wiring: mounted on the API's app (or not), `hyocr ui`, and no calls to the internet."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import time

import httpx

from hyocr.cli import build_parser


def test_the_ui_is_mounted_beside_the_api(fake_server_factory):
    server = fake_server_factory()
    assert httpx.get(server.url + "/ui/", timeout=30).status_code == 200
    assert httpx.get(server.url + "/ui/config", timeout=30).json()["title"] == "hyocr · HunyuanOCR"
    root = httpx.get(server.url + "/", timeout=30)
    assert root.status_code == 307 and root.headers["location"] == "/ui/"
    assert httpx.get(server.url + "/health", timeout=30).json() == {"status": "ok"}
    assert "/ui" not in httpx.get(server.url + "/openapi.json", timeout=30).text


def test_the_ui_can_be_turned_off(fake_server_factory):
    server = fake_server_factory(ui=False)
    assert httpx.get(server.url + "/ui/", timeout=30).status_code == 404
    assert httpx.get(server.url + "/", timeout=30).status_code == 404
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


def test_hyocr_ui_process_serves_the_ui_and_the_api_then_stops_cleanly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "hyocr", "ui", "--engine", "fake", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "hyocr ui never became ready"
            time.sleep(0.2)
        assert httpx.get(url + "/ui/", timeout=30).status_code == 200
        assert httpx.get(url + "/v1/models", timeout=30).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    log = proc.stdout.read()
    assert code == 0, log
    assert f"web UI at http://127.0.0.1:{port}/ui" in log


def test_hyocr_ui_serves_the_same_app_on_port_7860():
    args = build_parser().parse_args(["ui"])
    assert (args.port, args.ui) == (7860, True)
    args = build_parser().parse_args(["ui", "--port", "9000", "--engine", "fake"])
    assert (args.port, args.engine) == (9000, "fake")
    assert build_parser().parse_args(["serve", "--no-ui"]).ui is False


# Runs in a fresh interpreter: an audit hook records every DNS lookup and connection while hyocr
# builds the app with its UI, starts it, and serves the UI's page and config.
_PROBE = textwrap.dedent(
    """
    import json, sys
    seen = []
    def hook(event, args):
        if event in ("socket.getaddrinfo", "socket.connect"):
            seen.append([event, repr(args[0] if event == "socket.getaddrinfo" else args[1])])
    sys.addaudithook(hook)
    import socket, time
    socket.getaddrinfo("127.0.0.1", 9)  # the control: the hook sees lookups
    from starlette.testclient import TestClient
    from hyocr.api.app import build_app
    from hyocr.config import load_settings
    app = build_app(load_settings(engine="fake"))
    with TestClient(app) as client:
        assert client.get("/ui/").status_code == 200
        assert client.get("/ui/config").status_code == 200
        time.sleep(1.0)  # let any background thread (telemetry, version check) try
    print(json.dumps(seen))
    """
)


def test_building_and_serving_the_ui_contacts_no_one(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # no GRADIO_* or HF_* settings from outside
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120,
                         env=env, cwd=tmp_path, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    control, *seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert control == ["socket.getaddrinfo", "'127.0.0.1'"]
    assert seen == [], seen


def test_with_auth_configured_the_ui_never_serves_an_unidentified_caller(fake_server_factory):
    from types import SimpleNamespace

    from hyocr.config import load_settings
    from hyocr.ui.app import ui_auth

    assert ui_auth(load_settings()) is None  # no auth configured: open, like the API
    assert ui_auth(load_settings(metrics_api_keys="scrape")) is None  # scrapers' keys guard /metrics alone (the
    # UI was a 401 for everyone there: no caller has a principal when callers need no identity)
    check = ui_auth(load_settings(api_keys="k-one"))
    assert check(SimpleNamespace(scope={"state": {"principal": "key-abc"}})) == "key-abc"
    assert check(SimpleNamespace(scope={})) is None
    server = fake_server_factory(api_keys="k-one")
    for path in ("/ui/", "/ui/config"):
        assert httpx.get(server.url + path, timeout=30).status_code == 401, path
        # The browser's login prompt: any user name, an API key as the password.
        assert httpx.get(server.url + path, auth=("me", "k-one"), timeout=30).status_code == 200, path
        assert httpx.get(server.url + path, auth=("me", "wrong"), timeout=30).status_code == 401, path
