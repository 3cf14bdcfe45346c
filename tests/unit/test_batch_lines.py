"""The pure parts of the Batch API and object storage: how an input file is cut into lines, what a line may
be, object URIs and the bucket allowlist, object names for custom_ids."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import unquote

import pytest

from hyocr.errors import InvalidRequest
from hyocr.jobs.batch_runner import Answered, output_line
from hyocr.jobs.batches import TooLong, parse_line, split_lines
from hyocr.jobs.exports import MANIFEST, object_name
from hyocr.jobs.files import LineCounter
from hyocr.pipeline.objects import ObjectPolicy, parse_object_uri, refuse_credentials


async def _pieces(data: bytes, size: int):
    for i in range(0, len(data), size):
        yield data[i:i + size]


def _split(data: bytes, max_bytes: int, size: int) -> list:
    async def collect():  # a line past the cap as None here (its head: test_a_long_line_keeps_its_head)
        return [(n, None if isinstance(raw, TooLong) else raw)
                async for n, raw in split_lines(_pieces(data, size), max_bytes)]

    return asyncio.run(collect())


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 10_000])
def test_lines_are_numbered_as_in_the_file_whatever_the_pieces(size):
    data = b'{"a":1}\r\n\n   \n' + b"x" * 50 + b"\n" + b'{"b":2}' + b"\n" + b"y" * 30  # no newline at the end
    assert _split(data, 40, size) == [(1, b'{"a":1}'), (4, None), (5, b'{"b":2}'), (6, b"y" * 30)]


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_a_line_past_the_cap_is_not_kept_and_the_next_one_is_read(size):
    data = b"z" * 200 + b"\n" + b"ok\n" + b"w" * 11
    assert _split(data, 10, size) == [(1, None), (2, b"ok"), (3, None)]


@pytest.mark.parametrize("size", [1, 7, 5000])
def test_a_long_line_keeps_its_head_for_its_custom_id(size):
    line = b'{"custom_id": "scan-1", "body": {"image": "' + b"A" * 5000 + b'"}}'
    async def collect():
        return [item async for item in split_lines(_pieces(line + b"\nok\n", size), 2000)]

    (n, head), (m, ok) = asyncio.run(collect())
    assert (n, m, ok) == (1, 2, b"ok") and isinstance(head, TooLong) and head == line[:1024]
    assert parse_line(1, head, "/v1/ocr", 2000).custom_id == "scan-1"


def test_line_counter_counts_non_blank_lines_across_pieces():
    for size in (1, 3, 100):
        counter = LineCounter()
        data = b"a\n\n  \r\nbb\ncc"
        for i in range(0, len(data), size):
            counter.feed(data[i:i + size])
        assert counter.close() == 3


GOOD = {"custom_id": "r1", "method": "POST", "url": "/v1/ocr", "body": {"image": "x", "task": "text"}}


@pytest.mark.parametrize(("raw", "code", "custom_id"), [
    (TooLong(b'{"image": "AAAA'), "line_too_large", None),
    (TooLong(b'{"custom_id": "big-\\u00e9", "body": {"image": "AAAA'), "line_too_large", "big-\u00e9"),
    (b'{"custom_id": "deep", "body": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "invalid_json_line", "deep"),
    (b'{"custom_id": "int", "n": ' + b"9" * 5000 + b"}", "invalid_json_line", "int"),
    (b"{not json", "invalid_json_line", None),
    (b"\xff\xfe", "invalid_json_line", None),
    (b"[1, 2]", "invalid_json_line", None),
    (json.dumps({**GOOD, "custom_id": None}).encode(), "missing_custom_id", None),
    (json.dumps({**GOOD, "custom_id": ""}).encode(), "missing_custom_id", None),
    (json.dumps({**GOOD, "custom_id": 7}).encode(), "missing_custom_id", None),
    (json.dumps({**GOOD, "custom_id": "x" * 513}).encode(), "missing_custom_id", None),
    (json.dumps({**GOOD, "method": "GET"}).encode(), "invalid_method", "r1"),
    (json.dumps({**GOOD, "url": "/v1/embeddings"}).encode(), "invalid_url", "r1"),
    (json.dumps({**GOOD, "url": "/v1/chat/completions"}).encode(), "invalid_url", "r1"),
    (json.dumps({**GOOD, "body": "text"}).encode(), "invalid_body", "r1"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "body"}).encode(), "invalid_body", "r1"),
])
def test_a_bad_line_is_an_error_that_keeps_what_can_be_kept(raw, code, custom_id):
    line = parse_line(3, raw, "/v1/ocr", 1000)
    assert line.request is None and line.error[0] == code and line.custom_id == custom_id
    assert "line 3" in line.error[1]


def test_a_good_line_keeps_its_body_as_json():
    line = parse_line(1, json.dumps(GOOD).encode(), "/v1/ocr")
    assert line.error is None and line.custom_id == "r1" and json.loads(line.request) == GOOD["body"]


def test_output_lines_are_openai_shaped_and_errors_say_why():
    ok = output_line("a", Answered(200, {"id": "ocr-1", "text": "t"}, "ocr-1"))
    assert set(ok) == {"id", "custom_id", "response", "error"} and ok["error"] is None
    assert ok["id"].startswith("batch_req_") and ok["response"] == {"status_code": 200, "request_id": "ocr-1",
                                                                    "body": {"id": "ocr-1", "text": "t"}}
    bad = output_line("b", Answered(400, {"error": {"message": "no", "type": "invalid_request_error",
                                                    "param": "task", "code": None}}, "ocr-2"))
    assert bad["response"]["status_code"] == 400 and bad["error"] == {"code": "invalid_request_error",
                                                                      "message": "no"}


@pytest.mark.parametrize("text", [
    "s3://KEY:SECRET@bucket/key", "s3://bucket/key?endpoint_override=evil:1", "s3://bucket/../other/key",
    "s3://bucket//key", "s3://bucket/a/./b", "s3://Bucket/key", "s3://b/key", "s3://bucket", "file:///etc/passwd",
    "https://bucket.s3.amazonaws.com/key", "s3://bucket/key#x", "s3://bucket/ke y", "s3://bucket/k\\ey",
    "s3://bucket:9000/key", "gs://bucket..x/key",
])
def test_object_uris_that_two_parsers_could_read_differently_are_refused(text):
    with pytest.raises(InvalidRequest) as caught:
        parse_object_uri(text, param="image")
    assert caught.value.code == "invalid_object_uri" and caught.value.param == "image"


@pytest.mark.parametrize("text", ["s3://results/tenantA/..", "s3://results/tenantA/.", "s3://results/..",
                                  "gs://results/a/../", "s3://results/a//"])
def test_output_prefixes_ending_in_dot_segments_are_refused(text):
    # "s3://results/tenantA/.." passed (the last part was not checked), was stored as ".../tenantA/../", and
    # every export of it failed and was tried again for ever (a batch stuck in finalizing)
    with pytest.raises(InvalidRequest) as caught:
        parse_object_uri(text, param="output_uri", prefix=True)
    assert caught.value.code == "invalid_object_uri"


def test_a_stored_output_uri_that_is_no_longer_valid_fails_its_export_once():
    import asyncio

    from hyocr.jobs.exports import export_batch

    class Batch:
        id, output_uri = "batch_x", "s3://results/tenantA/../"

    outcome = asyncio.run(export_batch(Batch(), store=None, objects=None))
    assert outcome["status"] == "failed" and "'..'" in outcome["error"] and outcome["written"] == 0


def test_object_uris_parse_strictly():
    uri = parse_object_uri("s3://corpus-2026/scans/a.png")
    assert (uri.scheme, uri.bucket, uri.key, uri.path) == ("s3", "corpus-2026", "scans/a.png", "corpus-2026/scans/a.png")
    prefix = parse_object_uri("gs://results/run/", prefix=True)
    assert str(prefix.child("x.json")) == "gs://results/run/x.json"
    assert str(parse_object_uri("s3://results", prefix=True).child("m.json")) == "s3://results/m.json"


def test_the_allowlist_is_off_by_default_and_exact_about_buckets_and_prefixes():
    off = ObjectPolicy()
    with pytest.raises(InvalidRequest) as caught:
        off.check(parse_object_uri("s3://corpus/a.png"), param="image")
    assert caught.value.code == "object_store_disabled"
    policy = ObjectPolicy(("s3://corpus", "s3://results/team-a", "gs://scans"))
    for allowed in ("s3://corpus/a.png", "s3://results/team-a/x/y.json", "gs://scans/p.pdf"):
        policy.check(parse_object_uri(allowed), param="image")
    for refused in ("s3://corpus-evil/a.png", "s3://results/team-b/x.json", "s3://results/team-a",
                    "s3://results/team-ab/x.json", "gs://corpus/a", "s3://scans/a"):
        with pytest.raises(InvalidRequest) as caught:
            policy.check(parse_object_uri(refused, prefix=True), param="image")
        assert caught.value.code == "object_not_allowed", refused
    ObjectPolicy(("*",)).check(parse_object_uri("s3://anything/a"), param="image")


def test_a_request_naming_credentials_is_refused():
    refuse_credentials({"image": "s3://a/b"})
    for field in ("aws_access_key_id", "AWS_SECRET_ACCESS_KEY", "storage_options", "endpoint_url"):
        with pytest.raises(InvalidRequest) as caught:
            refuse_credentials({"image": "s3://a/b", field: "x"})
        assert caught.value.code == "credentials_not_accepted" and caught.value.param == field


@pytest.mark.parametrize("custom_id", ["a/b", "../x", "..", ".", "manifest", "%6Danifest", "r 1?#", "汉字", "a" * 183])
def test_object_names_stay_below_the_prefix_and_never_collide(custom_id):
    name = object_name(custom_id)
    assert "/" not in name and name != MANIFEST and name.endswith(".json")
    assert name not in (".json", "..json") or custom_id in (".", "..")
    assert unquote(name[:-len(".json")]) == custom_id  # reversible, so two custom_ids never share an object


@pytest.mark.parametrize("custom_id", ["票" * 512, "a" * 512, "a" * 182 + "票" * 10])
def test_long_custom_ids_name_objects_s3_takes(custom_id):
    # 512 characters of CJK percent-encode to 4.6 kB: S3 takes 1024 bytes of key. Cut, not half an escape,
    # with a hash of the whole id: another id sharing the first 183 characters gets another object
    name = object_name(custom_id)
    assert len(name) <= 205 and "/" not in name and not name.split("~")[0].endswith(("%", "%E"))
    assert object_name(custom_id + "x") != name and object_name(custom_id) == name
    assert unquote(name.split("~")[0]) == custom_id[:len(unquote(name.split("~")[0]))]
