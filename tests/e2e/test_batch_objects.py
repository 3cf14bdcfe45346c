"""``hyocr batch`` from and to object storage, in-process, against a real S3 protocol server on loopback
(moto's server mode, started here; HYOCR_OBJECT_STORE_ENDPOINT points the CLI at it, credentials in the
environment):
an s3:// prefix read into an s3:// prefix gives what a local run gives; a bucket that refuses writes fails
each document clearly and loses nothing (the next run writes what was read, reading nothing again); a run
interrupted with Ctrl-C resumes from the local state folder, reading only the pages missing; hostile URIs
stop the batch before the engine loads. The real rapidocr engine on rendered cards and a scanned PDF."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from imaging import Line, render, squash, to_bytes
from object_store import GcsServer, S3Server, s3_environment
from pdfs import scanned_pdf

HYOCR = [sys.executable, "-m", "hyocr"]
STATE = ".hyocr-batch.jsonl"
OWN_FIELDS = ("id", "created", "timings")  # a run's own: the rest of an output is the same, wherever it went


def _card(text: str, size: tuple[int, int] = (560, 120)) -> bytes:
    return to_bytes(render([Line(text, (30, 30), 44)], size=size).image)


DOCS = {  # key below the prefix (and path below the local folder) -> bytes
    "card.png": _card("INVOICE 4711"),
    "report.pdf": scanned_pdf([["FIRST PAGE OF REPORT"], ["SECOND PAGE HERE"], ["THIRD AND LAST PAGE"]],
                              dpi=100),
    "scans/receipt.png": _card("RECEIPT 2026"),
    "notes.txt": b"not a document: skipped",
    ".hidden.png": _card("NEVER READ"),
}
WORDS = {"card.png": ["INVOICE4711"], "scans__receipt.png": ["RECEIPT2026"],
         "report.pdf": ["FIRSTPAGEOFREPORT", "SECONDPAGEHERE", "THIRDANDLASTPAGE"]}


@pytest.fixture(scope="module")
def s3():
    with s3_environment():
        server = S3Server()
        for bucket in ("corpus", "results", "locked"):
            server.bucket(bucket)
        server.deny_writes("locked")
        for key, data in DOCS.items():
            server.put("corpus", f"docs/{key}", data)
        yield server
        server.stop()


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")  # XDG_CACHE_HOME: where a prefix's state folder goes by default


@pytest.fixture(scope="module")
def env(s3, cache) -> dict[str, str]:
    return {**os.environ, "HYOCR_OBJECT_STORE_ENDPOINT": s3.url, "XDG_CACHE_HOME": str(cache)}


def _batch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HYOCR, "batch", *args, "--task", "text"], capture_output=True, text=True,
                          timeout=300, check=False, env=env)


def _own_removed(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in OWN_FIELDS}


def _by_stem(bodies: dict[str, dict]) -> dict[str, dict]:
    """Outputs by their name's readable part (the hash after it names the source: a path, or a URI)."""
    return {name.rsplit("-", 1)[0]: _own_removed(body) for name, body in bodies.items()}


def _stored(s3: S3Server, bucket: str, prefix: str) -> dict[str, dict]:
    """The documents' outputs below a prefix, by name (summary.json and the table left out)."""
    return {key[len(prefix):]: s3.json(bucket, key) for key in s3.keys(bucket, prefix)
            if key.endswith(".json") and not key.endswith("/summary.json")}


def _texts(outputs: dict[str, dict]) -> dict[str, list[str]]:
    return {stem: [squash(p["text"]) for p in body["pages"]] for stem, body in _by_stem(outputs).items()}


def _records(state_dir: Path) -> dict[str, dict]:
    last: dict[str, dict] = {}
    for line in (state_dir / STATE).read_text().splitlines():
        record = json.loads(line)
        last[record["key"]] = record
    return last


