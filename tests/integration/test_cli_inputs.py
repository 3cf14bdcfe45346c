"""Mistakes on the command line and in manifests are said at once, in one line, before any engine loads
(the fake engine told to take ten minutes to start shows it: a command that started it would not end), and
the commands' help shows what they use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from imaging import card

from hyocr.cli import build_parser, main
from hyocr.types import Task

HYOCR = [sys.executable, "-m", "hyocr"]
SLOW_ENGINE = ["--engine", "fake", "--model", "start_delay=600"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HYOCR, *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "card.png"
    card().image.save(path)
    return path


def test_ocr_input_mistakes_are_found_before_the_engine_loads(tmp_path, image):
    missing = _run("ocr", str(tmp_path / "nope.png"), *SLOW_ENGINE)
    assert missing.returncode == 1 and "nope.png: No such file or directory" in missing.stderr
    folder = _run("ocr", str(tmp_path), *SLOW_ENGINE)
    assert folder.returncode == 1 and "Is a directory" in folder.stderr
    backwards = _run("ocr", str(image), "--pages", "5-3", *SLOW_ENGINE)
    assert backwards.returncode == 2 and "'5-3' is not a range of pages" in backwards.stderr
    poetry = _run("ocr", str(image), "--task", "poetry", *SLOW_ENGINE)
    assert poetry.returncode == 2 and "unknown task 'poetry'" in poetry.stderr
    for done in (missing, folder, backwards, poetry):
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_batch_input_mistakes_are_found_before_the_engine_loads(tmp_path, image):
    out = tmp_path / "out"
    backwards = _run("batch", str(image), "-o", str(out), "--pages", "5-3", *SLOW_ENGINE)
    assert backwards.returncode == 2 and "'5-3' is not a range of pages" in backwards.stderr
    manifest = tmp_path / "list.jsonl"
    manifest.write_text(json.dumps({"path": str(image), "pages": "2-1"}) + "\n")
    bad_line = _run("batch", str(manifest), "-o", str(out), *SLOW_ENGINE)
    assert bad_line.returncode == 2 and f"{manifest}:1: pages: '2-1'" in bad_line.stderr
    assert not out.exists() and "Traceback" not in backwards.stderr + bad_line.stderr


def test_a_task_the_engine_cannot_run_is_refused_before_it_loads(tmp_path, image, monkeypatch, capsys):
    from hyocr.engines import registry

    def loaded(settings):
        raise AssertionError(f"the {settings.engine} engine was loaded")

    monkeypatch.setattr(registry, "create_engine", loaded)
    says = "task 'document' needs a vision-language engine (vllm, transformers, openai); the rapidocr engine runs"
    assert main(["ocr", str(image), "--task", "document", "--engine", "rapidocr"]) == 1  # every file would fail
    assert says in capsys.readouterr().err
    assert main(["batch", str(image), "-o", str(tmp_path / "o"), "--task", "document", "--engine", "rapidocr"]) == 2
    assert says in capsys.readouterr().err and not (tmp_path / "o").exists()


@pytest.mark.parametrize(("line", "says"), [
    (b'{"path": "card.png"}\n{"path": "caf\xe9.png"}\n', ":2: not UTF-8 (byte 0xe9 at column 14)"),
    (b'{"path": "card.png", "task": 5}\n', ":1: task must be a string, not 5"),
    (b'{"path": "card.png", "task": "poetry"}\n', ":1: unknown task 'poetry'"),
    (b'{"path": "card.png", "fields": {"a": 1}}\n', ":1: fields must be a string or a list of strings"),
    (b'{"path": "card.png", "prefer_text_layer": "yes"}\n', ":1: prefer_text_layer must be true or false"),
    (b'{"path": "card.png", "pages": [1, 2]}\n', ":1: pages must be a string"),
    (b'{"path": ""}\n', ':1: expected an object with "path"'),
    (b'{"path": "card\\u0000.png"}\n', ":1: card\\x00.png: no such file or folder"),
    (b'{"path": "list.jsonl"}\n', ":1: list.jsonl: a manifest that includes itself"),
    (b'["card.png"]\n', ':1: expected an object with "path"'),
])
def test_every_bad_manifest_line_is_named_by_file_and_line(tmp_path, image, capsys, line, says):
    manifest = tmp_path / "list.jsonl"
    manifest.write_bytes(line)
    assert main(["batch", str(manifest), "-o", str(tmp_path / "out"), *SLOW_ENGINE]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hyocr: {manifest}") and says in err and "Traceback" not in err, err


def test_a_long_path_is_not_echoed_whole(tmp_path, image, capsys):
    manifest = tmp_path / "list.jsonl"
    for path in ("x" * 10_000_000, "a/" * 5_000_000):  # a name too long, a path too long
        manifest.write_text(json.dumps({"path": path}) + "\n")
        assert main(["batch", str(manifest), "-o", str(tmp_path / "out"), *SLOW_ENGINE]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"hyocr: {manifest}:1: ") and len(err) < 600, err[:600]


def _help(*argv: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    assert exit_.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", ["ocr", "batch"])
def test_help_shows_what_the_command_uses_and_help_all_every_setting(command, capsys):
    short = _help(command, "--help", capsys=capsys)
    assert len(short.splitlines()) < 100 and "--help-all" in short
    assert "--jwt-secret" not in short and "--webhook-secret" not in short and "--engine" in short
    flat = " ".join(short.split())
    assert all(f" {t.value} " in flat or f" {t.value};" in flat for t in Task), flat  # every task
    full = _help(command, "--help-all", capsys=capsys)
    assert "--jwt-secret" in full and "--max-image-bytes" in full and len(full.splitlines()) > 300
    assert "~8% of a card" in " ".join(full.split())  # a per cent sign in a description is text, not a format
    # the flags the help leaves out are taken all the same
    args = build_parser().parse_args([command, "x.png", *(["-o", "out"] if command == "batch" else []),
                                      "--max-image-bytes", "5", "--no-loop-guard"])
    assert args.max_image_bytes == 5 and args.loop_guard is False


def test_ocr_prints_file_names_that_are_not_utf8_in_a_strict_utf8_terminal(tmp_path, image):
    # A GBK name from an old share: a UTF-8 locale other than C writes stdout strictly, and the result (read
    # in full) was lost to a UnicodeEncodeError when it was printed
    import os

    odd = os.fsencode(tmp_path) + b"/\xb7\xa2\xc6\xb1.png"
    with open(odd, "wb") as f:
        f.write(image.read_bytes())
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    for extra in ((), ("--json",)):
        done = subprocess.run([*HYOCR, "ocr", os.fsdecode(odd), str(image), "--engine", "fake", *extra],
                              capture_output=True, timeout=120, check=False, env=env)
        assert done.returncode == 0 and b"UnicodeEncodeError" not in done.stderr, done.stderr[-800:]
    files = [item["file"] for item in json.loads(done.stdout)]
    assert os.fsencode(files[0]) == odd  # the JSON's escapes read back as the path itself
