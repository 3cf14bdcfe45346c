"""``hyocr batch --ray`` as a user runs it: a Ray Data pipeline on a local Ray cluster the CLI starts (two
rapidocr engine actors), over 18 rendered pages: six images and three scanned four-page PDFs, the PDFs' folder
given as a file:// URI (listed and read by batch/sources.py). It writes what the in-process batch writes,
page for page, and either resumes the other's work."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from imaging import Line, render, squash

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason='needs "hyocr[ray]"')

HYOCR = [sys.executable, "-m", "hyocr"]
STATE = ".hyocr-batch.jsonl"
MARK = f"hyocr-test-{uuid.uuid4().hex[:12]}"  # in the environment of every process these runs start
# Fields a run makes its own: the rest of every output is the same, whichever path read it.
OWN_FIELDS = ("id", "created", "timings")


@pytest.fixture(scope="module")
def ray_env() -> dict[str, str]:
    # A short temp dir: Ray's session sockets live below it (Unix socket paths are limited to 107 bytes).
    temp = tempfile.mkdtemp(prefix="hyray-", dir="/tmp")
    yield {**os.environ, "RAY_TMPDIR": temp, "RAY_USAGE_STATS_ENABLED": "0", "HYOCR_TEST_MARK": MARK}
    shutil.rmtree(temp, ignore_errors=True)


def _batch(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*HYOCR, "batch", *args, "--engine", "rapidocr", "--max-retries", "0"],
                          capture_output=True, text=True, timeout=timeout, check=False, env=env)


def _scans(texts: list[str]) -> bytes:
    """Pages that are pictures of text (no text layer), small: a detector reads each in well under a second."""
    images = [render([Line(text, (30, 40), 30), Line("PAGE TOTAL 12.50", (30, 170), 30)], size=(360, 300)).image
              for text in texts]
    out = io.BytesIO()
    images[0].save(out, "PDF", resolution=100, save_all=True, append_images=images[1:])
    return out.getvalue()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    """The documents, and the INPUTs naming them: a folder and a file:// URI."""
    root = tmp_path_factory.mktemp("corpus")
    images, pdfs = root / "images", root / "pdfs"
    images.mkdir()
    pdfs.mkdir()
    for n in range(6):
        lines = [Line(f"RECEIPT {n:02d}", (30, 40), 30), Line(f"TOTAL {n * 7}.50 EUR", (30, 170), 30)]
        render(lines, size=(360, 300)).image.save(images / f"receipt{n:02d}.png")
    for d in range(3):
        (pdfs / f"report{d}.pdf").write_bytes(_scans([f"REPORT {d} PAGE {p}" for p in range(1, 5)]))
    (images / "broken.png").write_bytes(b"not a png at all")  # fails in both, with the same message
    (pdfs / "damaged.pdf").write_bytes(_scans(["DAMAGED"])[:300])
    return root, [str(images), pdfs.as_uri()]


@pytest.fixture(scope="module")
def single(corpus, ray_env) -> Path:
    """The in-process batch: the reference."""
    root, inputs = corpus
    out = root.parent / "single"
    done = _batch(ray_env, *inputs, "--output", str(out))
    assert done.returncode == 1, done.stderr  # the broken image and the damaged PDF
    return out


@pytest.fixture(scope="module")
def on_ray(corpus, ray_env, single) -> tuple[Path, subprocess.CompletedProcess]:
    root, inputs = corpus
    out = root.parent / "ray"
    done = _batch(ray_env, *inputs, "--output", str(out), "--ray", "--ray-replicas", "2")
    assert done.returncode == 1, done.stderr
    return out, done


def bodies(out: Path) -> dict[str, dict]:
    """Each document's output, by name, without the fields a run makes its own."""
    return {p.name: {k: v for k, v in json.loads(p.read_text()).items() if k not in OWN_FIELDS}
            for p in sorted(out.glob("*.json")) if p.name != "summary.json"}


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def states(out: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "at"}
            for line in (out / STATE).read_text().splitlines() if line.strip()]


def mtimes(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in out.glob("*.json") if p.name != "summary.json"}


