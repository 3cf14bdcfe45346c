"""``hyocr eval`` as a user runs it: real processes, the real rapidocr engine on images rendered with known
text and boxes (near-perfect scores), the same images against a wrong truth (poor scores), real PDFs whose
text layer is the reference, an OmniDocBench folder, a live server through --url, a run killed and resumed,
and reports compared."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import omnidocbench_pages as odb
import pytest
import requests
from imaging import Line, card, font, render
from pdfs import scanned_pdf, text_pdf

HYOCR = [sys.executable, "-m", "hyocr"]
STATE = ".hyocr-batch.jsonl"


def _eval(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*HYOCR, "eval", *args], capture_output=True, text=True, timeout=timeout, check=False)


def _report(path: Path) -> dict:
    return json.loads(path.read_text())


def _line_box(line: Line, ink: tuple[int, int, int, int]) -> list[int]:
    """A line's box as annotators draw one: the ink's width, the font's whole line height (ascender to
    descender), not the capitals' tight ink (a 36 px line of capitals is 26 px of ink in a 43 px line)."""
    ascent, descent = font(line.size).getmetrics()
    return [ink[0], line.xy[1], ink[2], line.xy[1] + ascent + descent]


def _truth_line(name: str, rendered, *, wrong: bool = False) -> dict:
    """The manifest line of a rendered image: its lines' texts and boxes (or, wrong, other words far from
    where anything was drawn)."""
    texts = [("PLACEHOLDER WORDS " * 2).strip() if wrong else line.text for line in rendered.lines]
    boxes = [_line_box(line, ink) for line, ink in zip(rendered.lines, rendered.boxes, strict=True)]
    boxes = [[b[0] + 2000, b[1], b[2] + 2000, b[3]] if wrong else b for b in boxes]
    return {"path": name, "truth": {"text": "\n".join(texts),
                                    "blocks": [{"text": t, "box": b} for t, b in zip(texts, boxes, strict=True)]}}


