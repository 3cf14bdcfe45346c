"""hyocr batch's plan on real temp files: INPUT expansion (folders, globs, manifests), stable output names,
the state file, and what a rerun decides for each document."""

from __future__ import annotations

import json
import os

import pytest

from hyocr.batch.plan import Document, PlanError, expand, options_fingerprint
from hyocr.batch.state import STATE_FILE, Record, StateFile, clean_temps, decide, load, write_atomic

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
PDF = b"%PDF-1.7\n%..."


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "docs"
    (root / "a" / "deep").mkdir(parents=True)
    (root / ".hidden").mkdir()
    files = {"one.png": PNG, "a/two.PDF": PDF, "a/deep/three.jpg": b"\xff\xd8\xff\xe0", "notes.txt": b"hi",
             "a/scan": PNG,  # no extension: told by its first bytes
             ".hidden/x.png": PNG, ".dot.png": PNG}
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


def rels(docs):
    return [d.rel for d in docs]


def test_folder_is_read_recursively_images_and_pdfs_only(tree):
    docs = expand([tree])
    assert rels(docs) == ["one.png", "a/scan", "a/two.PDF", "a/deep/three.jpg"]
    assert all(d.path.is_absolute() and d.path.is_file() for d in docs)


def test_names_that_cannot_be_read_as_files_are_said_not_dropped_in_silence(tree, capsys):
    # a dangling link and a FIFO named like documents were missing from the total, stderr and the summary alike
    (tree / "gone.png").symlink_to(tree / "nowhere.png")
    os.mkfifo(tree / "a" / "pipe.pdf")
    os.mkfifo(tree / "a" / "pipe")  # no document name: skipped like any other file that is not one
    assert rels(expand([tree])) == ["one.png", "a/scan", "a/two.PDF", "a/deep/three.jpg"]
    said = capsys.readouterr().err
    assert "gone.png: a link to a missing file" in said and "pipe.pdf: not a regular file" in said
    assert "a/pipe:" not in said
    for given, why in ((tree / "gone.png", "a link to a missing file"),
                       (tree / "a" / "pipe.pdf", "not a regular file")):
        with pytest.raises(PlanError, match=why):
            expand([given])


def test_files_globs_and_duplicates(tree, monkeypatch):
    monkeypatch.chdir(tree.parent)
    docs = expand(["docs/one.png", "docs/**/*.jpg", "docs/a/*", str(tree / "one.png")])
    # a glob's names are relative to its fixed part; a file's to its folder; the first mention wins
    assert rels(docs) == ["one.png", "a/deep/three.jpg", "scan", "two.PDF"]
    assert len({d.key for d in docs}) == len(docs)
    with pytest.raises(PlanError, match="no file matches"):
        expand(["docs/*.tiff"])
    with pytest.raises(PlanError, match="no such file"):
        expand(["docs/missing.png"])


def test_output_folder_is_never_an_input(tree):
    out = tree / "out"
    out.mkdir()
    (out / "old.png").write_bytes(PNG)
    assert "out/old.png" not in rels(expand([tree], exclude=out))


def test_manifest_lines_carry_their_own_options(tree):
    manifest = tree / "list.jsonl"
    manifest.write_text("\n".join([
        json.dumps({"path": "one.png"}),
        "",
        "# a comment",
        json.dumps({"path": "a/two.PDF", "task": "text", "pages": "1-2"}),
        json.dumps({"path": "a/two.PDF", "task": "spotting"}),  # the same file, other options: its own doc
        json.dumps({"path": str(tree / "a" / "deep")}),  # a folder, absolute
    ]))
    docs = expand([manifest])
    assert rels(docs) == ["one.png", "a/two.PDF", "a/two.PDF", "a/deep/three.jpg"]
    assert docs[1].overrides == {"task": "text", "pages": "1-2"}
    assert docs[1].options({"task": "spotting", "language": "en"}) == {"task": "text", "language": "en",
                                                                       "pages": "1-2"}
    assert len({d.key for d in docs}) == 4 and len({d.name for d in docs}) == 4
    for bad, message in [('{"path": "nope.png"}', "no such file"), ("{oops", "not JSON"),
                         ('{"file": "one.png"}', '"path"'), ('{"path": "one.png", "colour": 1}', "colour")]:
        manifest.write_text(bad)
        with pytest.raises(PlanError, match=message):
            expand([manifest])


def test_names_are_stable_unique_and_safe(tmp_path):
    a = Document(tmp_path / "x" / "scan 1.png", "x/scan 1.png")
    again = Document(tmp_path / "x" / "scan 1.png", "x/scan 1.png")
    other_root = Document(tmp_path / "y" / "x" / "scan 1.png", "x/scan 1.png")  # same relative path
    assert a.name == again.name and a.name.startswith("x__scan_1.png-") and a.name.endswith(".json")
    assert other_root.name != a.name  # the hash of the absolute path tells them apart
    assert "/" not in Document(tmp_path / "../../etc", "../../etc").name
    long = Document(tmp_path / ("n" * 500), "n" * 500)
    assert len(long.name) < 150
    # Names in other scripts stay readable (they were all "pdf-<hash>"), cut at a whole character within
    # the file system's 255 bytes; macOS's decomposed accents named as the composed ones.
    assert Document(tmp_path / "发票 2024.pdf", "发票 2024.pdf").name.startswith("发票_2024.pdf-")
    long_cjk = Document(tmp_path / ("票" * 300), "票" * 300).name
    assert long_cjk.startswith("票" * 40 + "-") and len(long_cjk.encode()) < 150
    assert Document(tmp_path / "Cafe\u0301.png", "Cafe\u0301.png").name.startswith("Café.png-")
    # A file name that is not UTF-8 (Python's surrogate escapes): named, not a UnicodeEncodeError
    odd = Document(tmp_path / "scan\udcff.png", "scan\udcff.png").name
    assert odd.startswith("scan_.png-") and odd.encode()


