"""``hyocr batch``'s local sources and kept results: file:// URIs as ``Path.as_uri`` writes them (percent-
encoded) listed and read, hidden names skipped, a folder's order; user info never echoed; a result kept for
content that has changed since is dropped, not written. (Objects: tests/e2e/test_batch_objects.py.)"""

from __future__ import annotations

import pytest

from hyocr.batch.outputs import keep, kept, unsent_path
from hyocr.batch.plan import PlanError, expand
from hyocr.batch.sources import SourceError, local_path, redacted

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 8


def test_a_file_uri_names_local_files_even_with_spaces_and_percent_signs(tmp_path):
    root = tmp_path / "scans 2024"
    (root / "sub dir").mkdir(parents=True)
    (root / "z 100%.png").write_bytes(PNG + b"z")
    (root / "sub dir" / "a.bin").write_bytes(PNG + b"a")  # no extension of a document: sniffed
    (root / "sub dir" / "notes.txt").write_text("not a document")
    (root / ".hidden.png").write_bytes(PNG)
    (root / ".cache").mkdir()
    (root / ".cache" / "x.png").write_bytes(PNG)

    docs = expand([root.as_uri()])
    assert [d.rel for d in docs] == ["z 100%.png", "sub dir/a.bin"]  # a folder's order: its own, then below
    assert [d.uri for d in docs] == [(root / "z 100%.png").as_uri(), (root / "sub dir" / "a.bin").as_uri()]
    assert [d.path for d in docs] == [root / "z 100%.png", root / "sub dir" / "a.bin"]
    assert [d.read() for d in docs] == [PNG + b"z", PNG + b"a"]
    assert expand([(root / "z 100%.png").as_uri()])[0].rel == "z 100%.png"
    assert expand([root.as_uri()], exclude=root / "sub dir") == docs[:1]  # the output folder is never read


@pytest.mark.parametrize(("uri", "says"), [
    ("file://otherhost/x", "a file:// URI names a local path"),
    ("file:///x?y=1", "a file:// URI names a local path"),
    ("file:///nonexistent/hyocr/", "no such object or prefix"),
    ("ftp://KEY:SECRET@host/x", "only s3://, gs:// and file:// URIs are read"),
])
def test_uris_that_name_nothing_readable_stop_the_plan(uri, says):
    with pytest.raises(PlanError, match=says) as refused:
        expand([uri])
    assert "SECRET" not in str(refused.value)


def test_user_info_is_never_echoed():
    assert redacted("s3://KEY:SECRET@bucket/a/b.png") == "s3://***@bucket/a/b.png"
    assert redacted("s3://bucket/a@b.png") == "s3://bucket/a@b.png"  # an @ in a key is a key's
    with pytest.raises(SourceError):
        local_path("file://KEY:SECRET@host/x")


def test_a_kept_result_is_written_only_for_the_content_it_was_read_from(tmp_path):
    tag = {"sha256": "a" * 64, "options": "o1"}
    body = {"object": "ocr.result", "pages": [{"index": 0, "text": "HELLO"}]}
    keep(tmp_path, "doc.json", tag, body)
    assert kept(tmp_path, "doc.json", tag) == body
    assert kept(tmp_path, "doc.json", {**tag, "options": "o2"}) is None  # read with other options: dropped
    assert not unsent_path(tmp_path, "doc.json").exists()
    assert kept(tmp_path, "doc.json", tag) is None
