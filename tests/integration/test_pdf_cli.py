"""``hyocr ocr doc.pdf`` as a user runs it, in-process and against a server (real processes, the real
rapidocr engine), with a progress bar on a terminal."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import threading

import pdfs
from imaging import squash

HYOCR = [sys.executable, "-m", "hyocr"]
PAGES = [["FIRST PAGE ALPHA 101"], ["SECOND PAGE BRAVO 202"], ["THIRD PAGE CHARLIE 303"]]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HYOCR, *args], capture_output=True, text=True, timeout=180, check=False)


def _document(tmp_path) -> str:
    path = tmp_path / "doc.pdf"
    path.write_bytes(pdfs.text_pdf(PAGES))
    return str(path)


def test_in_process_reads_the_selected_pages(tmp_path):
    done = _run("ocr", _document(tmp_path), "--pages", "2-3", "--task", "text")
    assert done.returncode == 0, done.stderr
    out = squash(done.stdout)
    assert "[PAGE2]SECONDPAGEBRAVO202[PAGE3]THIRDPAGECHARLIE303" in out and "ALPHA" not in out


def test_against_a_server_with_json_output(tmp_path, rapid_server):
    done = _run("ocr", _document(tmp_path), "--url", rapid_server.url, "--pages", "1,3", "--task", "text", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert [(p["index"], p["dpi"], p["source"]) for p in body["pages"]] == [(0, 150, "render"), (2, 150, "render")]
    assert "FIRSTPAGEALPHA101" in squash(body["pages"][0]["text"])
    assert "THIRDPAGECHARLIE303" in squash(body["pages"][1]["text"])


def test_a_bad_page_range_is_reported_and_the_exit_status_says_so(tmp_path, rapid_server):
    for remote in ([], ["--url", rapid_server.url]):
        done = _run("ocr", _document(tmp_path), "--pages", "7", *remote)
        assert done.returncode == 1
        assert "page 7 is out of range; the document has 3 pages" in done.stderr, done.stderr


def test_a_document_past_one_request_names_the_command_that_reads_it_whole(tmp_path, rapid_server):
    path = tmp_path / "manual of 70 pages.pdf"  # a real manual runs to hundreds (valgrind's: 397)
    path.write_bytes(pdfs.many_pages_pdf(70))
    for remote in ([], ["--url", rapid_server.url]):
        done = _run("ocr", str(path), *remote)
        assert done.returncode == 1
        assert "the document has 70 pages; at most 64" in done.stderr, done.stderr
        assert f"hyocr batch '{path}' -o DIR" in done.stderr, done.stderr


def test_a_terminal_gets_a_progress_bar_per_document(tmp_path, rapid_server):
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal 100 columns wide
    process = subprocess.Popen([*HYOCR, "ocr", _document(tmp_path), "--url", rapid_server.url, "--task", "text"],
                               stdout=subprocess.PIPE, stderr=terminal, text=True)
    os.close(terminal)
    shown = bytearray()
    reader = threading.Thread(target=_read_all, args=(controller, shown))  # a terminal is read as it is written
    reader.start()
    stdout, _ = process.communicate(timeout=180)
    reader.join(10)
    os.close(controller)
    assert process.returncode == 0
    assert b"doc.pdf" in shown and b"3/3" in shown, shown
    assert "SECONDPAGEBRAVO202" in squash(stdout)


def _read_all(fd: int, into: bytearray) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the other end closed with the process
            return
        if not chunk:
            return
        into += chunk
