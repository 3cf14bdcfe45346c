"""``hyocr batch --url`` when the server cannot be reached, then is up: real processes, a closed loopback port,
then a real server (the fake engine: the jobs API is what is under test). Reaching the server is not the
document's doing, so it costs no attempt; and ``--pages`` over documents of several lengths reads what
each has, through the server as in-process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pdfs
import pytest
from imaging import card
from servers import free_port

HYOCR = [sys.executable, "-m", "hyocr"]
STATE = ".hyocr-batch.jsonl"


def _batch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HYOCR, "batch", *args, "--task", "text", "--poll", "0.1"], capture_output=True,
                          text=True, timeout=180, check=False)


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _states(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / STATE).read_text().splitlines() if line.strip()]


@pytest.fixture
def docs(tmp_path) -> Path:
    root = tmp_path / "docs"
    root.mkdir()
    card().image.save(root / "card.png")
    (root / "one.pdf").write_bytes(pdfs.text_pdf([["ONLY PAGE"]]))
    (root / "three.pdf").write_bytes(pdfs.text_pdf([["FIRST"], ["SECOND"], ["THIRD"]]))
    return root


def test_a_server_that_cannot_be_reached_spends_no_attempt(docs, tmp_path, fake_server_factory):
    out = tmp_path / "out"
    down = _batch(str(docs), "-o", str(out), "--url", f"http://127.0.0.1:{free_port()}", "--max-retries", "0")
    assert down.returncode == 3, down.stderr
    said = [line for line in down.stderr.splitlines() if line.startswith("hyocr:")]
    assert len(said) == 1 and "cannot be reached" in said[0] and "no attempt spent" in said[0], down.stderr
    assert "Traceback" not in down.stderr
    s = _summary(out)
    assert s["stopped"]["reason"] == "server_unreachable" and "Connect" in s["stopped"]["message"]
    assert {i["status"] for i in s["items"]} == {"pending"} and s["documents"]["failed"] == 0
    assert not [r for r in _states(out) if r["status"] == "failed"]
    # the server is up now: every document is read, on its first attempt (--max-retries 0: the only one)
    server = fake_server_factory()
    up = _batch(str(docs), "-o", str(out), "--url", server.url, "--max-retries", "0")
    assert up.returncode == 0, up.stderr
    s = _summary(out)
    assert s["documents"] == {"total": 3, "done": 3, "failed": 0, "resumed": 0} and "stopped" not in s
    assert [r["attempts"] for r in _states(out) if r["status"] == "done"] == [1, 1, 1]


def test_pages_over_documents_of_several_lengths_reads_what_each_has(docs, tmp_path, fake_server_factory):
    server = fake_server_factory()
    for where, extra in (("local", ["--engine", "fake"]), ("remote", ["--url", server.url])):
        out = tmp_path / where
        done = _batch(str(docs), "-o", str(out), "--pages", "2-3", *extra)
        assert done.returncode == 1, done.stderr  # one.pdf has no page 2
        items = {Path(i["path"]).name: i for i in _summary(out)["items"]}
        assert items["one.pdf"]["status"] == "failed"
        assert items["one.pdf"]["error"] == "--pages 2-3: the document has 1 page"
        assert items["three.pdf"]["status"] == "done" and items["three.pdf"]["note"] is None
        assert items["card.png"]["status"] == "done"  # an image: --pages is for PDFs
        three = json.loads((out / items["three.pdf"]["output"]).read_text())
        assert [p["index"] for p in three["pages"]] == [1, 2] and "note" not in three
        again = _batch(str(docs), "-o", str(tmp_path / f"{where}-2"), "--pages", "1-2", *extra)
        assert again.returncode == 0, again.stderr
        items = {Path(i["path"]).name: i for i in _summary(tmp_path / f"{where}-2")["items"]}
        note = "--pages 1-2: the document has 1 page; read 1"
        assert items["one.pdf"]["note"] == note and items["three.pdf"]["note"] is None
        one = json.loads((tmp_path / f"{where}-2" / items["one.pdf"]["output"]).read_text())
        assert [p["index"] for p in one["pages"]] == [0] and one["note"] == note
        assert "1 with fewer pages than --pages" in again.stderr


def test_a_server_that_refuses_the_key_stops_the_run_and_spends_no_attempt(docs, tmp_path, fake_server_factory):
    """A missing or wrong API key is the run's problem, not each document's: one message that names the fix,
    exit 3, every document pending; the same command with the key reads them all on their first attempt."""
    server = fake_server_factory(api_keys="k-batch")
    out = tmp_path / "out"
    for key in ([], ["--api-key", "wrong"]):
        refused = _batch(str(docs), "-o", str(out), "--url", server.url, "--max-retries", "0", *key)
        assert refused.returncode == 3, refused.stderr
        said = [line for line in refused.stderr.splitlines() if line.startswith("hyocr:")]
        assert len(said) == 1 and "refused this caller" in said[0] and "--api-key" in said[0], refused.stderr
        assert "401" in said[0] and "no attempt spent" in said[0]
        s = _summary(out)
        assert s["stopped"]["reason"] == "server_refused" and s["documents"]["failed"] == 0
        assert {i["status"] for i in s["items"]} == {"pending"}
    done = _batch(str(docs), "-o", str(out), "--url", server.url, "--max-retries", "0", "--api-key", "k-batch")
    assert done.returncode == 0, done.stderr
    assert [r["attempts"] for r in _states(out) if r["status"] == "done"] == [1, 1, 1]
