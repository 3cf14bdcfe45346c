"""``hyocr batch`` as a user runs it: real processes on a folder of rendered images and a scanned PDF, the
real rapidocr engine; killed with SIGKILL mid-run and run again, it ends with the same outputs, once each."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from imaging import Line, card, chinese_card, render, squash
from pdfs import pages_pdf, scanned_pdf

HYOCR = [sys.executable, "-m", "hyocr"]
STATE = ".hyocr-batch.jsonl"


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*HYOCR, "batch", *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("batch") / "docs"
    (root / "scans").mkdir(parents=True)
    card().image.save(root / "card.png")
    chinese_card().image.save(root / "scans" / "zh.jpg", quality=95)
    lines = [Line("INVOICE 2024-0042", (40, 40)), Line("TOTAL 99.50 EUR", (40, 120))]
    invoice = render(lines, size=(640, 220))
    invoice.image.save(root / "scans" / "invoice.png")
    render([Line("HELLO BATCH", (40, 40), 48)], size=(520, 140)).image.save(root / "hello.webp")
    (root / "report.pdf").write_bytes(scanned_pdf([["FIRST PAGE OF REPORT"], ["SECOND PAGE HERE"],
                                                   ["THIRD AND LAST PAGE"]], dpi=100))
    (root / "broken.png").write_bytes(b"this is not a png")  # fails; retried by a rerun
    (root / "notes.txt").write_text("not a document: skipped")
    return root


def outputs(out: Path) -> dict[str, list[str]]:
    """Each output's page texts, by output name (summary.json and the state file left out)."""
    return {p.name: [page["text"] for page in json.loads(p.read_text())["pages"]]
            for p in sorted(out.iterdir()) if p.name != "summary.json" and not p.name.startswith(".")}


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def states(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / STATE).read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def complete(docs) -> Path:
    """One uninterrupted in-process run."""
    out = docs.parent / "complete"
    done = _run(str(docs), "--output", str(out), "--task", "text", "--max-retries", "1")
    assert done.returncode == 1, done.stderr  # broken.png failed
    assert "broken.png" in done.stderr and "Traceback" not in done.stderr
    return out


def test_batch_reads_every_document_into_its_own_file(docs, complete):
    got = outputs(complete)
    assert len(got) == 5 and all(name.endswith(".json") for name in got)
    texts = {name.split("-")[0]: squash(" ".join(pages)) for name, pages in got.items()}
    assert "JOHNSMITH" in texts["card.png"] and "张三" in texts["scans__zh.jpg"]
    assert "INVOICE2024-0042" in texts["scans__invoice.png"] and "HELLOBATCH" in texts["hello.webp"]
    assert [squash(t) for t in got[next(n for n in got if n.startswith("report.pdf"))]] == [
        "FIRSTPAGEOFREPORT", "SECONDPAGEHERE", "THIRDANDLASTPAGE"]
    s = summary(complete)
    assert s["documents"] == {"total": 6, "done": 5, "failed": 1, "resumed": 0}
    assert s["pages"]["total"] == 7 and s["pages"]["read_this_run"] == 7 and s["pages_per_s"] > 0
    failed = [i for i in s["items"] if i["status"] == "failed"]
    assert [Path(i["path"]).name for i in failed] == ["broken.png"] and failed[0]["error"]
    # a rerun reads nothing again but the failure (attempt 2 of 1 + --max-retries), then gives up
    again = _run(str(docs), "--output", str(complete), "--task", "text", "--max-retries", "1")
    assert again.returncode == 1
    assert summary(complete)["documents"] == {"total": 6, "done": 5, "failed": 1, "resumed": 5}
    assert summary(complete)["pages"]["read_this_run"] == 0 and outputs(complete) == got
    broken = [r for r in states(complete) if r["key"].endswith("broken.png")]
    assert [r["attempts"] for r in broken] == [1, 2]
    _run(str(docs), "--output", str(complete), "--task", "text", "--max-retries", "1")
    assert [r["attempts"] for r in states(complete) if r["key"].endswith("broken.png")] == [1, 2]  # gave up


GIANT, A4 = b"[0 0 14400 14400]", b"[0 0 595 842]"  # a page too large to render, and a blank A4 one


@pytest.mark.parametrize("pages", [None, "1-2"])
def test_pages_that_cannot_be_rendered_are_error_pages_wherever_the_ranges_fall(tmp_path, pages):
    # A range whose every page failed was a 4xx that failed the whole document (found with real drawings): its
    # pages are error pages, each with its own message, and the document is done.
    docs = tmp_path / "drawings"
    docs.mkdir()
    (docs / "plans.pdf").write_bytes(pages_pdf([GIANT, GIANT, A4]))
    out = tmp_path / "out"
    done = _run(str(docs), "--output", str(out), "--task", "text", "--job-range-pages", "2",
                *(["--pages", pages] if pages else []))
    assert done.returncode == 0, done.stderr
    (name,) = outputs(out)
    read = json.loads((out / name).read_text())["pages"]
    assert [p["index"] for p in read] == ([0, 1, 2] if pages is None else [0, 1])
    assert [p["finish_reason"] for p in read[:2]] == ["error", "error"]
    assert read[0]["error"].startswith("page 1:") and read[1]["error"].startswith("page 2:"), read
    if pages is None:
        assert read[2]["finish_reason"] != "error" and read[2].get("error") is None
    assert summary(out)["documents"]["done"] == 1