@pytest.fixture(scope="module")
def local(tmp_path_factory, env) -> Path:
    """The same documents read from a local folder into one: the reference."""
    root = tmp_path_factory.mktemp("local")
    for key, data in DOCS.items():
        (root / "docs" / key).parent.mkdir(parents=True, exist_ok=True)
        (root / "docs" / key).write_bytes(data)
    done = _batch(env, str(root / "docs"), "--output", str(root / "out"), "--table", "jsonl")
    assert done.returncode == 0, done.stderr
    return root / "out"


def test_an_s3_prefix_read_into_an_s3_prefix_gives_what_a_local_run_gives(s3, env, cache, local):
    done = _batch(env, "s3://corpus/docs/", "--output", "s3://results/run-1/", "--table", "jsonl")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    stored = _stored(s3, "results", "run-1/")
    assert _texts(stored) == WORDS
    reference = {p.name: json.loads(p.read_text()) for p in local.glob("*.json") if p.name != "summary.json"}
    assert _by_stem(stored) == _by_stem(reference)  # page for page, box for box
    keys = s3.keys("results", "run-1/")
    assert set(keys) == {f"run-1/{name}" for name in stored} | {"run-1/summary.json", "run-1/pages.jsonl"}

    # the state stays on this machine, in a folder of its own that the same command finds again
    summary = s3.json("results", "run-1/summary.json")
    state_dir = Path(summary["state"])
    assert summary["output"] == "s3://results/run-1/" and state_dir.is_relative_to(cache / "hyocr" / "batch")
    assert f"kept in {state_dir}" in done.stderr and (state_dir / STATE).is_file()
    assert summary["documents"] == {"total": 3, "done": 3, "failed": 0, "resumed": 0}
    assert summary["pages"]["total"] == summary["pages"]["read_this_run"] == 5
    assert [i["path"] for i in summary["items"]] == [
        "s3://corpus/docs/card.png", "s3://corpus/docs/report.pdf", "s3://corpus/docs/scans/receipt.png"]
    assert json.loads((state_dir / "summary.json").read_text()) == summary  # the last run's, kept locally too

    # the table: the local run's rows, but for where each document came from and went
    rows = [json.loads(line) for line in s3.get("results", "run-1/pages.jsonl").decode().splitlines()]
    local_rows = [json.loads(line) for line in (local / "pages.jsonl").read_text().splitlines()]
    assert [r["document"] for r in rows] == [i["path"] for i in summary["items"] for _ in range(i["pages"])]
    assert [{k: v for k, v in r.items() if k not in ("document", "output")} for r in rows] == [
        {k: v for k, v in r.items() if k not in ("document", "output")} for r in local_rows]

    again = _batch(env, "s3://corpus/docs/", "--output", "s3://results/run-1/", "--table", "jsonl")
    assert again.returncode == 0, again.stderr
    summary = s3.json("results", "run-1/summary.json")
    assert summary["documents"]["resumed"] == 3 and summary["pages"]["read_this_run"] == 0
    assert _stored(s3, "results", "run-1/") == stored  # not written again

    # an output removed from the store is read again, and only it
    s3.client.delete_object(Bucket="results", Key=f"run-1/{next(n for n in stored if n.startswith('card'))}")
    third = _batch(env, "s3://corpus/docs/", "--output", "s3://results/run-1/")
    assert third.returncode == 0, third.stderr
    summary = s3.json("results", "run-1/summary.json")
    assert summary["documents"]["resumed"] == 2 and summary["pages"]["read_this_run"] == 1
    assert _by_stem(_stored(s3, "results", "run-1/")) == _by_stem(stored)