IMAGES = {
    "card.png": card(),
    "invoice.png": render([Line("INVOICE 2024-0042", (40, 40)), Line("TOTAL 99.50 EUR", (40, 120))], size=(640, 220)),
    "hello.png": render([Line("HELLO EVALUATION", (40, 40), 36)], size=(620, 140)),  # one box (48 px: two)
}


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eval")
    for name, rendered in IMAGES.items():
        rendered.image.save(root / name)
    for kind, wrong in (("good", False), ("wrong", True)):
        lines = [json.dumps(_truth_line(name, r, wrong=wrong)) for name, r in IMAGES.items()]
        (root / f"{kind}.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def good(labelled) -> Path:
    out = labelled / "good.json"
    done = _eval(str(labelled / "good.jsonl"), "--output", str(out), "--markdown", str(labelled / "good.md"),
                 "--plot", str(labelled / "good.png"), "--label", "in-process")
    assert done.returncode == 0, done.stderr
    return out


def test_rapidocr_on_rendered_images_scores_near_perfect(labelled, good):
    report = _report(good)
    text, spots = report["scores"]["text"], report["scores"]["spotting"]
    assert text["pages"] == 3 and text["cer"] < 0.05 and text["ned"] < 0.05 and text["word_f1"] > 0.9
    assert spots["reference_boxes"] == 8 and spots["f1"] >= 0.9 and spots["recall"] >= 0.9
    assert spots["mean_iou"] > 0.5 and spots["matched_text_exact"] >= 0.8
    meta = report["metadata"]
    assert meta["engine"]["engine"] == "rapidocr" and meta["engine"]["model"].startswith("rapidocr")
    assert meta["hyocr"] and meta["date"] and meta["set"]["kind"] == "manifest" and meta["set"]["tasks"] == {
        "spotting": 3}
    ops = report["operational"]
    assert ops["documents"]["done"] == 3 and ops["pages"]["read"] == 3 and ops["pages_per_s"] > 0
    assert ops["finish_reasons"] == {"stop": 3} and ops["failures_total"] == 0
    assert len(report["pages"]) == 3 and all("spotting" in p["scores"] for p in report["pages"])
    assert "box F1" in (labelled / "good.md").read_text()
    assert (labelled / "good.png").read_bytes().startswith(b"\x89PNG")


def test_the_same_images_against_a_wrong_truth_score_poorly(labelled, good):
    out = labelled / "wrong.json"
    # the same documents read with the same options: their reads are reused, only the scores change
    done = _eval(str(labelled / "wrong.jsonl"), "--output", str(out), "--reads", str(good.with_suffix(".reads")))
    assert done.returncode == 0, done.stderr
    report = _report(out)
    assert report["operational"]["documents"]["resumed"] == 3
    assert report["scores"]["text"]["cer"] > 0.5 and report["scores"]["text"]["word_f1"] < 0.2
    assert report["scores"]["spotting"]["f1"] == 0.0 and report["scores"]["spotting"]["matched"] == 0
    assert report["metadata"]["set"]["fingerprint"] != _report(good)["metadata"]["set"]["fingerprint"]
    compared = _eval("compare", str(good), str(out), "--output", str(labelled / "compare.md"))
    assert compared.returncode == 0, compared.stderr
    text = (labelled / "compare.md").read_text()
    assert "in-process (baseline)" in text and "The sets differ" in text and "(worse)" in text
    # the README's spelling: --markdown names the comparison's file as well
    compared = _eval("compare", str(good), str(out), "--markdown", str(labelled / "compare-2.md"))
    assert compared.returncode == 0, compared.stderr
    assert (labelled / "compare-2.md").read_text() == text


def test_pdf_text_layer_is_the_reference(tmp_path):
    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    (pdfs / "letter.pdf").write_bytes(text_pdf([["QUARTERLY REPORT 2026", "Revenue rose to 4.2 million",
                                                 "Costs fell by nine percent"], ["SECOND PAGE OF THE LETTER"]],
                                               size=22))
    (pdfs / "scan.pdf").write_bytes(scanned_pdf([["A SCANNED PAGE WITHOUT TEXT"]], dpi=100))
    out = tmp_path / "pdf.json"
    done = _eval(str(pdfs), "--truth", "pdf-text", "--output", str(out))
    assert done.returncode == 0, done.stderr
    report = _report(out)
    assert report["metadata"]["set"]["kind"] == "pdf-text" and report["metadata"]["set"]["pages_with_reference"] == 2
    assert report["metadata"]["set"]["tasks"] == {"text": 1}
    assert [d["why"] for d in report["operational"]["skipped_documents"]] == [
        "no reliable text layer (a scan, or a broken font encoding)"]
    assert "1 document(s) of the set not scored: scan.pdf (no reliable text layer" in done.stdout
    assert report["operational"]["pages"]["read"] == 2  # the scan is not read: it has nothing to compare with
    assert report["scores"]["text"]["cer"] < 0.1 and report["scores"]["text"]["word_f1"] > 0.8
    assert [p["page"] for p in report["pages"]] == [1, 2]
    # --pages past a document's end reads it to its end (the README's "--pages 1-20" skipped every shorter PDF)
    short = _eval(str(pdfs), "--truth", "pdf-text", "--pages", "2-20", "--output", str(tmp_path / "short.json"))
    assert short.returncode == 0, short.stderr
    assert [p["page"] for p in _report(tmp_path / "short.json")["pages"]] == [2]


def test_an_omnidocbench_folder(tmp_path):
    root = tmp_path / "OmniDocBench"
    (root / "images").mkdir(parents=True)
    rendered = render([Line("Annual Report", (40, 30), 40), Line("Revenue grew in the third quarter.", (40, 110)),
                       Line("7", (40, 330))], size=(800, 400))
    rendered.image.save(root / "images" / "report_p7.png")
    (root / "OmniDocBench.json").write_text(json.dumps([odb.page("report_p7.png")]))
    out = tmp_path / "odb.json"
    done = _eval(str(root), "--task", "text", "--output", str(out))  # rapidocr reads text, not markdown
    assert done.returncode == 0, done.stderr
    report = _report(out)
    assert report["metadata"]["set"]["kind"] == "omnidocbench" and report["scores"]["text"]["cer"] < 0.1
    assert set(report["scores"]) == {"text"}  # tables and markdown need a document-parsing output


def test_a_truth_its_task_does_not_output_is_said_not_reported_as_nothing(labelled, tmp_path):
    # markdown truth read with task text: the report had no scores ("Scored: . Computed with .") and exit 0
    (tmp_path / "md.jsonl").write_text(json.dumps({"path": str(labelled / "hello.png"), "task": "text",
                                                   "truth": {"markdown": "# HELLO EVALUATION"}}) + "\n")
    done = _eval(str(tmp_path / "md.jsonl"), "-o", str(tmp_path / "md.json"))
    assert done.returncode == 1 and "nothing was scored" in done.stderr and "--task" in done.stderr, done.stderr


def test_through_a_live_server(labelled, good, tmp_path):
    from servers import serve_process

    proc, url = serve_process(env={"HYOCR_DATA_DIR": str(tmp_path / "data"), "HYOCR_UI": "false",
                                   "HYOCR_API_KEYS": "k-eval"})
    try:
        out = tmp_path / "remote.json"
        refused = _eval(str(labelled / "good.jsonl"), "--output", str(tmp_path / "nokey.json"), "--url", url)
        assert refused.returncode != 0 and "401" in refused.stderr + refused.stdout, refused.stderr
        assert "Traceback" not in refused.stderr
        done = _eval(str(labelled / "good.jsonl"), "--output", str(out), "--url", url, "--poll", "0.2",
                     "--label", "server", "--api-key", "k-eval")
        assert done.returncode == 0, done.stderr
        # a second evaluation into another folder reads again: its jobs are its own, not the first's (it got
        # them back by their idempotency keys, whatever engine had read them)
        again = _eval(str(labelled / "good.jsonl"), "--output", str(tmp_path / "again.json"), "--url", url,
                      "--poll", "0.2", "--api-key", "k-eval")
        assert again.returncode == 0, again.stderr
        listed = requests.get(f"{url}/v1/jobs?limit=100", headers={"Authorization": "Bearer k-eval"},
                              timeout=10).json()["data"]
        assert len(listed) == 2 * len(IMAGES), listed
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    remote, local = _report(out), _report(good)
    assert remote["metadata"]["target"] == url and remote["metadata"]["engine"]["engine"] == "rapidocr"
    assert remote["metadata"]["settings"] == {"url": url}
    assert remote["scores"]["text"] == local["scores"]["text"]  # the same engine reads the same text
    compared = _eval("compare", str(good), str(out))
    assert compared.returncode == 0 and "server" in compared.stdout and "The sets differ" not in compared.stdout


def test_a_killed_run_resumes_reading_only_what_is_missing(tmp_path):
    lines = []
    for i in range(6):
        rendered = render([Line(f"PAGE NUMBER {i} OF SIX", (40, 40), 40)], size=(700, 140))
        rendered.image.save(tmp_path / f"p{i}.png")
        lines.append(json.dumps({"path": f"p{i}.png", "truth": {"text": f"PAGE NUMBER {i} OF SIX"}}))
    (tmp_path / "set.jsonl").write_text("\n".join(lines) + "\n")
    out, reads = tmp_path / "r.json", tmp_path / "r.reads"
    proc = subprocess.Popen([*HYOCR, "eval", str(tmp_path / "set.jsonl"), "--output", str(out), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        # a document recorded done (its output is written first: a kill between the two reads it again)
        while not ((reads / STATE).is_file() and '"status": "done"' in (reads / STATE).read_text()):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "nothing was read"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert not out.exists()
    done = _eval(str(tmp_path / "set.jsonl"), "--output", str(out))
    assert done.returncode == 0, done.stderr
    report = _report(out)
    docs = report["operational"]["documents"]
    assert docs["done"] == 6 and 1 <= docs["resumed"] < 6 and report["scores"]["text"]["pages"] == 6
    assert report["scores"]["text"]["cer"] < 0.05
    finished = [json.loads(line)["key"] for line in (reads / STATE).read_text().splitlines()
                if json.loads(line)["status"] == "done"]
    assert len(finished) == len(set(finished)) == 6  # each document read to the end once
    assert report["operational"]["timed_pages"] == 6 - docs["resumed"]  # the killed run's time is unknown
    # the same reads folder for a smaller set: its report is timed by its own runs, not the whole set's
    (tmp_path / "two.jsonl").write_text("\n".join(lines[:2]) + "\n")
    two = _eval(str(tmp_path / "two.jsonl"), "--output", str(tmp_path / "two.json"), "--reads", str(reads))
    assert two.returncode == 0, two.stderr
    assert _report(tmp_path / "two.json")["operational"]["runs"] == 1


def test_bad_requests_stop_before_anything_runs(tmp_path, labelled, good):
    cases = [
        ((str(tmp_path / "nope.jsonl"), "--output", str(tmp_path / "r.json")), "no such file or folder"),
        ((str(labelled / "hello.png"), "--output", str(tmp_path / "r.json")), "not a .jsonl manifest"),
        ((str(labelled / "good.jsonl"), "-o", str(tmp_path / "r.json"), "--truth", "pdf-text"), "a manifest;"),
        ((str(labelled), "-o", str(tmp_path / "r.json"), "--truth", "manifest"), "takes a .jsonl file"),
        ((str(labelled / "good.jsonl"), "-o", str(tmp_path / "r.json"), "--reads", str(labelled / "good.jsonl")),
         "--reads names the folder"),
        ((str(labelled / "good.jsonl"),), "--output REPORT.json is required"),
        ((str(labelled / "good.jsonl"), "-o", str(tmp_path / "no" / "r.json")), "does not exist"),
        ((str(labelled / "good.jsonl"), "-o", str(tmp_path / "r.json"), "--task", "poetry"), "poetry"),
        ((str(labelled / "good.jsonl"), "-o", str(tmp_path / "r.json"), "--set", "nonsense=1"), "not a hyocr setting"),
        (("compare", str(good)), "at least two reports"),
        (("compare", str(good), str(labelled / "good.jsonl")), "not a JSON report"),
        (("compare", str(good), str(labelled / "good.md")), "not a JSON report"),
    ]
    # found by a hostile round: files the command would have overwritten, and inputs that ended in a traceback
    manifest, report = str(labelled / "good.jsonl"), str(tmp_path / "r.json")
    image = str(labelled / "hello.png")
    bad_lines = {
        "deep.jsonl": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        "long.jsonl": (json.dumps({"path": "a" * 100_000, "truth": {"text": "x"}}), "100000 characters"),
        "task.jsonl": (json.dumps({"path": image, "task": "bogus", "truth": {"text": "x"}}), "unknown task"),
        "folder.jsonl": (json.dumps({"path": str(labelled), "truth": {"text": "x"}}), "a folder, not a file"),
    }
    for name, (line, why) in bad_lines.items():
        (tmp_path / name).write_text(line + "\n")
        cases.append(((str(tmp_path / name), "-o", report), why))
    (tmp_path / "latin1.jsonl").write_bytes(b"# a comment\n\xff\xfe\n")
    cases.append(((str(tmp_path / "latin1.jsonl"), "-o", report), "latin1.jsonl:2: not UTF-8"))
    cases += [
        ((manifest, "-o", manifest), "is read by this command"),
        ((manifest, "-o", report, "--markdown", manifest), "is read by this command"),
        ((manifest, "-o", report, "--markdown", report), "must name different files"),
        ((manifest, "-o", report, "--plot", str(tmp_path)), "a folder"),
        ((manifest, "-o", report, "--plot", str(tmp_path / "p.weird")), "--plot"),
        ((manifest, "-o", str(tmp_path / ("b" * 300 + ".json"))), "File name too long"),
        (("compare", str(good), str(good), "--output", str(good)), "is read by this command"),
        # a file the set reads, not SET itself: a document of the manifest, a folder set's annotations
        ((manifest, "-o", report, "--plot", image), "is read by this command"),
        ((manifest, "-o", report, "--markdown", str(labelled / "card.png")), "is read by this command"),
    ]
    # found by a second hostile round: numbers and URLs argparse now refuses, a report path that is its own reads
    # folder, a device as the report with no reads folder beside it, a task the engine cannot run
    os.mkfifo(tmp_path / "fifo")
    cases += [
        ((manifest, "-o", report, "--url", "http://localhost:800O"), "argument --url"),
        ((manifest, "-o", report, "--url", "http://[::1"), "argument --url"),
        ((manifest, "-o", report, "--url", "http://localhost:80000"), "argument --url"),
        ((manifest, "-o", report, "--url", "ftp://localhost"), "argument --url"),
        ((manifest, "-o", report, "--timeout", "0"), "argument --timeout"),
        ((manifest, "-o", report, "--timeout", "nan"), "argument --timeout"),
        ((manifest, "-o", report, "--poll", "-1"), "argument --poll"),
        ((manifest, "-o", str(tmp_path / "x.reads")), "would be one path"),
        ((manifest, "-o", report, "--reads", report), "would be one path"),
        ((manifest, "-o", str(tmp_path / "fifo")), "give --reads DIR"),
        ((manifest, "-o", report, "--task", "extract", "--engine", "rapidocr"), "needs a vision-language engine"),
    ]
    odb_root = tmp_path / "odb"
    (odb_root / "images").mkdir(parents=True)
    IMAGES["hello.png"].image.save(odb_root / "images" / "p1.png")
    (odb_root / "OmniDocBench.json").write_text(json.dumps([odb.page("p1.png")]))
    cases.append(((str(odb_root), "--task", "text", "-o", str(odb_root / "OmniDocBench.json")),
                  "is read by this command"))
    for args, why in cases:
        done = _eval(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert why in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    assert json.loads((odb_root / "OmniDocBench.json").read_text())[0]["page_info"]  # untouched
    assert not (tmp_path / "x.reads").exists() and (tmp_path / "fifo").is_fifo()


def test_a_report_to_a_device_or_through_a_link_leaves_the_node_and_the_link(tmp_path, labelled):
    """-o /dev/stdout (as root in a container) used to replace the node with a regular file for the whole machine,
    and a link to a report with the report: a device or pipe is written through, a link's target is written."""
    manifest = str(labelled / "good.jsonl")
    os.mkfifo(tmp_path / "pipe")
    reader = subprocess.Popen(["cat", str(tmp_path / "pipe")], stdout=subprocess.PIPE)
    done = _eval(manifest, "-o", str(tmp_path / "pipe"), "--reads", str(tmp_path / "piped.reads"), "--engine", "fake")
    assert done.returncode == 0, done.stderr
    assert json.loads(reader.communicate(timeout=30)[0])["object"] == "hyocr.eval.report"
    assert (tmp_path / "pipe").is_fifo()
    done = _eval(manifest, "-o", "/dev/stdout", "--reads", str(tmp_path / "out.reads"), "--engine", "fake")
    assert done.returncode == 0 and json.loads(done.stdout)["object"] == "hyocr.eval.report", done.stdout[-300:]
    assert "| family | metric |" in done.stderr  # the summary is not mixed into the JSON
    log = tmp_path / "app.log"  # stdout appending to a log: the report is appended, the log kept
    log.write_text("previous log line\n")
    with log.open("a") as appended:
        subprocess.run([*HYOCR, "eval", manifest, "-o", "/dev/stdout", "--reads", str(tmp_path / "log.reads"),
                        "--engine", "fake"], stdout=appended, stderr=subprocess.DEVNULL, timeout=300, check=True)
    head, _, report = log.read_text().partition("\n")
    assert head == "previous log line" and json.loads(report)["object"] == "hyocr.eval.report"
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "latest.json").symlink_to(tmp_path / "real.json")
    done = _eval(manifest, "-o", str(tmp_path / "latest.json"), "--engine", "fake")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "latest.json").is_symlink() and _report(tmp_path / "real.json")["object"] == "hyocr.eval.report"


def test_a_pdf_named_in_no_utf8_is_evaluated(tmp_path):
    """A file name that is not UTF-8 (os.fsdecode's escapes) crashed the set's fingerprint after every page was
    read; `hyocr batch` took the same folder."""
    folder = tmp_path / "set"
    folder.mkdir()
    name = os.fsdecode(b"caf\xe9.pdf")
    (folder / name).write_bytes(text_pdf([["QUARTERLY REPORT 2026", "Revenue rose to 4.2 million"]], size=22))
    done = _eval(str(folder), "--truth", "pdf-text", "--engine", "fake", "-o", str(tmp_path / "r.json"))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert _report(tmp_path / "r.json")["operational"]["documents"]["done"] == 1


def test_documents_a_stopped_run_did_not_read_are_left_out_of_the_scores(labelled, tmp_path):
    """The server gone mid-run: the message said the documents not read are left out, and the report scored each
    as an empty output (CER 1.0 over pages never read)."""
    from servers import serve_process

    proc, url = serve_process("--engine", "fake", "--model", "latency=1.5", "--no-ui",
                              env={"HYOCR_DATA_DIR": str(tmp_path / "data")})
    out, reads = tmp_path / "r.json", tmp_path / "r.reads"
    run = subprocess.Popen([*HYOCR, "eval", str(labelled / "good.jsonl"), "-o", str(out), "--url", url, "--workers",
                            "1", "--poll", "0.1", "--max-retries", "0", "--timeout", "5"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ((reads / STATE).is_file() and '"status": "done"' in (reads / STATE).read_text()):
            assert run.poll() is None and time.monotonic() < deadline, run.stderr.read() if run.poll() else "slow"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert run.wait(timeout=180) == 1
    assert "the documents not read are left out" in run.stderr.read()
    report = _report(out)
    done = report["operational"]["documents"]["done"]
    assert 1 <= done < len(IMAGES)
    assert len(report["pages"]) == done and not any(row["error"] for row in report["pages"]), report["pages"]
