"""``hyocr batch`` reads a PDF in ranges of pages (JOB_RANGE_PAGES), each under its own REQUEST_TIMEOUT, and
keeps each page as it finishes: real processes on a real PDF, the engine ``openai`` in front of a serial
upstream (a hyocr server whose fake engine answers one request at a time, PAGE_S seconds each), so that a
document's reading time is its pages times PAGE_S whatever the machine's load, and the upstream counts
every page it was asked for."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pdfs
import pytest
from servers import LiveServer

from hyocr.config import load_settings

HYOCR = [sys.executable, "-m", "hyocr"]
PAGE_S = 0.4
PAGES = 16  # 6.4 s in all: more than DEADLINE
DEADLINE = "2.5"  # seconds: a range of 2 pages (0.8 s) reads well within it
STATE = ".hyocr-batch.jsonl"


@pytest.fixture(scope="module")
def upstream():
    server = LiveServer(load_settings(engine="fake", model=f"latency={PAGE_S}", max_concurrency=1, max_queue=1000,
                                      ui=False)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def document(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ranges") / "long.pdf"
    path.write_bytes(pdfs.text_pdf([[f"PAGE {n} OF {PAGES}"] for n in range(1, PAGES + 1)]))
    return path


def _engine(upstream: LiveServer) -> list[str]:
    return ["--engine", "openai", "--upstream-url", upstream.url, "--task", "text"]


def _batch(upstream: LiveServer, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HYOCR, "batch", *args, *_engine(upstream)], capture_output=True, text=True,
                          timeout=180, check=False)


def _output(out: Path) -> dict:
    (path,) = [p for p in out.glob("*.json") if p.name != "summary.json"]
    return json.loads(path.read_text())


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _idle(upstream: LiveServer) -> int:
    """Once the upstream has nothing in flight or waiting (requests of a reader that gave up included):
    the pages it has read so far."""
    admission = upstream.app.state.service.admission
    deadline = time.monotonic() + 60
    while admission.in_flight or admission.waiting:
        assert time.monotonic() < deadline, "the upstream is still busy"
        time.sleep(0.05)
    return len(upstream.engine.completed)


def _stored_pages(out: Path) -> int:
    return sum(1 for part in (out / ".hyocr-pages").glob("*.jsonl")
               for line in part.read_text().splitlines() if '"page"' in line)


@pytest.fixture(scope="module")
def reference(upstream, document) -> dict:
    """The document read whole by ``hyocr ocr``, with time enough."""
    done = subprocess.run([*HYOCR, "ocr", str(document), "--json", *_engine(upstream), "--request-timeout", "120"],
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_document_longer_than_one_deadline_is_read_range_by_range(upstream, document, reference, tmp_path):
    # Read as one request (hyocr ocr, and hyocr batch before ranges), the deadline passes mid-document.
    whole = subprocess.run([*HYOCR, "ocr", str(document), *_engine(upstream), "--request-timeout", DEADLINE],
                           capture_output=True, text=True, timeout=180, check=False)
    assert whole.returncode == 1 and f"took longer than {DEADLINE}s" in whole.stderr, whole.stderr
    asked = _idle(upstream)
    out = tmp_path / "out"
    done = _batch(upstream, str(document), "-o", str(out), "--request-timeout", DEADLINE, "--job-range-pages", "2",
                  "--max-retries", "0")
    assert done.returncode == 0, done.stderr
    body = _output(out)
    assert [p["index"] for p in body["pages"]] == list(range(PAGES))
    assert body["pages"] == reference["pages"] and body["text"] == reference["text"]
    assert body["usage"] == reference["usage"] and set(body) == set(reference) - {"file"}
    assert set(body["timings"]) == set(reference["timings"])  # summed over the ranges
    assert _idle(upstream) - asked == PAGES  # each page asked for once
    s = _summary(out)
    assert s["documents"] == {"total": 1, "done": 1, "failed": 0, "resumed": 0}
    assert s["pages"] == {"total": PAGES, "failed": 0, "read_this_run": PAGES} and s["items"][0]["attempts"] == 1
    assert _stored_pages(out) == 0  # the pages in progress go once the output is written


def test_ctrl_c_mid_document_keeps_its_pages_and_a_rerun_reads_only_the_rest(upstream, document, reference,
                                                                             tmp_path):
    out = tmp_path / "out"
    args = [str(document), "-o", str(out), "--job-range-pages", "4", *_engine(upstream)]
    proc = subprocess.Popen([*HYOCR, "batch", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ((out / ".hyocr-pages").is_dir() and _stored_pages(out) >= 5):  # in its second range
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "no page was stored"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert code == 130, err
    assert "hyocr: interrupted; run again to resume" in err and "Traceback" not in err
    s = _summary(out)
    assert s["stopped"]["reason"] == "interrupted" and s["items"][0]["status"] == "pending"
    assert not list(out.glob("long.pdf-*.json"))
    states = [json.loads(line) for line in (out / STATE).read_text().splitlines() if line.strip()]
    assert not [r for r in states if r["status"] == "failed"]  # an interruption spends no attempt
    stored = _stored_pages(out)
    assert 5 <= stored < PAGES
    asked = _idle(upstream)
    again = subprocess.run([*HYOCR, "batch", *args], capture_output=True, text=True, timeout=180, check=False)
    assert again.returncode == 0, again.stderr
    s = _summary(out)
    assert s["pages"]["read_this_run"] == PAGES - stored and s["pages"]["total"] == PAGES
    assert _idle(upstream) - asked == PAGES - stored  # only the pages missing were read
    assert _output(out)["pages"] == reference["pages"] and s["items"][0]["attempts"] == 1
    assert "stopped" not in s


def test_ctrl_c_in_hyocr_ocr_says_interrupted_without_a_traceback(upstream, document):
    proc = subprocess.Popen([*HYOCR, "ocr", str(document), *_engine(upstream)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not upstream.engine.active:  # a page of it is being read
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "nothing reached the engine"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert code == 130 and "hyocr: interrupted" in err and "Traceback" not in err, err


def test_a_terminal_sees_the_pages_go_by(document, tmp_path):
    """The bar counts pages (a PDF's total known once it is opened), with the documents beside it."""
    import fcntl
    import os
    import pty
    import struct
    import termios
    import threading

    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    proc = subprocess.Popen([*HYOCR, "batch", str(document), "-o", str(tmp_path / "out"), "--engine", "fake",
                             "--model", "latency=0.05", "--job-range-pages", "4"], stdout=subprocess.DEVNULL,
                            stderr=terminal)
    os.close(terminal)
    shown = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the other end closed with the process
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    assert proc.wait(timeout=120) == 0
    reader.join(10)
    os.close(controller)
    text = shown.decode(errors="replace")
    assert f"/{PAGES} [" in text and f"{PAGES}/{PAGES} [" in text and "page/s" in text, text
    assert "0/1 documents" in text and "1/1 documents" in text, text