def test_a_gs_prefix_read_into_a_gs_prefix_gives_what_a_local_run_gives(env, cache, local):
    """gs:// through a real GCS JSON-API server (gcp-storage-emulator), reached as Google's libraries reach one:
    STORAGE_EMULATOR_HOST. The outputs equal the local run's; the state folder is the emulator's own."""
    gcs = GcsServer()
    try:
        for bucket in ("corpus", "results"):
            gcs.bucket(bucket)
        for key, data in DOCS.items():
            gcs.put("corpus", f"docs/{key}", data)
        gcs_env = {**env, "STORAGE_EMULATOR_HOST": gcs.url}
        done = _batch(gcs_env, "gs://corpus/docs/", "--output", "gs://results/run/")
        assert done.returncode == 0, done.stderr
        stored = _stored(gcs, "results", "run/")
        assert _texts(stored) == WORDS
        reference = {p.name: json.loads(p.read_text()) for p in local.glob("*.json") if p.name != "summary.json"}
        assert _by_stem(stored) == _by_stem(reference)
        summary = gcs.json("results", "run/summary.json")
        assert summary["documents"] == {"total": 3, "done": 3, "failed": 0, "resumed": 0}
        assert Path(summary["state"]).is_relative_to(cache / "hyocr" / "batch")
        again = _batch(gcs_env, "gs://corpus/docs/", "--output", "gs://results/run/")
        assert again.returncode == 0, again.stderr
        assert gcs.json("results", "run/summary.json")["documents"]["resumed"] == 3
    finally:
        gcs.stop()


def test_a_bucket_that_refuses_writes_fails_each_document_and_loses_nothing(s3, env, local, tmp_path):
    state_dir = tmp_path / "state"
    args = ["s3://corpus/docs/", "--output", "s3://locked/run/", "--state-dir", str(state_dir)]
    refused = _batch(env, *args)
    assert refused.returncode == 1, refused.stderr
    assert "Traceback" not in refused.stderr and s3.keys("locked") == []
    # each document a failure naming its object and the store's reason; the summary, refused too, kept here
    summary = json.loads((state_dir / "summary.json").read_text())
    assert "s3://locked/run/summary.json could not be written" in refused.stderr
    assert f"the summary is kept in {state_dir / 'summary.json'}" in refused.stderr
    assert summary["documents"] == {"total": 3, "done": 0, "failed": 3, "resumed": 0}
    assert summary["pages"]["read_this_run"] == 5
    for item in summary["items"]:
        name = item["error"].split(" could not be written")[0].removeprefix("s3://locked/run/")
        assert item["error"].startswith(f"s3://locked/run/{name} could not be written: ")
        assert "ACCESS_DENIED" in item["error"] and f"{item['path']}: {item['error']}" in refused.stderr
        kept = json.loads((state_dir / ".hyocr-unsent" / name).read_text())  # nothing read is lost
        assert [squash(p["text"]) for p in kept["body"]["pages"]] == WORDS[name.rsplit("-", 1)[0]]

    # a missing bucket, the same way
    missing = _batch(env, "s3://corpus/docs/card.png", "--output", "s3://no-such-bucket/run/",
                     "--state-dir", str(tmp_path / "nobucket"))
    assert missing.returncode == 1, missing.stderr
    assert "s3://no-such-bucket/run/card.png-" in missing.stderr and "NO_SUCH_BUCKET" in missing.stderr
    assert "Traceback" not in missing.stderr

    # once the store takes writes, the next run writes what was read, reading nothing again
    s3.client.delete_bucket_policy(Bucket="locked")
    try:
        done = _batch(env, *args)
    finally:
        s3.deny_writes("locked")
    assert done.returncode == 0, done.stderr
    summary = s3.json("locked", "run/summary.json")
    assert summary["documents"] == {"total": 3, "done": 3, "failed": 0, "resumed": 3}
    assert summary["pages"] == {"total": 5, "failed": 0, "read_this_run": 0}
    reference = {p.name: json.loads(p.read_text()) for p in local.glob("*.json") if p.name != "summary.json"}
    assert _by_stem(_stored(s3, "locked", "run/")) == _by_stem(reference)
    assert not list((state_dir / ".hyocr-unsent").iterdir())
    assert [(r["status"], r["attempts"]) for r in _records(state_dir).values()] == [("done", 1)] * 3


