"""``hyocr ocr`` writing into a pipe whose reader went away (``| head``): it stops quietly with the status a
shell gives a command that SIGPIPE ended (141), and each file's text reaches the pipe as that file is done."""

from __future__ import annotations

import subprocess
import sys

from imaging import Line, render

HYOCR = [sys.executable, "-m", "hyocr"]


def _images(tmp_path, n: int) -> list[str]:
    paths = []
    for i in range(n):
        path = tmp_path / f"page{i}.png"
        render([Line(f"LINE {i} OF {n}", (30, 40), 30)], size=(360, 120)).image.save(path)
        paths.append(str(path))
    return paths


def test_a_reader_that_went_away_ends_the_command_quietly(tmp_path):
    proc = subprocess.Popen([*HYOCR, "ocr", *_images(tmp_path, 2), "--engine", "fake", "--task", "text"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141, err
    assert b"BrokenPipeError" not in err and b"Traceback" not in err and b"Exception ignored" not in err, err


def test_head_gets_the_first_file_while_the_second_is_read(tmp_path):
    images = " ".join(_images(tmp_path, 2))
    command = f"{sys.executable} -m hyocr ocr {images} --engine fake --model latency=1 --task text | head -1"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.stdout == f"== {tmp_path / 'page0.png'} ==\n"
    assert done.returncode == 141 and "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