def test_options_fingerprint_ignores_unset_options():
    assert options_fingerprint({"task": "text", "pages": None}) == options_fingerprint({"task": "text"})
    assert options_fingerprint({"task": "text"}) != options_fingerprint({"task": "spotting"})


def record(status, attempts=1, **kw):
    return Record(**{"key": "k", "sha256": "s", "options": "o", "status": status, "attempts": attempts,
                     "output": "doc.json", **kw})


def test_resume_decisions(tmp_path):
    def d(rec, sha="s", options="o", max_attempts=3):
        return decide(rec, name="new-name.json", sha256=sha, options=options,
                      present=lambda name: (tmp_path / name).is_file(),
                      max_attempts=max_attempts)

    assert (d(None).action, d(None).attempt, d(None).output) == ("read", 1, "new-name.json")
    (tmp_path / "doc.json").write_text("{}")
    done = d(record("done", pages=3))
    assert (done.action, done.output) == ("skip", "doc.json")  # the recorded name: never a second output
    assert (d(record("done"), sha="changed").action, d(record("done"), sha="changed").attempt) == ("read", 1)
    assert d(record("done"), options="other").action == "read"
    (tmp_path / "doc.json").unlink()
    assert (d(record("done")).action, d(record("done")).attempt) == ("read", 2)  # its output is gone
    assert (d(record("failed", 1)).action, d(record("failed", 1)).attempt) == ("read", 2)
    assert d(record("failed", 3)).action == "give_up"
    assert d(record("failed", 3), sha="changed").action == "read"  # new content: attempts start again
    # an interrupted job: the same attempt, so the same idempotency key, so the same job on the server
    attach = d(record("submitted", 2, job_id="job-1"))
    assert (attach.action, attach.attempt, attach.job_id) == ("read", 2, "job-1")
    assert attach.idempotency_key("k", "s", "o") == d(record("submitted", 2)).idempotency_key("k", "s", "o")
    assert attach.idempotency_key("k", "s", "o") != d(record("failed", 2)).idempotency_key("k", "s", "o")
    # another state folder's run: its own jobs (an evaluation into a fresh folder got an earlier one's back)
    assert attach.idempotency_key("k", "s", "o", "run-a") != attach.idempotency_key("k", "s", "o", "run-b")


def test_a_state_folder_keeps_its_run_id_and_one_begun_before_ids_keeps_its_keys(tmp_path):
    first = StateFile(tmp_path / "a" if (tmp_path / "a").mkdir() is None else tmp_path)
    run_id = first.run_id
    first.append(record("submitted", 1, job_id="job-1"))
    first.close()
    again = StateFile(tmp_path / "a")
    assert len(run_id) == 32 and again.run_id == run_id  # a resumed run: the same keys, the same jobs
    again.close()
    (tmp_path / "b").mkdir()
    other = StateFile(tmp_path / "b")
    assert other.run_id != run_id
    other.close()
    (tmp_path / "old").mkdir()  # a folder of an earlier version: records, no id file
    (tmp_path / "old" / ".hyocr-batch.jsonl").write_text((tmp_path / "a" / ".hyocr-batch.jsonl").read_text())
    legacy = StateFile(tmp_path / "old")
    assert legacy.run_id == "" and not (tmp_path / "old" / ".hyocr-batch-run").exists()
    legacy.close()


def test_state_file_last_record_wins_and_torn_lines_are_skipped(tmp_path):
    state = StateFile(tmp_path)
    state.append(record("failed", 1, error="boom"))
    state.append(record("done", 2, pages=1))
    with pytest.raises(RuntimeError, match="another hyocr batch"):
        StateFile(tmp_path)  # one batch per folder at a time
    state.close()
    with (tmp_path / STATE_FILE).open("a") as f:
        f.write('{"key": "torn", "sha')  # killed mid-line
    assert {k: r.status for k, r in load(tmp_path / STATE_FILE).items()} == {"k": "done"}
    state = StateFile(tmp_path)
    state.append(Record("k2", "s", "o", "done", 1, "k2.json"))
    state.close()
    lines = (tmp_path / STATE_FILE).read_text().splitlines()
    assert json.loads(lines[-1])["key"] == "k2" and lines[-2].startswith('{"key": "torn"')
    assert set(load(tmp_path / STATE_FILE)) == {"k", "k2"}


def test_outputs_are_written_whole(tmp_path):
    target = tmp_path / "doc.json"
    write_atomic(target, {"pages": [1, 2]})
    assert json.loads(target.read_text()) == {"pages": [1, 2]}
    assert os.listdir(tmp_path) == ["doc.json"]  # no temp file left
    (tmp_path / ".hyocr-tmp-doc.json.123").write_text('{"pa')  # what a kill mid-write leaves
    clean_temps(tmp_path)
    assert os.listdir(tmp_path) == ["doc.json"]