def test_an_interrupted_run_resumes_reading_only_what_is_missing(s3, env, tmp_path):
    pages = [[f"PAGE {n} OF THE LONG REPORT"] for n in range(1, 9)]
    s3.put("corpus", "long/a.png", _card("ALPHA 0001"))
    s3.put("corpus", "long/b.pdf", scanned_pdf(pages, dpi=100))
    s3.put("corpus", "long/c.png", _card("GAMMA 0003"))
    state_dir = tmp_path / "state"
    args = ["s3://corpus/long/", "--output", "s3://results/long/", "--state-dir", str(state_dir),
            "--workers", "1", "--job-range-pages", "1", "--task", "text"]
    proc = subprocess.Popen([*HYOCR, "batch", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=env)
    try:
        deadline = time.monotonic() + 180
        while len(_partial_pages(state_dir)) < 2:  # the PDF half read (a.png done before it)
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no page of the PDF was kept"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1].decode()
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted; run again to resume" in err and "Traceback" not in err
    stopped = s3.json("results", "long/summary.json")
    assert stopped["stopped"]["reason"] == "interrupted" and stopped["documents"]["done"] < 3

    done_before = {r["output"]: r["pages"] for r in _records(state_dir).values() if r["status"] == "done"}
    kept = {p for name, p in _partial_pages(state_dir) if name not in done_before}
    assert done_before and kept and len(kept) < 8
    resumed = _batch(env, *args)
    assert resumed.returncode == 0, resumed.stderr
    summary = s3.json("results", "long/summary.json")
    assert summary["documents"] == {"total": 3, "done": 3, "failed": 0, "resumed": len(done_before)}
    assert summary["pages"]["total"] == 10
    assert summary["pages"]["read_this_run"] == 10 - sum(done_before.values()) - len(kept)
    assert _texts(_stored(s3, "results", "long/")) == {
        "a.png": ["ALPHA0001"], "b.pdf": [squash(p[0]) for p in pages], "c.png": ["GAMMA0003"]}
    done_lines = [json.loads(line)["key"] for line in (state_dir / STATE).read_text().splitlines()
                  if json.loads(line)["status"] == "done"]
    assert len(done_lines) == len(set(done_lines)) == 3  # each document read to the end once
    assert not list((state_dir / ".hyocr-pages").glob("*.jsonl"))


def _partial_pages(state_dir: Path) -> list[tuple[str, int]]:
    """(output name, page index) of each page kept so far in the state folder's partial pages."""
    found = []
    for path in (state_dir / ".hyocr-pages").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                found.append((path.name[:-1], json.loads(line)["page"]["index"]))
            except (ValueError, KeyError):  # a torn line, or a read's timings
                continue
    return found


@pytest.mark.parametrize(("args", "says"), [
    (["s3://KEY:SECRET@corpus/docs/"], "credentials or ports in object URIs are not accepted"),
    (["s3://corpus/docs/../long/"], "'..' segments are not accepted"),
    (["s3://corpus/docs/?endpoint_override=169.254.169.254"], "query strings and fragments are not taken"),
    (["hdfs://namenode/docs/"], "only s3://, gs:// and file:// URIs are read"),
    (["s3://corpus/nothing-here/"], "no such object or prefix"),
    (["s3://corpus/docs/", "--output", "s3://KEY:SECRET@results/x/"], "credentials or ports in object URIs"),
    (["s3://corpus/docs/", "--output", "s3://results/x/../y/"], "'..' segments are not accepted"),
    (["s3://corpus/docs/", "--output", "s3://results/x/?versionId=1"], "query strings and fragments"),
    (["s3://corpus/docs/", "--output", "https://example.com/x/"], "a folder, or an s3:// or gs:// prefix"),
])
def test_hostile_uris_stop_the_batch_before_the_engine_loads(s3, cache, tmp_path, monkeypatch, capsys, args,
                                                              says):
    from hyocr.cli import main

    def no_engine(*_args, **_kwargs):
        raise AssertionError("the engine was created")

    monkeypatch.setattr("hyocr.engines.registry.create_engine", no_engine)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    output = [] if "--output" in args else ["--output", "s3://results/hostile/"]
    code = main(["batch", *args, *output, "--object-store-endpoint", s3.url])
    err = capsys.readouterr().err
    assert code == 2, err
    assert says in err and "Traceback" not in err and "SECRET" not in err
    assert not (tmp_path / "cache").exists()
    assert s3.keys("results", "hostile/") == s3.keys("results", "x/") == []