def test_ray_batch_writes_exactly_what_the_in_process_batch_writes(single, on_ray):
    out, done = on_ray
    reference, got = bodies(single), bodies(out)
    assert len(reference) == 9 and list(got) == list(reference)  # the same names: the same keys
    for name, body in reference.items():
        assert got[name] == body, name  # texts, blocks (boxes, scores), pages, dpi, usage: all equal
    pages = [p for body in got.values() for p in body["pages"]]
    assert len(pages) == 18 and all(p["blocks"] for p in pages)
    report = next(b for n, b in got.items() if n.startswith("report2.pdf"))
    assert [squash(p["text"]) for p in report["pages"]] == [f"REPORT2PAGE{p}PAGETOTAL12.50" for p in range(1, 5)]
    assert [p["source"] for p in report["pages"]] == ["render"] * 4
    s, ref = summary(out), summary(single)
    assert s["items"] == ref["items"] and s["documents"] == ref["documents"] == {
        "total": 11, "done": 9, "failed": 2, "resumed": 0}
    assert s["pages"] == ref["pages"] == {"total": 18, "failed": 0, "read_this_run": 18}
    failed = {Path(i["path"]).name: i["error"] for i in s["items"] if i["status"] == "failed"}
    assert set(failed) == {"broken.png", "damaged.pdf"} and all(failed.values())
    assert sorted(map(json.dumps, states(out))) == sorted(map(json.dumps, states(single)))
    assert "Traceback" not in done.stderr and "broken.png" in done.stderr


def test_summary_reports_pages_per_second_of_each_worker(on_ray):
    out, done = on_ray
    workers = summary(out)["workers"]
    assert len(workers) == 2 and len({w["worker"] for w in workers}) == 2
    assert all(w["pages"] > 0 and w["busy_s"] > 0 and w["pages_per_s"] > 0 and w["node"] for w in workers)
    assert sum(w["pages"] for w in workers) == 18
    lines = [line for line in done.stderr.splitlines() if line.startswith("hyocr: worker ")]
    assert len(lines) == 2 and all("pages/s" in line for line in lines)


def test_a_rerun_of_either_path_resumes_the_others_work(single, on_ray, ray_env, corpus):
    out, _ = on_ray
    _, inputs = corpus
    before = mtimes(out)
    again = _batch(ray_env, *inputs, "--output", str(out), "--ray", "--ray-replicas", "2", "--table", "parquet")
    assert again.returncode == 1, again.stderr  # the two failures, out of attempts: not read again
    s = summary(out)
    assert s["documents"]["resumed"] == 9 and s["pages"]["read_this_run"] == 0 and s["workers"] == []
    assert mtimes(out) == before and "hyocr: worker" not in again.stderr  # nothing read: no cluster started
    import pyarrow.parquet as pq

    table = pq.read_table(out / "pages.parquet").to_pylist()
    assert [r["text"] for r in table] == [p["text"] for b in bodies(out).values() for p in b["pages"]]
    # in-process, on the Ray run's folder, with one output removed: only that document is read again
    removed = next(n for n in before if n.startswith("report1.pdf"))
    (out / removed).unlink()
    resumed = _batch(ray_env, *inputs, "--output", str(out))
    assert resumed.returncode == 1, resumed.stderr
    s = summary(out)
    assert s["documents"]["resumed"] == 8 and s["pages"]["read_this_run"] == 4
    assert bodies(out) == bodies(single)
    # and the Ray path on the in-process folder: all of it done already
    also = _batch(ray_env, *inputs, "--output", str(single), "--ray")
    assert also.returncode == 1 and summary(single)["documents"]["resumed"] == 9


def test_no_ray_process_outlives_the_runs(on_ray):
    """Every process the runs started (Ray's, the engines', the PDF renderers') carries MARK in its
    environment: once the command has exited, none is left."""
    deadline = time.monotonic() + 15
    while (left := _marked_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left


def _marked_processes() -> list[str]:
    found = []
    needle = f"HYOCR_TEST_MARK={MARK}".encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes():
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def test_without_ray_installed_the_command_says_how_to_install_it(tmp_path, corpus, monkeypatch, capsys):
    from hyocr.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.split(".")[0] == "ray" else real(name, *a))
    root, _ = corpus
    code = main(["batch", str(root / "images" / "receipt00.png"), "-o", str(tmp_path / "out"), "--ray",
                 "--engine", "rapidocr"])
    assert code == 2 and 'pip install "hyocr[ray]"' in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("uri", "says"), [("file:///nonexistent/hyocr-corpus/", "no such object or prefix"),
                                           ("nosuchscheme://bucket/x", "nosuchscheme://bucket/x")])
def test_a_uri_that_cannot_be_listed_stops_the_batch(tmp_path, uri, says, capsys):
    from hyocr.cli import main

    code = main(["batch", uri, "-o", str(tmp_path / "out"), "--ray", "--engine", "rapidocr"])
    err = capsys.readouterr().err
    assert code == 2 and says in err and "Traceback" not in err and not (tmp_path / "out").exists()