def test_file_names_in_any_script_or_not_utf8_are_read_named_and_found_again(tmp_path):
    # A folder from a Chinese office and a file whose name is not UTF-8 (an old Windows share's GBK): the run
    # crashed with a UnicodeEncodeError writing its state, and every Chinese name became "pdf-<hash>.json".
    import os

    from imaging import card

    docs = tmp_path / "docs"
    docs.mkdir()
    png = card().png()
    (docs / "发票.png").write_bytes(png)
    (Path(os.fsdecode(os.fsencode(docs) + b"/\xb7\xa2\xc6\xb1.png"))).write_bytes(png)  # 发票 in GBK
    out = tmp_path / "out"
    for rerun in (False, True):
        done = _run(str(docs), "--output", str(out), "--task", "text", "--table", "parquet")
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert summary(out)["documents"]["done"] == 2
        if rerun:
            assert "2 from an earlier run" in done.stderr + done.stdout
    names = sorted(p.name for p in out.glob("*.json") if p.name != "summary.json")
    assert len(names) == 2 and any(n.startswith("发票.png-") for n in names), names
    import pyarrow.parquet as pq

    documents = set(pq.read_table(out / "pages.parquet").column("document").to_pylist())
    assert len(documents) == 2 and any("\ufffd" in d for d in documents)  # shown as text, the bytes replaced


def test_killed_batch_resumes_to_the_same_outputs_exactly_once(docs, complete):
    out = docs.parent / "killed"
    proc = subprocess.Popen([*HYOCR, "batch", str(docs), "--output", str(out), "--task", "text",
                             "--max-retries", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while not (out.is_dir() and outputs(out)):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "no output appeared"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    partial = outputs(out)
    assert 1 <= len(partial) < 5 and not (out / "summary.json").exists()
    resumed = _run(str(docs), "--output", str(out), "--task", "text", "--max-retries", "1")
    assert resumed.returncode == 1, resumed.stderr  # broken.png, as before
    assert outputs(out) == outputs(complete)  # the same names, the same page texts
    assert not [p for p in out.iterdir() if p.name.startswith(".hyocr-tmp-")]
    s = summary(out)
    assert s["documents"]["total"] == 6 and s["documents"]["done"] == 5 and s["documents"]["failed"] == 1
    assert 1 <= s["documents"]["resumed"] <= len(partial) and s["pages"]["total"] == 7
    done_lines = [r["key"] for r in states(out) if r["status"] == "done"]
    assert len(done_lines) == len(set(done_lines)) == 5  # each document read to the end once


def test_bad_inputs_stop_before_anything_runs(tmp_path, docs):
    missing = _run(str(tmp_path / "nope"), "--output", str(tmp_path / "o"))
    assert missing.returncode == 2 and "no such file" in missing.stderr and not (tmp_path / "o").exists()
    bad_task = _run(str(docs / "card.png"), "--output", str(tmp_path / "o"), "--task", "poetry")
    assert bad_task.returncode == 2 and "Traceback" not in bad_task.stderr


JOBS_API = importlib.util.find_spec("hyocr.api.routes.jobs") is not None


@pytest.mark.skipif(not JOBS_API, reason="the jobs API (hyocr.api.routes.jobs) is not there yet")
def test_batch_through_the_jobs_api_reattaches_after_a_kill(docs, complete, tmp_path):
    from servers import serve_process

    from hyocr.client import HyocrClient

    proc, url = serve_process(env={"HYOCR_DATA_DIR": str(tmp_path / "data"), "HYOCR_UI": "false"})
    try:
        out = tmp_path / "remote"
        args = [str(docs), "--output", str(out), "--task", "text", "--url", url, "--poll", "0.2",
                "--max-retries", "0"]
        first = subprocess.Popen([*HYOCR, "batch", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 120
            while not ((out / STATE).is_file() and any(r["status"] == "submitted" for r in states(out))):
                assert first.poll() is None, first.stderr.read()
                assert time.monotonic() < deadline, "nothing was submitted"
                time.sleep(0.02)
            first.send_signal(signal.SIGKILL)  # a job submitted, its result not yet written
        finally:
            first.wait(timeout=30)
        done = _run(*args)
        assert done.returncode == 1, done.stderr  # broken.png: refused by the server
        assert outputs(out) == outputs(complete)
        s = summary(out)
        assert s["documents"]["done"] == 5 and s["documents"]["failed"] == 1
        assert all(i["job_id"] for i in s["items"] if i["status"] == "done")
        with HyocrClient(url, timeout=30) as client:
            jobs = client.list_jobs(limit=100)
        # one job per document read: the rerun re-attached to the killed run's job instead of a second
        assert len({i["job_id"] for i in s["items"] if i["job_id"]}) == len(jobs.jobs)
        again = _run(*args)
        assert summary(out)["documents"]["resumed"] == 5 and outputs(out) == outputs(complete)
        assert again.returncode == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_rerun_keeps_counting_the_error_pages_of_documents_done_before(tmp_path):
    # A document done with an error page (one too large to render) is skipped by a rerun: its summary kept the
    # document's pages but counted its failed pages as 0 (a helper round), so a rerun's summary read clean.
    from pdfs import pages_pdf

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "mixed.pdf").write_bytes(pages_pdf([b"[0 0 595 842]", b"[0 0 14400 14400]", b"[0 0 595 842]"]))
    out = tmp_path / "out"
    for run in (1, 2):
        done = _run(str(folder), "--output", str(out), "--task", "text")
        assert done.returncode == 0, done.stderr
        s = summary(out)
        assert s["pages"]["total"] == 3 and s["pages"]["failed"] == 1, (run, s)
        assert s["items"][0]["failed_pages"] == 1 and s["documents"]["resumed"] == (run == 2), (run, s)
