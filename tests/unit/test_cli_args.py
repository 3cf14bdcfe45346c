"""The commands' shared argument types: a mistyped number or URL is argparse's one-line error (exit 2) before any
work, where it was a traceback (ocr, batch, eval), a traceback after jobs were submitted (--poll 0) or a silent
default (ocr --timeout 0)."""

from __future__ import annotations

import pytest

from hyocr.cli import build_parser


@pytest.mark.parametrize("command", [
    ["ocr", "a.png", "--url"], ["batch", "a.png", "-o", "out", "--url"], ["bench", "--url"]])
@pytest.mark.parametrize("url", ["http://localhost:800O", "http://[::1", "http://localhost:80000", "localhost:8000",
                                 "ftp://host", "http://", "http://[::1]x:80", "http://h:0", "http://h:",
                                 "http://user:secret@h:8000", "http://h:8000/?q=1"])
def test_a_url_that_is_no_server_address_is_refused(command, url, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*command, url])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "argument --url" in err and "secret" not in err


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1",
                                 "http://127.0.0.1:8000/v1/", " http://127.0.0.1:8000 "])
def test_a_server_url_is_its_base_whatever_way_it_is_written(url):
    assert build_parser().parse_args(["ocr", "a.png", "--url", url]).url == "http://127.0.0.1:8000"
    assert build_parser().parse_args(["bench", "--url", "https://ocr.example.com/v1"]).url == "https://ocr.example.com"
    assert build_parser().parse_args(["bench", "--url", "http://v1"]).url == "http://v1"  # a host named v1
    assert build_parser().parse_args(["bench", "--url", "http://[::1]:8/ocr/v1/"]).url == "http://[::1]:8/ocr"


@pytest.mark.parametrize("option", ["--timeout", "--poll"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_seconds_are_a_finite_number_above_zero(option, value, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["batch", "a.png", "-o", "out", option, value])
    assert info.value.code == 2 and f"argument {option}" in capsys.readouterr().err
    assert build_parser().parse_args(["batch", "a.png", "-o", "out", option, "0.5"]).__dict__[option[2:]] == 0.5
